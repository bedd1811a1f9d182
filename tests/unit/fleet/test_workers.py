"""Runs spread over worker processes (tritonfleet.fleet.workers): every host in exactly one
share, results back in host order from several processes, an error or an interruption in any
worker reported and no worker left running, pyinfra runs' results merged into one."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tritonfleet.core.procs import alive
from tritonfleet.fleet import workers
from tritonfleet.fleet.rollout import pyinfra_run
from tritonfleet.fleet.rollout.pyinfra_run import PyinfraRun


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
