"""Health-gated rolling rollout over pyinfra: canary first, then batches in inventory order.

pyinfra alone cannot do this safely (``--serial`` ignores ``--fail-percent``, orders hosts at
random, ``--no-wait`` exits 0 on failure). Here each batch is one ``pyinfra --limit`` run of the
deploy; after it, every host of the batch must pass the health gate. A host that fails is
rolled back (``deploys/rollback.py``) to what it served before the rollout; once more hosts have
failed than ``max_fail`` allows, the rollout halts and the hosts not reached yet are left exactly
as they were.

Before the first batch: every target is probed (reachable, what it serves) and the deploy is
planned with ``pyinfra --dry`` on all of them, so a pre-flight error stops the rollout before any
host is touched.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import ROLLBACK_DEPLOY, fleet, gpucount, health, perfgate, pergpu, probe, runid
from .connection import CONNECTION_ERRORS
from .failure import CHANNEL_ENV, Failure, read_channel
from .ops.check import is_check
from .procs import alive, die_with_parent


class RolloutError(RuntimeError):
    pass


@dataclass
class HostResult:
    host: str
    batch: int | None = None
    result: str = "not touched"
    seconds: float = 0.0
    before: str = "-"
    after: str = "-"
    detail: str = ""
    failure: dict | None = None  # the full failure report (tritonfleet.failure.Failure.to_json)

    @property
    def ok(self) -> bool:
        return self.result in ("updated", "unchanged")


@dataclass
class Report:
    inventory: str
    deploy: str
    batches: list[list[str]]
    hosts: list[HostResult] = field(default_factory=list)
    halted: str = ""
    seconds: float = 0.0
    log_dir: str = ""
    perf: dict = field(default_factory=dict)  #: --perf-gate: per canary, before, after, verdict

    @property
    def ok(self) -> bool:
        return not self.halted and all(h.ok for h in self.hosts)

    def to_json(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def parse_batch(batch: str | int, total: int) -> int:
    """Batch size: N hosts, or P% of the target hosts (at least 1)."""
    text = str(batch).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            return max(1, math.ceil(total * pct / 100))
        n = int(text)
        if n < 1:
            raise ValueError
        return n
    except ValueError:
        raise RolloutError(f"--batch must be a number of hosts (>= 1) or a percentage like 25%, not {batch!r}") from None


def plan_batches(names: list[str], canary: int, batch: str | int) -> list[list[str]]:
    """Canary hosts first (a batch of their own), then batches of the rest, in inventory order."""
    if canary < 0:
        raise RolloutError("--canary must be >= 0")
    out: list[list[str]] = []
    head, rest = names[:canary], names[canary:]
    if head:
        out.append(head)
    size = parse_batch(batch, len(names))
    out += [rest[i:i + size] for i in range(0, len(rest), size)]
    return out


@dataclass
class PyinfraRun:
    """One pyinfra run: its exit status, its ``-y --json`` result and its log (stderr)."""

    rc: int
    data: dict
    log: str
    log_path: str = ""  # where the run's command and output were written

    def failed(self) -> set[str]:
        return set((self.data.get("results") or {}).get("failed_hosts") or [])

    def changed(self) -> set[str]:
        out: set[str] = set()
        for op in (self.data.get("results") or {}).get("operations", []):
            if not is_check(op["name"]):
                out.update(op.get("success", []))
        return out

    def ran(self) -> set[str]:
        out: set[str] = set()
        for op in (self.data.get("results") or {}).get("operations", []):
            out.update(op.get("success", []) + op.get("error", []) + op.get("no_change", []))
        return out

    def reached(self, host: str) -> bool:
        """pyinfra ran at least one operation on ``host`` (False also when the run gave no result)."""
        return host in self.ran()

    def failed_in(self, host: str) -> str | None:
        """The operation pyinfra failed ``host`` in, as the result names it."""
        for op in reversed((self.data.get("results") or {}).get("operations", [])):
            if host in op.get("error", []):
                return op["name"]
        return None

    def reason(self, host: str) -> str:
        """Why pyinfra failed ``host``, from the run's result (``-y --json``): the operation it
        failed in, or that no operation ran on it. pyinfra's own words are in the run's log."""
        where = f" (pyinfra's output: {self.log_path})" if self.log_path else ""
        op = self.failed_in(host)
        if op:
            return f"{op}: failed{where}"
        if not self.data:
            return f"pyinfra gave no result (exit status {self.rc}){where}"
        if not self.reached(host):
            return f"no operation ran on it (pyinfra could not connect, or the deploy code failed){where}"
        return f"pyinfra failed it (exit status {self.rc}){where}"


def pyinfra_command() -> list[str]:
    exe = Path(sys.executable).parent / "pyinfra"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pyinfra"]


def run_pyinfra(inventory: str, deploy: str, hosts: list[str], data: dict, dry: bool = False,
                log_path: Path | None = None, timeout: float = 7200,
                failure_dir: Path | None = None, on_start: Callable[[int], None] | None = None) -> PyinfraRun:
    """One pyinfra run. The child dies with this process (SIGKILL from the kernel when the rollout
    dies: tritonfleet.procs), so a dead rollout never leaves a deploy running ungated.
    ``failure_dir``: where the run's steps leave each failed host's report (CHANNEL_ENV).
    ``on_start(pid)`` is called once the child runs."""
    cmd = pyinfra_command() + ["-y", "--json"]
    for h in hosts:  # one --limit per host: pyinfra takes no comma-separated list
        cmd += ["--limit", h]
    if dry:
        cmd.append("--dry")
    for k, v in data.items():
        cmd += ["--data", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    cmd += [inventory, deploy]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    env.pop(CHANNEL_ENV, None)
    if failure_dir is not None:
        env[CHANNEL_ENV] = str(failure_dir)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=die_with_parent())
    if on_start:
        on_start(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        rc, out, err = 124, "", f"{err or ''}\npyinfra did not finish within {timeout:.0f}s"
    if log_path:
        log_path.write_text(f"$ {' '.join(cmd)}\n{err}\n{out}")
    try:
        data_out = json.loads(out) if out.strip() else {}
    except ValueError:
        data_out = {}
    return PyinfraRun(rc, data_out, err, str(log_path) if log_path else "")


def _log_dir() -> Path:
    base = Path(os.environ.get("TRITONFLEET_LOG_DIR", ".tritonfleet/rollouts"))
    d = base / time.strftime("%Y%m%d-%H%M%S")
    if d.exists():  # two rollouts started in the same second: each keeps its own directory
        d = base / f"{d.name}-{os.getpid()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


JOURNAL = "journal.jsonl"


class Journal:
    """What a rollout did, as it goes: one JSON object a line, each written and flushed to disk
    before the rollout acts on it (``start``: the plan and its parameters; ``before``: what every
    host served; ``batch``: a batch started, with its pyinfra's pid; ``batch-done``: its results
    and rollbacks; ``end``). ``tritonfleet rollout --resume`` reads it after a crash."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "time": time.time(), **fields}, sort_keys=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def events(self) -> list[dict]:
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                break  # a line torn by the crash: what came before it is the record
        return out


def latest_journal(base: Path | None = None) -> Path:
    """The newest rollout journal that has no end (a rollout that died)."""
    base = base or Path(os.environ.get("TRITONFLEET_LOG_DIR", ".tritonfleet/rollouts"))
    journals = sorted(base.glob(f"*/{JOURNAL}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for j in journals:
        if not any(e["event"] == "end" for e in Journal(j).events()):
            return j
    raise RolloutError(f"no unfinished rollout under {base}/ (every journal there has an end): nothing to resume")


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

    @property
    def results(self) -> dict[str, HostResult]:
        return {r.host: r for r in self.report.hosts}

    def label(self, i: int) -> str:
        return "canary" if i == 1 and self.canary else f"batch {i}/{len(self.batches)}"


def _before_record(st: probe.HostStatus) -> dict:
    return {"release": st.release, "unit": st.unit, "version": st.version, "reachable": st.reachable,
            "error": st.error}


def rollout(inventory: str, deploy: str, *, limit: list[str] | None = None, canary: int = 1,
            batch: str | int = "25%", max_fail: int = 0, data: dict | None = None,
            gate_timeout: float | None = None, echo: Callable[[str], None] = print,
            perf_gate: bool = False) -> Report:
    data = dict(data or {})
    if not Path(deploy).is_file():
        raise RolloutError(f"deploy {deploy} not found")
    if max_fail < 0:
        raise RolloutError("--max-fail must be >= 0")
    if perf_gate and canary < 1:
        raise RolloutError("--perf-gate measures the canary before and after its update: give --canary 1 or more")
    t_start = time.monotonic()
    hosts = fleet.load_inventory(inventory, data=data, limit=limit)
    names = [h.name for h in hosts]
    batches = plan_batches(names, canary, batch)
    report = Report(inventory, deploy, batches, [HostResult(n) for n in names])
    logs = _log_dir()
    report.log_dir = str(logs)
    journal = Journal(logs / JOURNAL)
    journal.write("start", inventory=inventory, deploy=deploy, limit=list(limit or []), canary=canary,
                  batch=str(batch), max_fail=max_fail, data=data, gate_timeout=gate_timeout, batches=batches,
                  hosts=names, cwd=os.getcwd(), pid=os.getpid(), holder=runid.holder())
    run = _Run(inventory, deploy, data, batches, canary, max_fail, gate_timeout, report, logs, journal, echo,
               by_name={h.name: h for h in hosts}, perf_gate=perf_gate)
    echo(f"rollout of {deploy} to {len(names)} host(s) of {inventory}: "
         f"{len(batches)} batch(es) {[len(b) for b in batches]}, canary {min(canary, len(names))}, "
         f"max {max_fail} failure(s); logs and journal in {logs}")

    # 1. what every target serves now, and whether it answers
    before = dict(zip(names, fleet.parallel(hosts, probe.probe), strict=True))
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

    # 2. plan on every reachable target: a pre-flight error stops here, with no host touched
    targets = [n for n in names if n not in run.unreachable]
    dry = run_pyinfra(inventory, deploy, targets, data, dry=True, log_path=logs / "plan.log")
    if dry.rc != 0:
        report.halted = "planning failed before any host was changed:\n  " + "\n  ".join(_plan_error(dry.log))
        return _finish(run, t_start)
    journal.write("planned")

    # 3. batches
    _batches(run, 1)
    return _finish(run, t_start)


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
        perf = perfgate.Gate(run.echo) if run.perf_gate and i == 1 and run.canary else None
        if perf:  # the canary's performance before its update (tritonfleet/perfgate.py)
            try:
                perf.measure_before([run.by_name[n] for n in todo])
            except perfgate.PerfGateError as e:
                run.report.halted = f"performance gate: {e}"
                return
        run.echo(f"[{label}] deploying to {', '.join(todo)}")
        t0 = time.monotonic()
        pyi = run_pyinfra(run.inventory, run.deploy, todo, run.data, log_path=run.logs / f"batch-{i}.log",
                          failure_dir=run.logs / f"failures-{i}",
                          on_start=lambda pid, i=i, todo=todo: run.journal.write("batch", index=i, hosts=todo,
                                                                                 pid=pid))
        # why each host failed: the report its step left (structured), else pyinfra's own words
        reports: dict[str, Failure] = {n: f for n, f in read_channel(run.logs / f"failures-{i}").items()
                                       if n in todo}
        why = {n: (reports[n].short(240) if n in reports else pyi.reason(n)) for n in todo}
        failed: dict[str, str] = {n: why[n] for n in pyi.failed() if n in todo}
        if pyi.rc != 0 and not failed and not pyi.data:  # no JSON (every host failed): all of them
            failed = dict(why)
        changed = pyi.changed()
        # the gate, on every host of the batch that the deploy did not already fail
        ok_names = [n for n in todo if n not in failed]
        for n, report_ in _gate_all(run, ok_names).items():
            reports[n] = report_
            failed[n] = report_.short(240)
        if perf:
            failed.update(perf.measure_after([run.by_name[n] for n in ok_names if n not in failed]))
            run.report.perf = perf.report()
        elapsed = time.monotonic() - t0
        for n in todo:
            r = results[n]
            r.batch, r.seconds = i, elapsed
            if n in failed:
                r.result, r.detail = "failed", failed[n]
                r.failure = reports[n].to_json() if n in reports else None
            else:
                r.result = "updated" if n in changed else "unchanged"
        if failed:
            run.echo(f"[{label}] failed: " + "; ".join(f"{n}: {why}" for n, why in failed.items()))
            for n in failed:
                if n in reports:
                    run.echo(reports[n].text())
            _roll_back(run.inventory, [run.by_name[n] for n in failed], run.before, results, run.data,
                       run.logs / f"rollback-{i}.log", pyi, run.echo)
        _versions([run.by_name[n] for n in todo], results)
        run.failures += len(failed)
        run.journal.write("batch-done", index=i, results={n: asdict(results[n]) for n in todo},
                          failures=run.failures)
        run.echo(f"[{label}] done in {elapsed:.1f}s: " + ", ".join(f"{n} {results[n].result}" for n in todo))
        if run.failures > run.max_fail:
            left = [n for bb in run.batches[i:] for n in bb if n not in run.unreachable]
            run.report.halted = (f"{run.failures} failure(s), more than --max-fail {run.max_fail}: halted after "
                                 f"{label}; {len(left)} host(s) not touched")
            return


def _gate_all(run: _Run, names: list[str]) -> dict[str, Failure]:
    """The health gate on ``names``; {host: failure report} for those that failed it."""
    hosts = [run.by_name[n] for n in names]
    failed = {}
    for fh, (res, report_) in zip(hosts, fleet.parallel(hosts, lambda fh: _gate(fh, run.gate_timeout)),
                                  strict=True):
        if not res.ok:
            failed[fh.name] = report_
    return failed


def resume(journal_path: str | Path | None = None, *, roll_back: bool = False,
           echo: Callable[[str], None] = print) -> Report:
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
    import socket as _socket

    if start.get("holder", "").split(" ", 1)[0].endswith("@" + _socket.gethostname()) and \
            start.get("pid") != os.getpid() and alive(int(start.get("pid", 0))) and \
            b"tritonfleet" in Path(f"/proc/{start['pid']}/cmdline").read_bytes():
        raise RolloutError(f"{path}: the rollout that wrote it is still running (pid {start['pid']}): "
                           "let it finish, or stop it first")
    if start.get("cwd") and Path(start["cwd"]).resolve() != Path.cwd().resolve():
        raise RolloutError(f"{path}: resume from the directory that rollout ran in: {start['cwd']} "
                           "(the inventory, deploy and model repository are relative to it)")
    t_start = time.monotonic()
    inventory, deploy, data = start["inventory"], start["deploy"], start.get("data") or {}
    batches = start["batches"]
    hosts = fleet.load_inventory(inventory, data=data, limit=start.get("limit") or None)
    by_name = {h.name: h for h in hosts}
    missing = [n for b in batches for n in b if n not in by_name]
    if missing:
        raise RolloutError(f"{path}: hosts of the journal are no longer in {inventory}: {', '.join(missing)}")
    report = Report(inventory, deploy, batches, [HostResult(n) for n in start["hosts"]])
    report.log_dir = str(path.parent)
    run = _Run(inventory, deploy, data, batches, int(start["canary"]), int(start["max_fail"]),
               start.get("gate_timeout"), report, path.parent, journal, echo, by_name=by_name)
    results = run.results
    before_ev = next((e for e in events if e["event"] == "before"), None)
    if before_ev is None:
        raise RolloutError(f"{path}: the rollout died before it had probed the hosts, so it changed "
                           "nothing: start it again")
    run.before = before_ev["hosts"]
    for n, b in run.before.items():
        results[n].before = b.get("version", "-")
        if not b.get("reachable"):
            run.unreachable.append(n)
            results[n].result, results[n].detail = "unreachable", b.get("error", "")
    run.failures = len(run.unreachable)
    done, started = {}, {}
    for e in events:
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
        echo(f"resuming the rollout of {path.parent}: {run.label(first)} was cut "
             f"({', '.join(started[first]['hosts'])}; its pyinfra, pid {started[first]['pid']}, died with it)")
    if roll_back:
        reached = [n for e in events if e["event"] in ("batch", "batch-done")
                   for n in (e.get("hosts") or list(e.get("results", {})))]
        targets = [run.by_name[n] for n in dict.fromkeys(reached)
                   if results[n].result not in ("rolled back", "unreachable")]
        echo(f"rolling back every host the rollout reached: {', '.join(fh.name for fh in targets) or 'none'}")
        if targets:
            _roll_back(inventory, targets, run.before, results, data, path.parent / "rollback-resume.log",
                       PyinfraRun(0, {}, ""), echo)
            _versions(targets, results)
        run.report.halted = "rolled back on request (--resume --roll-back)"
        run.journal.write("batch-done", index=0, results={fh.name: asdict(results[fh.name]) for fh in targets},
                          failures=run.failures)
        return _finish(run, t_start)
    if run.failures > run.max_fail:
        run.report.halted = f"{run.failures} failure(s) before the crash, more than --max-fail {run.max_fail}"
        return _finish(run, t_start)
    _batches(run, first)
    return _finish(run, t_start)


def _plan_error(log: str) -> list[str]:
    """The part of a failed plan's output that says why (pre-flight message, without tracebacks)."""
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "pre-flight failed" in ln), max(0, len(lines) - 12))
    out = []
    for ln in lines[start:]:
        if ln.startswith("Traceback"):
            break
        out.append(ln)
    return out[:20]


def _gate(fh: fleet.FleetHost, timeout: float | None) -> tuple[health.HealthResult, Failure | None]:
    """The health gate after a batch (watching the unit, as the deploy's own gate does), with the
    failure report when it fails."""
    want = probe.intent(fh)
    models = want.get("models", [])
    transport = None
    gets = [fh.get]
    limit = float(fh.get("health_timeout") if timeout is None else timeout)
    watch = health.unit_watch(fh.get, lambda cmd: fleet.run(fh, cmd)[1])
    try:
        if pergpu.enabled(fh.get):  # one Triton per GPU: every instance gated, the host as one unit
            st = probe.probe(fh, with_intent=False)
            gets = pergpu.instance_gets(fh.get, gpucount.placement_count(fh.get("gpu_count"), st.gpu_recorded,
                                                                         len(st.gpus) or None))
        if fh.get("health_via") == "ssh":
            fleet.run(fh, "true")
            transport = fh.pyinfra_host.connector.client.get_transport()
        for g in gets:
            watch = health.unit_watch(g, lambda cmd: fleet.run(fh, cmd)[1])
            res = health.gate(g, fh.address, models, transport, limit, watch)
            if not res.ok:
                return res, health.instance_failure(health.failure_of(res, fh.name, models, watch, limit,
                                                                      rollout=True), g)
    except (fleet.FleetError, ValueError, *CONNECTION_ERRORS) as e:  # a gate that cannot run is a failed gate
        res = health.HealthResult(False, [health.Check(fh.address, False, str(e)[:200])])
    if res.ok:
        return res, None
    return res, health.failure_of(res, fh.name, models, watch, limit, rollout=True)


def _roll_back(inventory: str, failed: list[fleet.FleetHost], before: dict, results: dict, data: dict,
               log_path: Path, run: PyinfraRun, echo) -> None:
    targets, wanted = [], {}
    now = dict(zip([fh.name for fh in failed], fleet.parallel(failed, lambda h: probe.probe(h, with_intent=False)),
                   strict=True))
    for fh in failed:
        r, st = results[fh.name], before[fh.name]
        if not now[fh.name].reachable:
            r.result = "unreachable"
            never = bool(run.data) and not run.reached(fh.name)
            r.detail += (" (the deploy never reached it: not changed)" if never
                         else " (no SSH now: cannot roll back; run deploys/rollback.py once it answers)")
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
    rb = run_pyinfra(inventory, str(ROLLBACK_DEPLOY), targets, {**data, "rollback_to": wanted}, log_path=log_path,
                     failure_dir=rb_dir)
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


def _versions(hosts: list[fleet.FleetHost], results: dict) -> None:
    for fh, st in zip(hosts, fleet.parallel(hosts, lambda h: probe.probe(h, with_intent=False)), strict=True):
        results[fh.name].after = st.version if st.reachable else "unreachable"


def _finish(run: _Run, t_start: float) -> Report:
    report, echo = run.report, run.echo
    report.seconds = time.monotonic() - t_start
    for r in report.hosts:
        if r.result == "not touched" and r.after == "-":
            r.after = r.before
    if report.halted:
        echo(f"HALTED: {report.halted}")
    run.journal.write("end", ok=report.ok, halted=report.halted)
    return report


def table(report: Report) -> str:
    rows = [("HOST", "BATCH", "RESULT", "TIME", "BEFORE", "AFTER", "DETAIL")]
    for r in report.hosts:
        rows.append((r.host, str(r.batch or "-"), r.result, f"{r.seconds:.1f}s" if r.batch else "-",
                     r.before, r.after, r.detail[:100]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)) + "  " + row[-1]
             for row in rows]
    lines += perfgate.lines(report.perf)
    verdict = "OK" if report.ok else ("HALTED" if report.halted else "FAILED")
    lines.append(f"{verdict}: {sum(r.ok for r in report.hosts)}/{len(report.hosts)} host(s) on the new "
                 f"version in {report.seconds:.1f}s")
    return "\n".join(lines)
