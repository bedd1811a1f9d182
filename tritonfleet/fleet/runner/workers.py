"""Runs spread over processes: the work of one fleet command on many hosts split over worker
processes (default: one per CPU of the control machine), their results merged into one.

One pyinfra run, and one fleet command's probes and gates, run in one process on one core
(gevent greenlets): at 500 hosts the no-op was CPU-bound on that core (docs/scale.md). Here

* ``run_pyinfra`` runs a deploy as one pyinfra process per slice of the hosts (every k-th host:
  each host in exactly one), side by side, and merges their ``--json`` results into one
  ``PyinfraRun``: one report, every host's operations, the worst exit status. Each process takes
  the deploy locks of its own hosts (the lock is per host: nothing changes), the failure reports
  of all of them land in the one failure directory, and every process dies with this one.
* ``parallel`` runs ``fn(host)`` (a probe, a health gate) for the hosts in forked workers, each
  with its own share of the hosts and its own connections, results back in host order.

What depends on all the hosts at once (the failure budget, the journal, the rollout's decisions)
stays in the calling process, which sees the merged result exactly as it saw one run's. Ctrl-C
reaches every worker (one process group) and the caller; a worker left without its caller gets
SIGKILL from the kernel (tritonfleet.core.procs). Fewer hosts than ``MIN_HOSTS_PER_WORKER`` a worker
are not split: a worker's start (a fork, or a pyinfra process: about a second of CPU) would cost
more than it saves.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ...core.errors import TritonfleetError
from ...core.procs import die_with_parent
from ...core.report import CHANNEL_ENV, read_channel
from ...inventory import roster
from ...settings.access import Settings, default
from ...settings.table import whole_number
from . import pyinfra_run
from .pyinfra_run import PyinfraRun

T = TypeVar("T")
MIN_HOSTS_PER_WORKER = 20


class WorkerError(TritonfleetError):
    """A worker process failed (its own error, with the hosts it had)."""


def configured(settings: Settings | None) -> int:
    """The number of workers asked for: the fleet_workers tunable of ``settings`` (a run's first
    host; None: the package's default), 0 meaning one per CPU."""
    value = settings.get("fleet_workers") if settings is not None else default("fleet_workers")
    if str(value).strip() in ("0", ""):
        return os.cpu_count() or 1
    try:
        return whole_number(value, "fleet_workers")
    except ValueError as e:
        raise WorkerError(str(e)) from None


def count(hosts: int, workers: int | None, settings: Settings | None) -> int:
    """Workers for ``hosts`` hosts: as asked (``workers``, else fleet_workers of ``settings``), at
    most one per MIN_HOSTS_PER_WORKER hosts, at least 1."""
    asked = configured(settings) if workers is None else (workers or os.cpu_count() or 1)
    return max(1, min(asked, hosts // MIN_HOSTS_PER_WORKER))


def slices(items: list[T], k: int) -> list[list[T]]:
    """``items`` in ``k`` shares, every k-th item each (even sizes; each item in exactly one)."""
    return [s for s in (items[i::k] for i in range(k)) if s]


# --- forked workers -------------------------------------------------------------------------------


def parallel(hosts: list, fn: Callable[[Any], T], workers: int | None = None) -> list[T]:
    """``fn(host)`` for every host, results in host order: in this process (tritonfleet.inventory.roster's
    parallel) when one worker is enough, else in forked workers, each running its share the same
    way. ``fn``'s results must pickle. An error in a worker is raised here, naming it."""
    k = count(len(hosts), workers, hosts[0] if hosts else None)
    if k <= 1:
        return roster.parallel(hosts, fn)
    for h in hosts:  # a connection belongs to one process: each worker makes its own
        roster.disconnect(h)
    parts = slices(list(range(len(hosts))), k)
    tmp = Path(tempfile.mkdtemp(prefix="tritonfleet-workers-"))
    pids: list[int] = []
    try:
        for i, part in enumerate(parts):
            pid = os.fork()
            if pid == 0:
                _child(tmp / f"{i}.pickle", [hosts[j] for j in part], fn)  # never returns
            pids.append(pid)
        out: list = [None] * len(hosts)
        for i, pid in enumerate(pids):
            _, status = os.waitpid(pid, 0)
            try:
                payload = pickle.loads((tmp / f"{i}.pickle").read_bytes())
            except (OSError, pickle.UnpicklingError, EOFError):
                payload = ("error", f"it ended without a result ({_status(status)})", "")
            if payload[0] != "ok":
                names = ", ".join(hosts[j].name for j in parts[i][:5])
                raise WorkerError(
                    f"worker {i + 1}/{len(parts)} (hosts {names}{', ...' if len(parts[i]) > 5 else ''}) "
                    f"failed: {payload[1]}\n{payload[2]}".rstrip()
                )
            for j, r in zip(parts[i], payload[1], strict=True):
                out[j] = r
        pids = []
        return out
    finally:
        for pid in pids:  # interrupted or failed: no worker goes on alone
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        shutil.rmtree(tmp, ignore_errors=True)


def _child(out: Path, hosts: list, fn) -> None:
    code = 0
    payload: tuple = ("error", "it ended without a result", "")
    try:
        try:
            die_with_parent(os.getppid())()
            payload = ("ok", roster.parallel(hosts, fn))
        except BaseException as e:  # reported to the parent, whatever it is; the raise ends at os._exit
            payload, code = ("error", f"{type(e).__name__}: {e}", traceback.format_exc()), 1
            raise
    finally:
        try:
            out.write_bytes(pickle.dumps(payload))
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            out.write_bytes(pickle.dumps(("error", f"its result does not pickle: {e}", "")))
            code = 1
        finally:
            os._exit(code)  # not the parent's atexit handlers, not its cleanup: nothing goes past here


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


# --- pyinfra runs ---------------------------------------------------------------------------------


def run_pyinfra(
    inventory: str,
    deploy: str,
    hosts: list[str],
    data: dict,
    *,
    settings: Settings | None,
    dry: bool = False,
    log_path: Path | None = None,
    timeout: float = 7200,
    failure_dir: Path | None = None,
    on_start: Callable[[int], None] | None = None,
    workers: int | None = None,
) -> PyinfraRun:
    """tritonfleet.fleet.runner.pyinfra_run.run_pyinfra over ``workers`` pyinfra processes (each a slice of
    ``hosts``), merged into one PyinfraRun. ``on_start`` is called with each process's pid.
    ``log_path``: each process logs to <stem>.<n><suffix> beside it; ``log_path`` itself lists
    them, then holds their logs one after the other. A process that cannot start, dies or gives
    no result fails its hosts with the reason (``merge``); the result names every host once."""
    k = count(len(hosts), workers, settings)
    parts = slices(hosts, k) if k > 1 else [list(hosts)]
    runs: list[PyinfraRun | None] = [None] * len(parts)
    errors: list[str] = [""] * len(parts)
    logs = [
        log_path.with_name(f"{log_path.stem}.{i + 1}{log_path.suffix}") if log_path and k > 1 else log_path
        for i in range(len(parts))
    ]

    def one(i: int) -> None:
        try:
            runs[i] = pyinfra_run.run_pyinfra(
                inventory,
                deploy,
                parts[i],
                data,
                dry=dry,
                log_path=logs[i],
                timeout=timeout,
                failure_dir=failure_dir,
                on_start=on_start,
            )
        except (
            OSError,
            ValueError,
            RuntimeError,
            subprocess.SubprocessError,
            pickle.PickleError,
            TritonfleetError,
        ) as e:  # a slice that could not run: its hosts fail with its words
            errors[i] = f"{type(e).__name__}: {e}"

    if k <= 1:
        one(0)
        merged = merge(runs, parts, errors, hosts)
        merged.log_path = runs[0].log_path if runs[0] is not None else ""
        return merged
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # Ctrl-C stays deliverable here; the processes get it from the terminal
            t.join(0.2)
    merged = merge(runs, parts, errors, hosts)
    if log_path:
        try:
            log_path.write_text(
                "".join(f"# {len(p)} host(s): {lp}\n" for p, lp in zip(parts, logs, strict=True))
                + "\n"
                + "\n".join(lp.read_text() for lp in logs if lp and lp.exists())
            )
            merged.log_path = str(log_path)
        except OSError as e:  # the result stands; only the joined log is missing
            merged.log += f"\ncould not write {log_path}: {e}"
    return merged


class MergeError(WorkerError):
    """The slices given to ``merge`` do not hold every host asked for exactly once."""


def _exit_status(rc: int) -> int:
    """A process's exit status as a shell gives it: a signal N is 128 + N (never below 0)."""
    return 128 - rc if rc < 0 else rc


def merge(
    runs: list[PyinfraRun | None],
    parts: list[list[str]],
    errors: list[str] | None = None,
    asked: list[str] | None = None,
) -> PyinfraRun:
    """One PyinfraRun from the runs of disjoint slices, matched by slice index (``runs[i]`` is
    ``parts[i]``'s, None when that slice gave no run; ``errors[i]`` then says why): operations
    merged by their hash (the hosts of each outcome together), the failed hosts together, the
    worst exit status. A slice with no result (no run, no JSON, no results with a non-zero exit
    status, a host outside its slice) fails
    every host of it with the reason, in ``reasons``, and the exit status is then not 0: a host
    that was never deployed is never read as unchanged. ``asked``: the hosts of the run; MergeError
    when the slices do not hold each of them exactly once."""
    if len(runs) != len(parts):
        raise MergeError(f"{len(runs)} result(s) for {len(parts)} slice(s) of the hosts")
    sliced = [h for p in parts for h in p]
    if len(set(sliced)) != len(sliced) or (asked is not None and sorted(sliced) != sorted(asked)):
        raise MergeError("the slices of the hosts do not hold every host asked for exactly once")
    errors = errors or [""] * len(parts)
    ops: dict[str, dict] = {}
    failed: list[str] = []
    reasons: dict[str, str] = {}
    totals: dict[str, int] = {}
    rcs: list[int] = []
    logs: list[str] = []
    for i, (run, part) in enumerate(zip(runs, parts, strict=True)):
        where = f"pyinfra process {i + 1}/{len(parts)}" if len(parts) > 1 else "pyinfra"
        if run is None:
            why = f"{where} gave no result: {errors[i] or 'it did not run'}"
            reasons.update(dict.fromkeys(part, why))
            failed += part
            rcs.append(1)
            logs.append(why)
            continue
        rcs.append(_exit_status(run.rc))
        logs.append(run.log)
        results = (run.data or {}).get("results") or {}
        if not run.data or (not results and run.rc != 0):  # a dry run's JSON has "results": None
            why = f"{where} gave no result (exit status {_exit_status(run.rc)}){run.where()}"
            reasons.update(dict.fromkeys(part, why))
            failed += part
            rcs[-1] = rcs[-1] or 1
            continue
        mine = set(part)
        strays = (run.ran() | run.failed()) - mine
        if strays:
            why = f"{where} reported hosts it was not given ({', '.join(sorted(strays)[:5])}): its result is not used"
            reasons.update(dict.fromkeys(part, why))
            failed += part
            rcs[-1] = rcs[-1] or 1
            continue
        failed += results.get("failed_hosts") or []
        reasons.update(run.reasons)
        for op in results.get("operations", []):
            key = op.get("op_hash") or op["name"]
            have = ops.setdefault(key, {**op, "hosts": 0, "success": [], "error": [], "no_change": []})
            have["hosts"] += int(op.get("hosts") or 0)
            for outcome in ("success", "error", "no_change"):
                have[outcome] += op.get(outcome, [])
        for name, n in (results.get("totals") or {}).items():
            totals[name] = totals.get(name, 0) + int(n)
    data = (
        {"results": {"operations": list(ops.values()), "failed_hosts": sorted(set(failed)), "totals": totals}}
        if ops or failed or any(r is not None and r.data for r in runs)
        else {}
    )
    rc = max(rcs, default=0)
    if failed and rc == 0:
        rc = 1
    return PyinfraRun(rc, data, "\n".join(logs), reasons=reasons)


def deploy(
    inventory: str,
    deploy_file: str,
    hosts: list[str],
    data: dict,
    *,
    settings: Settings | None,
    dry: bool = False,
    workers: int | None = None,
    echo=print,
    limited: bool = True,
) -> int:
    """A deploy (``pyinfra -y``) over worker processes, each its slice of ``hosts``: their
    progress goes to this process's stderr as pyinfra writes it, their results are merged into one
    summary. ``limited``: ``hosts`` are not the whole inventory (one process then gets them as
    --limit too). Exit status: the worst of the processes (130 when interrupted)."""

    k = count(len(hosts), workers, settings)
    parts = slices(hosts, k)
    channel = Path(tempfile.mkdtemp(prefix="tritonfleet-failures-"))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    env[CHANNEL_ENV] = str(channel)
    cmd = pyinfra_run.pyinfra_command() + ["-y", "--json"] + (["--dry"] if dry else [])
    for key, value in data.items():
        cmd += ["--data", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    procs: list[subprocess.Popen | None] = []
    outs, errors = [""] * len(parts), [""] * len(parts)
    try:
        for i, part in enumerate(parts):
            limits = [a for h in part for a in ("--limit", h)] if k > 1 or limited else []
            try:
                procs.append(
                    subprocess.Popen(
                        [*cmd, *limits, inventory, deploy_file],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        text=True,
                        env=env,
                        preexec_fn=die_with_parent(),
                    )
                )
            except OSError as e:  # this slice's hosts fail with why; the others run
                procs.append(None)
                errors[i] = f"pyinfra could not start: {e}"

        def read(i: int) -> None:
            p = procs[i]
            if p is not None:
                outs[i] = p.communicate()[0]

        threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:  # the processes had it too (one process group): wait for their ends
        for p in procs:
            if p is None:
                continue
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(channel, ignore_errors=True)
        echo(f"interrupted: {len(procs)} pyinfra process(es) stopped")
        return 130
    runs: list[PyinfraRun | None] = []
    for p, out in zip(procs, outs, strict=True):
        try:
            result = json.loads(out) if out.strip() else {}
        except ValueError:
            result = {}
        runs.append(PyinfraRun(p.returncode, result if isinstance(result, dict) else {}, "") if p else None)
    merged = merge(runs, parts, errors, hosts)
    failures = read_channel(channel)
    shutil.rmtree(channel, ignore_errors=True)
    failed, changed = merged.failed(), merged.changed()
    echo(
        f"{len(hosts)} host(s) in {len(parts)} pyinfra process(es): {len(changed - failed)} changed, "
        f"{len(set(hosts) - changed - failed)} unchanged, {len(failed)} failed"
        + (f": {', '.join(sorted(failed)[:20])}{' ...' if len(failed) > 20 else ''}" if failed else "")
    )
    for name in sorted(failed):
        echo(failures[name].text() if name in failures else f"{name}: {merged.reason(name)}")
    return merged.rc
