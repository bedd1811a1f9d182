"""Runs spread over worker processes (tritonfleet.fleet.runner.workers): every host in exactly one
share, results back in host order from several processes, an error or an interruption in any
worker reported and no worker left running, pyinfra runs' results merged into one."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tritonfleet.core.procs import alive
from tritonfleet.fleet.runner import pyinfra_run, workers
from tritonfleet.fleet.runner.pyinfra_run import PyinfraRun


@dataclass
class Host:
    name: str
    data: dict = field(default_factory=dict)
    pyinfra_host: object = None

    def get(self, key, default=None):
        return self.data.get(key, default)


def hosts(n: int, **data) -> list[Host]:
    return [Host(f"h{i:03d}", dict(data)) for i in range(n)]


@given(st.lists(st.integers(), max_size=200), st.integers(1, 16))
def test_shares_hold_every_item_once_and_even(items, k):
    parts = workers.slices(items, k)
    assert sorted(x for p in parts for x in p) == sorted(items)
    assert sum(len(p) for p in parts) == len(items)
    if parts:
        assert max(map(len, parts)) - min(map(len, parts)) <= 1 and len(parts) <= k


def test_worker_count_as_asked_bounded_by_the_hosts(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert workers.count(1000, None, None) == 4  # fleet_workers = 0: one per CPU
    assert workers.count(1000, None, Host("a", {"fleet_workers": 2})) == 2
    assert workers.count(1000, 3, None) == 3
    assert workers.count(50, None, None) == 2 and workers.count(19, None, None) == 1  # at least MIN_HOSTS_PER_WORKER each
    with pytest.raises(workers.WorkerError, match="fleet_workers must be a whole number"):
        workers.count(1000, None, Host("a", {"fleet_workers": "many"}))


def test_forked_workers_answer_in_host_order():
    hs = hosts(60)
    out = workers.parallel(hs, lambda h: (h.name, os.getpid()), workers=3)
    assert [name for name, _ in out] == [h.name for h in hs]
    pids = {pid for _, pid in out}
    assert len(pids) == 3 and os.getpid() not in pids
    # each worker had every 3rd host
    assert {out[i][1] for i in range(0, 60, 3)} == {out[0][1]}


def test_a_worker_error_names_its_hosts_and_nothing_is_half_returned():
    hs = hosts(40)

    def fn(h):
        if h.name == "h007":
            raise ValueError("the probe broke")
        return h.name

    with pytest.raises(workers.WorkerError, match=r"worker 2/2 \(hosts h001, h003.*ValueError: the probe broke"):
        workers.parallel(hs, fn, workers=2)
    with pytest.raises(workers.WorkerError, match="does not pickle"):
        workers.parallel(hs, lambda h: (lambda: h), workers=2)


def test_an_interrupted_run_leaves_no_worker_running(tmp_path):
    hs = hosts(40)
    pidfile = tmp_path / "pids"

    def slow(h):
        with open(pidfile, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(60)

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            workers.parallel(hs, slow, workers=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 10
    pids = {int(p) for p in pidfile.read_text().split()}
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def _op(name, success=(), error=(), no_change=()):
    return {"op_hash": name, "name": name, "hosts": len(success) + len(error) + len(no_change),
            "success": list(success), "error": list(error), "no_change": list(no_change)}


def test_pyinfra_results_merge_into_one_run():
    a = PyinfraRun(0, {"results": {"operations": [_op("apt", no_change=["a1", "a2"]), _op("unit", ["a1"])],
                                           "failed_hosts": [], "totals": {"hosts": 2}}}, "log a")
    b = PyinfraRun(1, {"results": {"operations": [_op("apt", error=["b1"], no_change=["b2"])],
                                           "failed_hosts": ["b1"], "totals": {"hosts": 2}}}, "log b")
    crashed = PyinfraRun(2, {}, "Traceback ...")
    run = workers.merge([a, b, crashed], [["a1", "a2"], ["b1", "b2"], ["c1"]])
    assert run.rc == 2 and run.log == "log a\nlog b\nTraceback ..."
    assert run.failed() == {"b1", "c1"}  # a run with no result fails every host it had
    assert run.changed() == {"a1"}
    assert run.reached("b2") and not run.reached("c1")
    assert run.failed_in("b1") == "apt"
    apt = next(op for op in run.data["results"]["operations"] if op["name"] == "apt")
    assert apt["hosts"] == 4 and sorted(apt["no_change"]) == ["a1", "a2", "b2"]


def test_a_deploy_split_over_pyinfra_processes(monkeypatch, tmp_path):
    calls = []

    def fake(inventory, deploy, hosts, data, dry=False, log_path=None, timeout=0, failure_dir=None, on_start=None):
        calls.append(list(hosts))
        on_start(1000 + len(calls))
        log_path.write_text(f"ran {' '.join(hosts)}\n")
        return PyinfraRun(0, {"results": {"operations": [_op("op", no_change=hosts)], "failed_hosts": []}},
                                  "", str(log_path))

    monkeypatch.setattr(pyinfra_run, "run_pyinfra", fake)
    started = []
    names = [f"h{i}" for i in range(45)]
    run = workers.run_pyinfra("inv.py", "d.py", names, {}, log_path=tmp_path / "batch-1.log",
                              on_start=started.append, workers=2, settings=Host("h0"))
    assert sorted(map(len, calls)) == [22, 23] and sorted(sum(calls, [])) == sorted(names)
    assert sorted(started) == [1001, 1002]
    assert run.ran() == set(names) and run.rc == 0
    log = Path(run.log_path).read_text()
    assert "batch-1.1.log" in log and "batch-1.2.log" in log and log.count("ran h") == 2
    # few hosts: one process, as before
    calls.clear()
    workers.run_pyinfra("inv.py", "d.py", names[:10], {}, settings=None, log_path=tmp_path / "b.log", on_start=started.append,
                        workers=2)
    assert calls == [names[:10]]


FAKE_PYINFRA = r'''
import json, os, sys
args = sys.argv[1:]
hosts = [args[i + 1] for i, a in enumerate(args) if a == "--limit"]
bad = [h for h in hosts if h.startswith("bad")]
for h in bad:  # as a step reports a host it fails (tritonfleet.core.report, CHANNEL_ENV)
    with open(os.path.join(os.environ["TRITONFLEET_FAILURE_DIR"], h + ".json"), "w") as f:
        json.dump({"host": h, "step": "pre-flight", "expected": "a driver branch", "found": "branch 999"}, f)
print(f"[{os.getpid()}] {len(hosts)} hosts", file=sys.stderr)
ops = [{"op_hash": "a", "name": "apt", "hosts": len(hosts), "success": [h for h in hosts if h.endswith("1")],
        "error": bad, "no_change": [h for h in hosts if h not in bad and not h.endswith("1")]}]
print(json.dumps({"results": {"operations": ops, "failed_hosts": bad}}))
sys.exit(1 if bad else 0)
'''


def test_a_deploy_over_pyinfra_processes_reports_once(monkeypatch, tmp_path):
    """`tritonfleet deploy`: each process its share (every host once), one summary, the failure
    report of each failed host, the worst exit status."""
    script = tmp_path / "fake_pyinfra.py"
    script.write_text(FAKE_PYINFRA)
    monkeypatch.setattr(pyinfra_run, "pyinfra_command", lambda: [sys.executable, str(script)])
    names = [f"h{i:02d}" for i in range(40)] + ["bad-1"]
    lines = []
    rc = workers.deploy("inv.py", "d.py", names, {"x": 1}, settings=None, workers=2, echo=lines.append)
    assert rc == 1
    summary = lines[0]
    assert summary == "41 host(s) in 2 pyinfra process(es): 4 changed, 36 unchanged, 1 failed: bad-1"
    assert "tritonfleet: bad-1 failed at pre-flight" in lines[1] and "found:    branch 999" in lines[1]
    names.remove("bad-1")
    lines.clear()
    assert workers.deploy("inv.py", "d.py", names, {}, settings=None, workers=2, echo=lines.append) == 0
    assert lines == ["40 host(s) in 2 pyinfra process(es): 4 changed, 36 unchanged, 0 failed"]


def _fake_slices(monkeypatch, bad: Callable[[list[str]], BaseException | None]):
    """pyinfra replaced by a run that reports every host of its slice unchanged, or raises what
    ``bad(slice)`` gives."""
    def fake(inventory, deploy, hosts, data, dry=False, log_path=None, timeout=0, failure_dir=None, on_start=None):
        e = bad(hosts)
        if e is not None:
            raise e
        return PyinfraRun(0, {"results": {"operations": [_op("op", no_change=hosts)], "failed_hosts": []}}, "")

    monkeypatch.setattr(pyinfra_run, "run_pyinfra", fake)


def test_a_slice_that_raised_fails_its_hosts_with_the_reason(monkeypatch, tmp_path):
    """The review's reproduction: 60 hosts, 3 workers, the second slice's run raising ENOSPC. Its
    20 hosts are failed with the error's words, the exit status is not 0, and the others are
    merged by slice index (none misattributed)."""
    names = [f"h{i:02d}" for i in range(60)]
    second = workers.slices(names, 3)[1]
    _fake_slices(monkeypatch, lambda hs: OSError(28, "No space left on device") if hs == second else None)
    run = workers.run_pyinfra("inv.py", "d.py", names, {}, settings=None, workers=3, log_path=tmp_path / "b.log")
    assert run.rc != 0
    assert run.failed() == set(second) and len(second) == 20
    assert all("No space left on device" in run.reason(h) and "2/3" in run.reason(h) for h in second)
    assert run.ran() == set(names) - set(second)
    assert run.ran() | run.failed() == set(names)  # every host asked for accounted for
    # one worker only: the same (the error no longer escapes as an exception)
    run = workers.run_pyinfra("inv.py", "d.py", second, {}, settings=None, workers=1)
    assert run.rc != 0 and run.failed() == set(second) and "No space left" in run.reason(second[0])


def test_on_start_raising_fails_the_slice(monkeypatch):
    names = [f"h{i:02d}" for i in range(40)]

    def fake(inventory, deploy, hosts, data, dry=False, log_path=None, timeout=0, failure_dir=None, on_start=None):
        on_start(4242)
        return PyinfraRun(0, {"results": {"operations": [_op("op", success=hosts)], "failed_hosts": []}}, "")

    monkeypatch.setattr(pyinfra_run, "run_pyinfra", fake)

    def journal(pid):
        raise OSError(28, "No space left on device: journal.jsonl")

    run = workers.run_pyinfra("inv.py", "d.py", names, {}, settings=None, workers=2, on_start=journal)
    assert run.rc != 0 and run.failed() == set(names) and not run.changed()
    assert "journal.jsonl" in run.reason("h00")


@given(st.lists(st.booleans(), min_size=1, max_size=6), st.integers(1, 80))
def test_merge_accounts_for_every_host_once(dead, n):
    """Any slices without a result, anywhere: each host asked for is failed or ran, never both
    missing; the hosts of a dead slice are exactly its own."""
    names = [f"h{i}" for i in range(n)]
    parts = workers.slices(names, len(dead))
    runs = [None if dead[i % len(dead)] else
            PyinfraRun(0, {"results": {"operations": [_op("op", success=p)], "failed_hosts": []}}, "")
            for i, p in enumerate(parts)]
    run = workers.merge(runs, parts, ["gone"] * len(parts), names)
    lost = {h for p, r in zip(parts, runs, strict=True) if r is None for h in p}
    assert run.failed() == lost and run.changed() == set(names) - lost
    assert (run.rc != 0) == bool(lost)
    with pytest.raises(workers.MergeError):
        workers.merge(runs, parts, None, names + ["extra"])
    with pytest.raises(workers.MergeError):
        workers.merge(runs[:-1], parts, None, names)


KILLED_PYINFRA = r'''
import os, signal, sys, time
args = sys.argv[1:]
hosts = [args[i + 1] for i, a in enumerate(args) if a == "--limit"]
if "h01" in hosts:
    print('{"results": {"operat', flush=True)  # half a result, then killed mid-run
    os.kill(os.getpid(), signal.SIGKILL)
import json
ops = [{"op_hash": "a", "name": "apt", "hosts": len(hosts), "success": [], "error": [], "no_change": hosts}]
print(json.dumps({"results": {"operations": ops, "failed_hosts": []}}))
'''


def test_a_worker_killed_mid_run_or_unable_to_start_fails_its_hosts(monkeypatch, tmp_path):
    script = tmp_path / "fake_pyinfra.py"
    script.write_text(KILLED_PYINFRA)
    monkeypatch.setattr(pyinfra_run, "pyinfra_command", lambda: [sys.executable, str(script)])
    names = [f"h{i:02d}" for i in range(40)]
    run = workers.run_pyinfra("inv.py", "d.py", names, {}, settings=None, workers=2, log_path=tmp_path / "b.log")
    killed = set(workers.slices(names, 2)[1])
    assert run.rc == 128 + signal.SIGKILL
    assert run.failed() == killed and "exit status 137" in run.reason("h01")
    assert run.ran() == set(names) - killed
    # a pyinfra that cannot start at all: every host failed, with why
    monkeypatch.setattr(pyinfra_run, "pyinfra_command", lambda: [str(tmp_path / "no-such-pyinfra")])
    run = workers.run_pyinfra("inv.py", "d.py", names, {}, settings=None, workers=2)
    assert run.rc != 0 and run.failed() == set(names) and "no-such-pyinfra" in run.reason("h00")


def test_a_dry_runs_result_is_a_result():
    """``pyinfra --dry --json`` prints {"plan": ..., "results": null}: with exit status 0 its hosts
    are planned, not failed; with another status and no JSON at all, they are failed."""
    dry = PyinfraRun(0, {"plan": {"h1": []}, "results": None}, "")
    run = workers.merge([dry], [["h1"]], None, ["h1"])
    assert run.rc == 0 and not run.failed()
    run = workers.merge([PyinfraRun(0, {}, "")], [["h1"]], None, ["h1"])
    assert run.rc != 0 and run.failed() == {"h1"} and "gave no result" in run.reason("h1")


def test_tritonfleet_deploy_reports_the_hosts_of_a_killed_process_failed(monkeypatch, tmp_path):
    """`tritonfleet deploy` over two processes, one killed mid-run: its hosts are failed with
    why, the exit status is not 0 (a signal's -9 was once read as better than 0)."""
    script = tmp_path / "fake_pyinfra.py"
    script.write_text(KILLED_PYINFRA)
    monkeypatch.setattr(pyinfra_run, "pyinfra_command", lambda: [sys.executable, str(script)])
    names = [f"h{i:02d}" for i in range(40)]
    lines = []
    rc = workers.deploy("inv.py", "d.py", names, {}, settings=None, workers=2, echo=lines.append)
    assert rc == 128 + signal.SIGKILL
    assert "20 failed: h01, h03" in lines[0]
    assert any("gave no result (exit status 137)" in ln for ln in lines[1:])


def test_tritonfleet_deploy_whose_pyinfra_cannot_start_fails_every_host(monkeypatch, tmp_path):
    monkeypatch.setattr(pyinfra_run, "pyinfra_command", lambda: [str(tmp_path / "no-such-pyinfra")])
    names = [f"h{i:02d}" for i in range(40)]
    lines = []
    assert workers.deploy("inv.py", "d.py", names, {}, settings=None, workers=2, echo=lines.append) != 0
    assert "40 failed" in lines[0] and "pyinfra could not start" in lines[1] and "no-such-pyinfra" in lines[1]
