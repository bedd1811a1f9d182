"""The rollout's engine: probe and plan, then each batch (pyinfra, the health gate, the
performance gate on the canary, rollbacks), halting past ``max_fail``; ``resume`` goes on from
the journal after a crash. Every phase's hosts are spread over worker processes
(tritonfleet.fleet.runner.workers); the failure budget, the journal and the decisions stay here. Ctrl-C,
SIGTERM and any error in the batches put the traffic canary's weights back before the rollout
stops (its journal left open for --resume)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket as _socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ... import ROLLBACK_DEPLOY, STAGE_DEPLOY
from ...core import runid
from ...core.checks import is_check
from ...core.connection_errors import CONNECTION_ERRORS
from ...core.procs import alive
from ...core.report import Failure, read_channel
from ...gpu import placement
from ...host import driver_hold
from ...inventory import roster
from ...serving import health, per_gpu, unit_watch
from ...settings.access import Settings
from .. import probe
from ..runner import workers
from ..runner.pyinfra_run import PyinfraRun
from . import driver, perfgate, traffic
from .journal import JOURNAL, Journal, latest_journal, log_dir
from .plan import RolloutError, parse_max_fail, plan_batches, plan_error
from .report import HostResult, Report, finish


class _Stopped(KeyboardInterrupt):
    """SIGTERM (a CI job cancelled or timed out): the rollout stops as on Ctrl-C, through every
    ``finally`` on the way (the canary's weights put back), its journal left for --resume."""


@contextlib.contextmanager
def _stop_on_sigterm():
    """SIGTERM raises _Stopped in the main thread while the block runs (the handler before it is
    put back after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise _Stopped(f"stopped by signal {signum}")

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _guarded_batches(run: _Run, first: int) -> None:
    """_batches, with the traffic canary's weights put back on every way out: Ctrl-C, SIGTERM
    or any exception (which then goes on up; the journal has no end, so --resume goes on)."""
    with _stop_on_sigterm():
        try:
            _batches(run, first)
        except BaseException as e:
            if run.traffic:
                run.echo(f"rollout stopped ({type(e).__name__}: {e}); putting the canary's weights back")
                run.traffic.abort()
            raise


def _started(journal: Journal, index: int, hosts: list[str], pid: int) -> None:
    """The journal's line of a batch whose pyinfra started (its pid: --resume stops it first)."""
    journal.write("batch", index=index, hosts=hosts, pid=pid)


@dataclass
class _Run:
    """One rollout's working state (a fresh start or one read back from its journal)."""

    inventory: str
    deploy: str
    data: dict
    batches: list[list[str]]
    canary: int
    max_fail: int
    gate_timeout: float | None
    report: Report
    logs: Path
    journal: Journal
    echo: Callable[[str], None]
    by_name: dict = field(default_factory=dict)
    before: dict = field(default_factory=dict)  # host -> {"release", "unit", "version", "reachable"}
    unreachable: list[str] = field(default_factory=list)
    failures: int = 0
    perf_gate: bool = False  # --perf-gate: the canary measured before and after its update
    traffic: traffic.Traffic | None = None  # capacity, traffic canary, host states
    driver: driver.DriverChange | None = None  # a driver branch / toolkit change: CUDA validation, the way back

    @property
    def results(self) -> dict[str, HostResult]:
        return {r.host: r for r in self.report.hosts}

    def label(self, i: int) -> str:
        return "canary" if i == 1 and self.canary else f"batch {i}/{len(self.batches)}"


def _before_record(st: probe.HostStatus) -> dict:
    return {
        "release": st.release,
        "unit": st.unit,
        "version": st.version,
        "reachable": st.reachable,
        "error": st.error,
        "driver": getattr(st, "driver", None),
        "toolkit": getattr(st, "toolkit", None),
        "hold": getattr(st, "driver_hold", None),
    }


def rollout(
    inventory: str,
    deploy: str,
    *,
    limit: list[str] | None = None,
    canary: int = 1,
    batch: str | int = "25%",
    max_fail: str | int = 0,
    data: dict | None = None,
    gate_timeout: float | None = None,
    echo: Callable[[str], None] = print,
    perf_gate: bool = False,
    stage: bool = False,
    canary_weight: float | None = None,
    plan_only: bool = False,
    release_holds: bool = False,
) -> Report:
    """``max_fail``: N hosts or P% of the targets; ``plan_only`` (--dry): probe and plan only (pyinfra --dry on
    every reachable target), then stop: no host is changed."""
    data = dict(data or {})
    roster.check_deploy_file(deploy)
    if Path(inventory).is_file() and roster.deploy_imports(inventory) and not roster.deploy_imports(deploy):
        raise RolloutError(
            f"the arguments are the wrong way round: {inventory} is a deploy file and {deploy} "
            f"is not; the inventory comes first: tritonfleet rollout {deploy} {inventory}"
        )
    if roster.looks_like_inventory(deploy):
        raise RolloutError(
            f"{deploy} is an inventory (it defines host groups and imports no steps), not a deploy: "
            "tritonfleet rollout INVENTORY DEPLOY, e.g. tritonfleet rollout inventories/prod.py "
            "deploys/models.py"
        )
    if gate_timeout is not None and not gate_timeout > 0:
        raise RolloutError(f"--gate-timeout must be a number of seconds > 0, not {gate_timeout!r}")
    parse_max_fail(max_fail, 0)  # its form, before anything runs
    if perf_gate and canary < 1:
        raise RolloutError("--perf-gate measures the canary before and after its update: give --canary 1 or more")
    t_start = time.monotonic()
    hosts = roster.load_inventory(inventory, data=data, limit=limit)
    names = [h.name for h in hosts]
    max_fail = parse_max_fail(max_fail, len(names))
    batches = plan_batches(names, canary, batch)
    lb = traffic.prepare(hosts, batches, canary, canary_weight)  # refused before anything is written
    report = Report(inventory, deploy, batches, [HostResult(n) for n in names])
    logs = log_dir()
    report.log_dir = str(logs)
    journal = Journal(logs / JOURNAL)
    journal.write(
        "start",
        inventory=inventory,
        deploy=deploy,
        limit=list(limit or []),
        canary=canary,
        batch=str(batch),
        max_fail=max_fail,
        data=data,
        gate_timeout=gate_timeout,
        batches=batches,
        hosts=names,
        cwd=os.getcwd(),
        pid=os.getpid(),
        holder=runid.holder(),
        canary_weight=canary_weight,
    )
    run = _Run(
        inventory,
        deploy,
        data,
        batches,
        canary,
        max_fail,
        gate_timeout,
        report,
        logs,
        journal,
        echo,
        by_name={h.name: h for h in hosts},
        perf_gate=perf_gate,
        traffic=lb,
    )
    echo(
        f"rollout of {deploy} to {len(names)} host(s) of {inventory}: "
        f"{len(batches)} batch(es) {[len(b) for b in batches]}, canary {min(canary, len(names))}, "
        f"max {max_fail} failure(s); logs and journal in {logs}"
    )
    report.halted = lb.start(logs, journal, echo, names)  # the states served; every batch against capacity
    if report.halted:
        return _finish(run, t_start)

    # 1. what every target serves now, and whether it answers
    before = dict(zip(names, workers.parallel(hosts, probe.probe), strict=True))
    run.before = {n: _before_record(st) for n, st in before.items()}
    journal.write("before", hosts=run.before)
    results = run.results
    for n, st in before.items():
        results[n].before = st.version
    run.unreachable = [n for n, st in before.items() if not st.reachable]
    for n in run.unreachable:
        results[n].result, results[n].detail = "unreachable", before[n].error
    run.failures = len(run.unreachable)
    if run.unreachable:
        echo(f"unreachable before the start (not touched): {', '.join(run.unreachable)}")
    if run.failures > max_fail:
        report.halted = f"{run.failures} host(s) unreachable before the start (max {max_fail} failure(s))"
        return _finish(run, t_start)
    _driver_plan(run, [h for h in hosts if h.name not in run.unreachable], before, release_holds)

    # 2. plan on every reachable target: a pre-flight error stops here, with no host touched
    targets = [n for n in names if n not in run.unreachable]
    dry = workers.run_pyinfra(inventory, deploy, targets, data, dry=True, log_path=logs / "plan.log", settings=hosts[0])
    if dry.rc != 0:
        report.halted = "planning failed before any host was changed:\n  " + "\n  ".join(plan_error(dry.log))
        return _finish(run, t_start)
    journal.write("planned")
    if plan_only:
        _show_plan(run, dry)
        return _finish(run, t_start)

    # 2b. --stage: the image and the release on every target before any batch (nothing restarts)
    if stage:
        _stage(run, targets)
        if run.failures > max_fail or run.report.staged.get("halt"):
            report.halted = run.report.staged.get("halt") or (
                f"{run.failures} host(s) could not stage, more than --max-fail {max_fail}: no host was changed"
            )
            return _finish(run, t_start)

    # 3. batches
    _guarded_batches(run, 1)
    return _finish(run, t_start)


def _driver_plan(
    run: _Run, hosts: list[roster.FleetHost], before: dict[str, probe.HostStatus], release_holds: bool
) -> None:
    """Held hosts (a failed driver change's hold) that this rollout would move again: left out and
    named, unless ``release_holds`` (their holds removed first); then the driver change, if any."""
    holds = {n: run.before[n].get("hold") for n in before}
    if release_holds:
        for fh in hosts:
            if holds.get(fh.name) is not None:
                roster.run(fh, driver_hold.RELEASE_COMMAND)
                run.echo(f"{fh.name}: hold released ({driver_hold.describe(holds[fh.name])})")
                holds[fh.name] = None
                run.before[fh.name]["hold"] = None
    for n, why in driver.held_out(hosts, holds).items():
        run.unreachable.append(n)  # left out of every batch, as an unreachable host is
        run.results[n].result, run.results[n].detail = "held", why
        run.echo(f"{n}: {why}")
    run.driver = driver.DriverChange.detect(
        run.data, [h for h in hosts if h.name not in run.unreachable], run.before, run.echo
    )
    if run.driver:
        moves = ", ".join(f"{n} {run.driver.before.get(n)} -> {b}" for n, b in run.driver.wanted.items())
        run.echo(f"driver change: {moves}; each host is validated with a CUDA kernel after its batch")
        run.journal.write("driver", wanted=run.driver.wanted, before=run.driver.before)


def _show_plan(run: _Run, plan: PyinfraRun) -> None:
    """--dry: each batch's hosts and what pyinfra --dry says would change on each (the table's
    DETAIL), no host changed."""
    counts: dict[str, int] = {}
    for op in (plan.data.get("results") or {}).get("operations", []):
        if not is_check(op["name"]):
            for n in op.get("success", []):
                counts[n] = counts.get(n, 0) + 1
    for i, b in enumerate(run.batches, 1):
        todo = [n for n in b if n not in run.unreachable]
        run.echo(f"[{run.label(i)}] would deploy to {', '.join(todo) or 'no reachable host'}")
        for n in todo:
            run.results[n].batch = i
            run.results[n].detail = f"dry: {counts[n]} operation(s) would change" if counts.get(n) else "dry: no change"
    run.echo(f"dry run: nothing changed (pyinfra --dry's output: {plan.log_path or 'not kept'})")


def _batches(run: _Run, first: int) -> None:
    """Batches ``first``.. of the plan, each one: deploy, gate, roll back its failures; halt once
    more than max_fail hosts failed."""
    results = run.results
    for i, b in enumerate(run.batches, 1):
        if i < first:
            continue
        todo = [n for n in b if n not in run.unreachable]
        if not todo:
            continue
        label = run.label(i)
        if run.traffic:  # pause point, capacity against HAProxy, the canary's traffic share
            run.report.halted = run.traffic.before_batch(i, todo, label)
            if run.report.halted:
                return
        perf = perfgate.Gate(run.echo) if run.perf_gate and i == 1 and run.canary else None
        if perf:  # the canary's performance before its update (tritonfleet/fleet/rollout/perfgate.py)
            try:
                perf.measure_before([run.by_name[n] for n in todo])
            except perfgate.PerfGateError as e:
                run.report.halted = f"performance gate: {e}"
                return
        run.echo(f"[{label}] deploying to {', '.join(todo)}")
        t0 = time.monotonic()
        watch = run.traffic.watch(i, todo, label) if run.traffic else None  # HAProxy read every second
        try:
            pyi = workers.run_pyinfra(
                run.inventory,
                run.deploy,
                todo,
                run.data,
                log_path=run.logs / f"batch-{i}.log",
                failure_dir=run.logs / f"failures-{i}",
                settings=run.by_name[todo[0]],
                on_start=functools.partial(_started, run.journal, i, todo),
            )
        finally:
            if watch:
                watch.stop()
        # why each host failed: the report its step left (structured), else pyinfra's own words
        reports: dict[str, Failure] = {n: f for n, f in read_channel(run.logs / f"failures-{i}").items() if n in todo}
        why = {n: (reports[n].short(240) if n in reports else pyi.reason(n)) for n in todo}
        failed: dict[str, str] = {n: why[n] for n in pyi.failed() if n in todo}
        if pyi.rc != 0 and not failed and not pyi.data:  # no JSON (every host failed): all of them
            failed = dict(why)
        changed = pyi.changed()
        # the gate, on every host of the batch that the deploy did not already fail
        ok_names = [n for n in todo if n not in failed]
        if run.traffic:
            run.traffic.gating(ok_names)
        for n, report_ in _gate_all(run, ok_names).items():
            reports[n] = report_
            failed[n] = report_.short(240)
        if run.driver:  # a driver change: a real CUDA kernel on every GPU of each host it moved
            failed.update(run.driver.validate([run.by_name[n] for n in ok_names if n not in failed]))
        if perf:
            failed.update(perf.measure_after([run.by_name[n] for n in ok_names if n not in failed]))
            run.report.perf = perf.report()
        if run.traffic:  # the traffic canary's analysis: canaries to roll back, out of the traffic already
            failed.update(run.traffic.analyse(i, [n for n in ok_names if n not in failed]))
        elapsed = time.monotonic() - t0
        held = run.traffic.held([n for n in todo if n not in failed]) if run.traffic else {}
        for n in todo:
            r = results[n]
            r.batch, r.seconds = i, elapsed
            if n in failed:
                r.result, r.detail = "failed", failed[n]
                r.failure = reports[n].to_json() if n in reports else None
            else:
                r.result = "updated" if n in changed else "unchanged"
                r.detail = held.get(n, r.detail)
        if failed:
            run.echo(f"[{label}] failed: " + "; ".join(f"{n}: {why}" for n, why in failed.items()))
            for n in failed:
                if n in reports:
                    run.echo(reports[n].text())
            if run.driver:  # the branch they ran before, validated again, held there
                run.driver.revert(
                    run.inventory, run.deploy, run.data, [run.by_name[n] for n in failed], results, run.logs, label
                )
            _roll_back(
                run.inventory,
                [run.by_name[n] for n in failed],
                run.before,
                results,
                run.data,
                run.logs / f"rollback-{i}.log",
                pyi,
                run.echo,
            )
            if run.driver:
                run.driver.settle(results)
            if run.traffic:  # when the canary serves the old release again
                run.traffic.rolled_back(i, {n: results[n] for n in failed})
        _versions([run.by_name[n] for n in todo], results)
        if run.traffic:
            run.traffic.after_batch(i, {n: results[n] for n in todo})
        run.failures += len(failed)
        run.journal.write("batch-done", index=i, results={n: asdict(results[n]) for n in todo}, failures=run.failures)
        run.echo(f"[{label}] done in {elapsed:.1f}s: " + ", ".join(f"{n} {results[n].result}" for n in todo))
        if run.failures > run.max_fail:
            left = [n for bb in run.batches[i:] for n in bb if n not in run.unreachable]
            run.report.halted = (
                f"{run.failures} failure(s), more than --max-fail {run.max_fail}: halted after "
                f"{label}; {len(left)} host(s) not touched"
            )
            return
        if run.traffic and run.traffic.halt:  # a canary verdict halts whatever --max-fail allows
            left = [n for bb in run.batches[i:] for n in bb if n not in run.unreachable]
            run.report.halted = f"{run.traffic.halt}; halted after {label}; {len(left)} host(s) not touched"
            return


def _mirror_hosts(run: _Run) -> list[str]:
    """The image mirror's hosts (image_mirror_group) when the targets pull through a mirror: the
    staging run fills the mirror there before the hosts pull."""
    if not any(fh.get("image_mirror") for fh in run.by_name.values()):
        return []
    group = next(iter(run.by_name.values())).get("image_mirror_group")
    try:
        return [fh.name for fh in roster.load_inventory(run.inventory, data=run.data, limit=[group])]
    except roster.FleetError:
        return []  # no such group: a mirror tritonfleet does not manage


def _stage(run: _Run, targets: list[str]) -> None:
    """One run of the staging deploy (tritonfleet.STAGE_DEPLOY) on every reachable target and the
    mirror's hosts; a target that fails it is reported and left out of the batches."""
    mirrors = [n for n in _mirror_hosts(run) if n not in targets]
    hosts = targets + mirrors
    where = f" (image mirror: {', '.join(mirrors)})" if mirrors else ""
    run.echo(f"[stage] fetching the image and model release onto {len(targets)} host(s){where}")
    t0 = time.monotonic()
    pyi = workers.run_pyinfra(
        run.inventory,
        str(STAGE_DEPLOY),
        hosts,
        run.data,
        log_path=run.logs / "stage.log",
        failure_dir=run.logs / "failures-stage",
        settings=run.by_name.get(hosts[0]),
    )
    reports = {n: f for n, f in read_channel(run.logs / "failures-stage").items() if n in hosts}
    failed = {n for n in pyi.failed() if n in hosts}
    if pyi.rc != 0 and not pyi.data:  # no result at all: nothing is known to be staged
        failed = set(hosts)
    elapsed = time.monotonic() - t0
    results = run.results
    for n in sorted(failed & set(targets)):
        r = results[n]
        r.result = "failed"
        r.detail = "staging: " + (reports[n].short(220) if n in reports else pyi.reason(n))
        r.failure = reports[n].to_json() if n in reports else None
        run.unreachable.append(n)  # left out of every batch: unchanged
        if n in reports:
            run.echo(reports[n].text())
    run.failures += len(failed & set(targets))
    run.report.staged = {"seconds": round(elapsed, 1), "hosts": sorted(set(targets) - failed), "failed": sorted(failed)}
    bad_mirror = sorted(failed & set(mirrors))
    if bad_mirror:
        run.report.staged["halt"] = (
            f"the image mirror could not be filled on {', '.join(bad_mirror)} "
            f"({pyi.reason(bad_mirror[0])}): no host was changed"
        )
    run.journal.write("staged", seconds=elapsed, failed=sorted(failed), hosts=hosts)
    bad = f", failed: {', '.join(sorted(failed))}" if failed else ""
    run.echo(f"[stage] done in {elapsed:.1f}s: {len(set(targets) - failed)} staged{bad}")


def _gate_all(run: _Run, names: list[str]) -> dict[str, Failure]:
    """The health gate on ``names``; {host: failure report} for those that failed it."""
    hosts = [run.by_name[n] for n in names]
    failed = {}
    for fh, (res, report_) in zip(hosts, workers.parallel(hosts, lambda fh: _gate(fh, run.gate_timeout)), strict=True):
        if not res.ok:
            failed[fh.name] = report_
    return failed


def resume(
    journal_path: str | Path | None = None, *, roll_back: bool = False, echo: Callable[[str], None] = print
) -> Report:
    """Go on with a rollout whose control process died, from its journal: the batch it was in is
    run again (the deploy converges: what the cut run finished is not redone) and gated, then the
    batches it had not reached. With ``roll_back``: every host the rollout reached goes back to
    what it served before the rollout (journaled), and no further batch runs."""
    path = Path(journal_path) if journal_path else latest_journal()
    if path.is_dir():
        path = path / JOURNAL
    if not path.is_file():
        raise RolloutError(f"no rollout journal at {path}")
    journal = Journal(path)
    events = journal.events()
    start = next((e for e in events if e["event"] == "start"), None)
    if start is None:
        raise RolloutError(f"{path}: the journal has no start record: nothing to resume")
    if any(e["event"] == "end" for e in events):
        raise RolloutError(f"{path}: that rollout ended; start a new one instead")
    if (
        start.get("holder", "").split(" ", 1)[0].endswith("@" + _socket.gethostname())
        and start.get("pid") != os.getpid()
        and alive(int(start.get("pid", 0)))
        and b"tritonfleet" in Path(f"/proc/{start['pid']}/cmdline").read_bytes()
    ):
        raise RolloutError(
            f"{path}: the rollout that wrote it is still running (pid {start['pid']}): let it finish, or stop it first"
        )
    if start.get("cwd") and Path(start["cwd"]).resolve() != Path.cwd().resolve():
        raise RolloutError(
            f"{path}: resume from the directory that rollout ran in: {start['cwd']} "
            "(the inventory, deploy and model repository are relative to it)"
        )
    t_start = time.monotonic()
    inventory, deploy, data = start["inventory"], start["deploy"], start.get("data") or {}
    batches = start["batches"]
    hosts = roster.load_inventory(inventory, data=data, limit=start.get("limit") or None)
    by_name = {h.name: h for h in hosts}
    missing = [n for b in batches for n in b if n not in by_name]
    if missing:
        raise RolloutError(f"{path}: hosts of the journal are no longer in {inventory}: {', '.join(missing)}")
    report = Report(inventory, deploy, batches, [HostResult(n) for n in start["hosts"]])
    report.log_dir = str(path.parent)
    traffic.restore_from_journal(events, echo)  # a canary share the crash left set
    lb = traffic.prepare(hosts, batches, int(start["canary"]), start.get("canary_weight"))
    run = _Run(
        inventory,
        deploy,
        data,
        batches,
        int(start["canary"]),
        int(start["max_fail"]),
        start.get("gate_timeout"),
        report,
        path.parent,
        journal,
        echo,
        by_name=by_name,
        traffic=lb,
    )
    results = run.results
    driver_ev = next((e for e in events if e["event"] == "driver"), None)
    if driver_ev:  # a driver change: its validation and way back go on for the batches left
        run.driver = driver.DriverChange(
            driver_ev["wanted"],
            driver_ev["before"],
            {n: str(by_name[n].get("triton_image")) for n in driver_ev["wanted"] if n in by_name},
            echo,
        )
    before_ev = next((e for e in events if e["event"] == "before"), None)
    if before_ev is None:
        raise RolloutError(
            f"{path}: the rollout died before it had probed the hosts, so it changed nothing: start it again"
        )
    run.before = before_ev["hosts"]
    for n, b in run.before.items():
        results[n].before = b.get("version", "-")
        if not b.get("reachable"):
            run.unreachable.append(n)
            results[n].result, results[n].detail = "unreachable", b.get("error", "")
    run.failures = len(run.unreachable)
    done, started = {}, {}
    for e in events:
        if e["event"] == "staged":  # a host that could not stage stays out of the batches
            for n in e.get("failed", []):
                if n in results and n not in run.unreachable:
                    run.unreachable.append(n)
                    results[n].result, results[n].detail = "failed", "staging failed"
        if e["event"] == "batch":
            started[e["index"]] = e
        elif e["event"] == "batch-done":
            done[e["index"]] = e
            run.failures = e["failures"]
            for n, r in e["results"].items():
                for k, v in r.items():
                    setattr(results[n], k, v)
    if not any(e["event"] == "planned" for e in events):
        raise RolloutError(f"{path}: the rollout died while planning, before it changed any host: start it again")
    cut = [i for i in started if i not in done]
    first = min(cut) if cut else (max(done) + 1 if done else 1)
    journal.write("resume", pid=os.getpid(), holder=runid.holder(), roll_back=roll_back, batch=first)
    if cut:
        echo(
            f"resuming the rollout of {path.parent}: {run.label(first)} was cut "
            f"({', '.join(started[first]['hosts'])}; its pyinfra, pid {started[first]['pid']}, died with it)"
        )
    if roll_back:
        reached = [
            n
            for e in events
            if e["event"] in ("batch", "batch-done")
            for n in (e.get("hosts") or list(e.get("results", {})))
        ]
        targets = [
            run.by_name[n] for n in dict.fromkeys(reached) if results[n].result not in ("rolled back", "unreachable")
        ]
        echo(f"rolling back every host the rollout reached: {', '.join(fh.name for fh in targets) or 'none'}")
        if targets:
            _roll_back(
                inventory,
                targets,
                run.before,
                results,
                data,
                path.parent / "rollback-resume.log",
                PyinfraRun(0, {}, ""),
                echo,
            )
            _versions(targets, results)
        run.report.halted = "rolled back on request (--resume --roll-back)"
        run.journal.write(
            "batch-done", index=0, results={fh.name: asdict(results[fh.name]) for fh in targets}, failures=run.failures
        )
        return _finish(run, t_start)
    if run.failures > run.max_fail:
        run.report.halted = f"{run.failures} failure(s) before the crash, more than --max-fail {run.max_fail}"
        return _finish(run, t_start)
    run.report.halted = lb.start(path.parent, journal, echo, [n for n in by_name if n not in run.unreachable])
    if run.report.halted:
        return _finish(run, t_start)
    lb.after_batch(0, {n: r for n, r in results.items() if r.batch})  # the states of the batches done
    _guarded_batches(run, first)
    return _finish(run, t_start)


def _gate(fh: roster.FleetHost, timeout: float | None) -> tuple[health.HealthResult, Failure | None]:
    """The health gate after a batch (watching the unit, as the deploy's own gate does), with the
    failure report when it fails."""
    want = probe.intent(fh)
    models = want.get("models", [])
    transport = None
    gets: list[Settings] = [fh]
    limit = float(fh.get("health_timeout") if timeout is None else timeout)
    watch = unit_watch.watch_instance(fh, lambda cmd: roster.run(fh, cmd)[1])
    try:
        if per_gpu.enabled(fh):  # one Triton per GPU: every instance gated, the host as one unit
            st = probe.probe(fh, with_intent=False)
            gets = per_gpu.instance_gets(
                fh, placement.placement_count(fh.get("gpu_count"), st.gpu_recorded, len(st.gpus) or None)
            )
        if fh.get("health_via") == "ssh":
            roster.run(fh, "true")
            transport = fh.pyinfra_host.connector.client.get_transport()
        for g in gets:
            watch = unit_watch.watch_instance(g, lambda cmd: roster.run(fh, cmd)[1])
            res = health.gate(g, fh.address, models, transport, limit, watch)
            if not res.ok:
                return res, health.instance_failure(
                    health.failure_of(res, fh.name, models, watch, limit, rollout=True), g
                )
    except (roster.FleetError, ValueError, *CONNECTION_ERRORS) as e:  # a gate that cannot run is a failed gate
        res = health.HealthResult(False, [health.Check(fh.address, False, str(e)[:200])])
    if res.ok:
        return res, None
    return res, health.failure_of(res, fh.name, models, watch, limit, rollout=True)


def _roll_back(
    inventory: str,
    failed: list[roster.FleetHost],
    before: dict,
    results: dict,
    data: dict,
    log_path: Path,
    run: PyinfraRun,
    echo,
) -> None:
    targets, wanted = [], {}
    now = dict(
        zip(
            [fh.name for fh in failed],
            workers.parallel(failed, lambda h: probe.probe(h, with_intent=False)),
            strict=True,
        )
    )
    for fh in failed:
        r, st = results[fh.name], before[fh.name]
        if not now[fh.name].reachable:
            r.result = "unreachable"
            # a host of a pyinfra process that gave no result (run.reasons) may have been changed
            never = bool(run.data) and not run.reached(fh.name) and fh.name not in run.reasons
            r.detail += (
                " (the deploy never reached it: not changed)"
                if never
                else " (no SSH now: cannot roll back; run deploys/rollback.py once it answers)"
            )
            continue
        if not st.get("release") or not st.get("unit"):
            r.detail += " (no earlier deployment on this host: nothing to roll back to)"
            continue
        targets.append(fh.name)
        wanted[fh.name] = {"release": st["release"], "unit": st["unit"]}
    if not targets:
        return
    echo(f"rolling back {', '.join(targets)} to what they served before")
    rb_dir = log_path.with_suffix(".failures")
    rb = workers.run_pyinfra(
        inventory,
        str(ROLLBACK_DEPLOY),
        targets,
        {**data, "rollback_to": wanted},
        log_path=log_path,
        failure_dir=rb_dir,
        settings=failed[0],
    )
    bad = rb.failed() if rb.data else set(targets)
    rb_reports = read_channel(rb_dir)
    for n in targets:
        r = results[n]
        if n in bad:
            r.result = "rollback failed"
            r.detail += f"; rollback: {rb_reports[n].short() if n in rb_reports else rb.reason(n)}"
            if n in rb_reports:
                echo(rb_reports[n].text())
                r.failure = {**(r.failure or {}), "rollback": rb_reports[n].to_json()}
        else:
            r.result = "rolled back"


def _versions(hosts: list[roster.FleetHost], results: dict) -> None:
    for fh, st in zip(hosts, workers.parallel(hosts, lambda h: probe.probe(h, with_intent=False)), strict=True):
        results[fh.name].after = st.version if st.reachable else "unreachable"


def _finish(run: _Run, t_start: float) -> Report:
    if run.driver:
        run.report.driver = run.driver.report()
    return finish(run.report, run.journal, t_start, run.echo, run.traffic.finish if run.traffic else None)
