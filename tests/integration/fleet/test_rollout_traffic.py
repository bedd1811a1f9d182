"""The rollout's traffic calls (tritonfleet.fleet.rollout.traffic) without test hosts: settings that
cannot work are refused before anything is written, a batch that can never pass is refused with
the numbers (against Debian's HAProxy on loopback), the canary's share and the matched baseline
host are set and put back, states follow the batch, and the report's lines."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tests.support.haproxy import HAProxy, ok_server
from tritonfleet.core.errors import UsageError
from tritonfleet.fleet.rollout import Journal, Report, plan_batches
from tritonfleet.fleet.rollout import traffic as rollout_traffic
from tritonfleet.inventory.roster import FleetHost
from tritonfleet.serving.drain import HAProxy as Runtime
from tritonfleet.serving.haproxy_weights import Weights
from tritonfleet.settings.defaults import DEFAULTS


def host(name: str, **data) -> FleetHost:
    return FleetHost(name, ["t4"], {**DEFAULTS, **data})


@pytest.fixture
def hap(tmp_path):
    d = tmp_path / "hap"
    d.mkdir()
    with ok_server() as addr, HAProxy(d, [(n, addr) for n in ("h1", "h2", "h3", "h4")], inter="200ms") as h:
        for n in ("h1", "h2", "h3", "h4"):
            Runtime([h.socket], "triton", n).wait_serving(10)
        yield h


def lb(sock: str, **more) -> dict:
    return {"lb": "haproxy", "lb_haproxy_sockets": [sock], "rollout_metrics_listen": None, **more}


@pytest.mark.parametrize("data,words", [
    ({"rollout_max_unavailable": 1}, "need lb = 'haproxy'"),
    ({"lb": "haproxy", "lb_haproxy_sockets": ["/x"], "rollout_max_unavailable": "1.5"}, "number of hosts"),
])
def test_settings_that_cannot_work_are_refused(data, words):
    with pytest.raises(UsageError, match=words):
        rollout_traffic.Traffic([host("h1", **data)], [["h1"]], 1, None)


def test_hosts_of_one_backend_must_agree(tmp_path):
    hosts = [host("h1", **lb("/s", rollout_max_unavailable=1)), host("h2", **lb("/s", rollout_max_unavailable=2))]
    with pytest.raises(UsageError, match="differ on rollout_max_unavailable"):
        rollout_traffic.Traffic(hosts, [["h1"], ["h2"]], 1, None)


def test_a_canary_share_needs_a_baseline_prometheus_and_haproxy():
    with pytest.raises(UsageError, match="baseline hosts"):
        rollout_traffic.Traffic([host("h1", **lb("/s"))], [["h1"]], 1, 0.05)
    with pytest.raises(UsageError, match="canary_prometheus_url"):
        rollout_traffic.Traffic([host("h1", **lb("/s")), host("h2", **lb("/s"))], [["h1"], ["h2"]], 1, 0.05)
    with pytest.raises(UsageError, match="need lb = 'haproxy'"):
        rollout_traffic.Traffic([host("h1"), host("h2")], [["h1"], ["h2"]], 1, 0.05)
    with pytest.raises(UsageError, match="--canary 1 or more"):
        rollout_traffic.Traffic([host("h1", **lb("/s")), host("h2", **lb("/s"))], [["h1", "h2"]], 0, 0.05)
    with pytest.raises(UsageError, match="between 0 and 100"):
        rollout_traffic.prepare([host("h1", **lb("/s")), host("h2", **lb("/s"))], [["h1"], ["h2"]], 1, 150)


def test_a_batch_that_can_never_pass_is_refused_before_any_host(hap, tmp_path):
    hosts = [host(n, **lb(hap.socket, rollout_max_unavailable="25%")) for n in ("h1", "h2", "h3")]
    batches = plan_batches([h.name for h in hosts], 0, 2)
    t = rollout_traffic.Traffic(hosts, batches, 0, None)
    said = []
    why = t.start(tmp_path, Journal(tmp_path / "journal.jsonl"), said.append, [h.name for h in hosts])
    assert why.startswith("capacity: batch 1 (h1, h2) can never go out, even with every server of backend "
                          "triton serving: 2 of 4 server(s) would be out of HAProxy, max_unavailable 25% allows 1")
    t.finish(Report("inv", "d", batches))
    # a host whose server HAProxy does not have
    t = rollout_traffic.Traffic([host("h9", **lb(hap.socket, rollout_max_unavailable=1))], [["h9"]], 1, None)
    assert "has no server for h9" in t.start(tmp_path, None, said.append, ["h9"])
    t.finish(Report("inv", "d", [["h9"]]))


def test_share_matched_and_states_through_a_batch(hap, tmp_path):
    data = lb(hap.socket, canary_prometheus_url="http://127.0.0.1:1", rollout_max_unavailable=1)
    hosts = [host(n, **data) for n in ("h1", "h2", "h3")]
    batches = plan_batches([h.name for h in hosts], 1, 1)
    t = rollout_traffic.Traffic(hosts, batches, 1, 0.05)
    said = []
    journal = Journal(tmp_path / "journal.jsonl")
    assert t.start(tmp_path, journal, said.append, ["h1", "h2", "h3"]) == ""
    assert t.before_batch(1, ["h1"], "canary") == ""
    w = Weights([hap.socket], "triton").current()
    # h4 is a server of the backend outside the rollout: it shares the rest with h3
    assert w == {"h1": 1, "h2": 1, "h3": 9, "h4": 9} and t.matched == ["h2"]
    assert t.states.get("h1") == "updating" and t.states.snapshot()["canary_share"] == pytest.approx(0.05)
    watch = t.watch(1, ["h1"], "canary")
    hap.command("set server triton/h1 state drain")
    import time

    deadline = time.monotonic() + 30  # a bound only: a loaded machine polls late
    while t.states.get("h1") != "draining":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    hap.command("set server triton/h1 state ready")
    watch.stop()
    assert t.capacity[-1]["watched"]["max_out"] >= 1 and t.capacity[-1]["ok"]
    # Prometheus does not answer: the analysis cannot judge, the canary goes out of the traffic
    t.settings = t.settings.__class__(**{**vars(t.settings), "analysis_seconds": 1, "step_seconds": 0.2})
    rolled = t.analyse(1, ["h1"])
    assert list(rolled) == ["h1"] and "could not read its figures" in rolled["h1"]
    assert Weights([hap.socket], "triton").current()["h1"] == 0 and t.halt
    t.after_batch(1, {"h1": SimpleNamespace(result="rolled back", detail="")})
    assert Weights([hap.socket], "triton").current() == {"h1": 1, "h2": 1, "h3": 1, "h4": 1}
    assert t.states.get("h1") == "rolled back"
    events = [e["event"] for e in journal.events()]
    assert events == ["capacity", "weights", "canary", "weights-restored"]
    report = Report("inv", "d", batches)
    t.finish(report)
    text = "\n".join(rollout_traffic.lines(report))
    assert "capacity  canary backend triton: 4 server(s), out now 0, batch 1" in text
    assert "canary    h1: 5.00% of the traffic (asked 5%)" in text and "verdict: roll back" in text


def test_weights_a_crash_left_are_put_back(hap, tmp_path):
    Weights([hap.socket], "triton").set({"h1": 1, "h2": 1, "h3": 9, "h4": 9})
    events = [{"event": "weights", "backend": "triton", "sockets": [hap.socket],
               "original": {"h1": 1, "h2": 1, "h3": 1, "h4": 1}}]
    said = []
    rollout_traffic.restore_from_journal(events, said.append)
    assert Weights([hap.socket], "triton").current() == {"h1": 1, "h2": 1, "h3": 1, "h4": 1}
    assert "put back HAProxy's weights of backend triton" in said[0]
    said.clear()
    rollout_traffic.restore_from_journal(events + [{"event": "weights-restored"}], said.append)
    assert said == []


def test_a_model_floor_counts_the_servers_of_that_model(hap, tmp_path):
    hosts = [host(n, **lb(hap.socket, rollout_min_available_models={"resnet": 2})) for n in ("h1", "h2", "h3")]
    batches = plan_batches([h.name for h in hosts], 0, 1)
    # h1 and h2 serve resnet, h3 does not: taking h1 out leaves one server of resnet
    t = rollout_traffic.Traffic(hosts, batches, 0, None,
                                models_of=lambda: {"h1": ["resnet"], "h2": ["resnet", "bert"], "h3": ["bert"]})
    why = t.start(tmp_path, None, lambda m: None, [h.name for h in hosts])
    assert why.startswith("capacity: batch 1 (h1) can never go out") and \
        "1 of the 2 server(s) serving resnet would serve, rollout_min_available_models['resnet'] = 2 needs 2" in why
    t.finish(Report("inv", "d", batches))


CANARY_ROLLOUT = r'''
import sys, time
from types import SimpleNamespace
sys.path.insert(0, sys.argv[2])
from tritonfleet import ROOT
from tritonfleet.fleet import probe
from tritonfleet.inventory import roster
from tritonfleet.fleet import rollout as ro
from tritonfleet.inventory.roster import FleetHost
from tritonfleet.fleet.rollout import engine
from tritonfleet.settings.defaults import DEFAULTS

data = {**DEFAULTS, "lb": "haproxy", "lb_haproxy_sockets": [sys.argv[1]], "rollout_metrics_listen": None,
        "canary_prometheus_url": "http://127.0.0.1:1", "fleet_workers": 1, "canary_watchdog_ttl": float(sys.argv[3])}
hosts = [FleetHost(n, ["t4"], dict(data)) for n in ("h1", "h2", "h3")]
roster.load_inventory = lambda *a, **k: hosts
probe.probe = lambda h, **k: SimpleNamespace(reachable=True, release="r0", unit="u0", version="v0", error="")


def run_pyinfra(inventory, deploy, targets, data, dry=False, **kw):
    if not dry:  # the canary's deploy: the share is set, the rollout is stopped here
        print("deploying", flush=True)
        time.sleep(120)
    return ro.PyinfraRun(0, {"results": {"failed_hosts": [], "operations": [
        {"name": "x", "no_change": list(targets)}]}}, "")


engine.workers.run_pyinfra = run_pyinfra
ro.rollout("inventory.py", str(ROOT / "deploys" / "models.py"), canary=1, batch="100%", canary_weight=5,
           echo=lambda m: print(m, flush=True))
'''


def _canary_rollout(hap, tmp_path, ttl: float = 60):
    """The rollout of CANARY_ROLLOUT in a process of its own, returned once the canary has its
    share (its deploy is running), with what it printed."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "canary_rollout.py"
    script.write_text(CANARY_ROLLOUT)
    root = str(Path(__file__).resolve().parents[3])
    proc = subprocess.Popen([sys.executable, str(script), hap.socket, root, str(ttl)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, "TRITONFLEET_LOG_DIR": str(tmp_path / "logs")})
    out = []
    deadline = time.monotonic() + 60
    while not out or out[-1].strip() != "deploying":
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError("".join(out))
        out.append(line)
    assert Weights([hap.socket], "triton").current() == {"h1": 1, "h2": 1, "h3": 9, "h4": 9}
    return proc, out


ORIGINAL = {"h1": 1, "h2": 1, "h3": 1, "h4": 1}


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_rollout_stopped_mid_canary_puts_the_weights_back(hap, tmp_path, sig):
    """A rollout process given SIGTERM (a cancelled CI job) or SIGINT while the canary has its
    share: HAProxy's weights are the original ones when it has exited, and the journal records it."""
    import signal

    proc, out = _canary_rollout(hap, tmp_path)
    try:
        proc.send_signal(getattr(signal, sig))
        rest = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert Weights([hap.socket], "triton").current() == ORIGINAL, "".join(out) + rest
    assert "putting the canary's weights back" in rest
    journal = next((tmp_path / "logs").rglob("journal.jsonl"))
    events = [e["event"] for e in Journal(journal).events()]
    assert "weights-restored" in events and "end" not in events  # --resume can go on
    log = next((tmp_path / "logs").rglob("watchdog.log"))
    time.sleep(1.5)  # the watchdog left without acting
    assert "putting back" not in log.read_text()


def _until(cond, timeout: float) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "not within the time"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_a_rollout_killed_mid_canary_has_its_weights_put_back_by_the_watchdog(hap, tmp_path):
    """SIGKILL (nothing in the rollout runs): the watchdog sees the process gone and puts the
    weights back, well within canary_watchdog_ttl."""
    import signal

    proc, out = _canary_rollout(hap, tmp_path, ttl=30)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    took = _until(lambda: Weights([hap.socket], "triton").current() == ORIGINAL, 10)
    assert took < 30
    log = next((tmp_path / "logs").rglob("watchdog.log")).read_text()
    assert "is gone" in log and "weights restored" in log


def test_a_silent_rollout_has_its_weights_put_back_after_the_ttl(hap, tmp_path):
    """A rollout stopped (SIGSTOP: alive, but no heartbeat): the weights go back once the
    heartbeat is older than canary_watchdog_ttl, not before."""
    import signal

    proc, out = _canary_rollout(hap, tmp_path, ttl=2)
    try:
        proc.send_signal(signal.SIGSTOP)
        time.sleep(1)
        assert Weights([hap.socket], "triton").current() != ORIGINAL
        _until(lambda: Weights([hap.socket], "triton").current() == ORIGINAL, 10)
        log = next((tmp_path / "logs").rglob("watchdog.log")).read_text()
        assert "has not renewed its heartbeat" in log
    finally:
        proc.kill()
        proc.wait()


def test_a_quarantined_host_of_a_batch_is_reported_held(hap):
    """A batch host whose server the quarantine holds (MAINT) is deployed and left out: its row
    says so; a drained or serving server is not reported held."""
    from tritonfleet.serving.drain import HAProxy as Balancer

    hosts = [host(n, **lb(hap.socket)) for n in ("h1", "h2", "h3")]
    t = rollout_traffic.Traffic(hosts, [["h1", "h2", "h3"]], 0, None)
    Balancer([hap.socket], "triton", "h2", hold=True).drain()
    hap.command("set server triton/h3 state drain")
    held = t.held(["h1", "h2", "h3"])
    assert list(held) == ["h2"] and "held out of rotation by the quarantine" in held["h2"] and "MAINT" in held["h2"]


def test_an_exception_in_a_batch_puts_the_weights_back(hap, tmp_path, monkeypatch):
    """Any exception out of a batch (the review: an uncaught error of the analysis) goes on up,
    after the weights are put back and the watchdog stopped."""
    from tritonfleet.fleet.rollout import engine

    data = lb(hap.socket, canary_prometheus_url="http://127.0.0.1:1")
    hosts = [host(n, **data) for n in ("h1", "h2", "h3")]
    t = rollout_traffic.Traffic(hosts, plan_batches(["h1", "h2", "h3"], 1, 1), 1, 0.05)
    assert t.start(tmp_path, Journal(tmp_path / "journal.jsonl"), lambda m: None, ["h1", "h2", "h3"]) == ""

    def batches(run, first):
        assert run.traffic.before_batch(1, ["h1"], "canary") == ""
        assert Weights([hap.socket], "triton").current() != ORIGINAL
        raise KeyError("data")

    monkeypatch.setattr(engine, "_batches", batches)
    said = []
    with pytest.raises(KeyError):
        engine._guarded_batches(SimpleNamespace(traffic=t, echo=said.append), 1)
    assert Weights([hap.socket], "triton").current() == ORIGINAL
    assert "putting the canary's weights back" in said[0]
    assert t._watchdog is None


def test_a_promoted_canary_is_still_judged_on_haproxys_counters(hap, tmp_path, monkeypatch):
    """Prometheus says promote; HAProxy's counters decide too: failures only HAProxy saw, or
    counters it cannot read, roll the canary back (out of the traffic at once)."""
    from tritonfleet.fleet.rollout import canary as cn

    data = lb(hap.socket, canary_prometheus_url="http://127.0.0.1:1")
    hosts = [host(n, **data) for n in ("h1", "h2", "h3")]
    monkeypatch.setattr(cn, "analyse", lambda *a, **k: cn.Result(cn.PROMOTE, "no regression", [], 0, 0))
    for counters, words in ([{"h1": (0, 0), "h2": (0, 0), "h3": (0, 0)}, {"h1": (100, 40), "h2": (100, 0),
                                                                          "h3": (100, 0)}], "HAProxy counted 40"), \
                           (["HAProxy at /x does not answer"], "could not read HAProxy's counters"):
        t = rollout_traffic.Traffic(hosts, plan_batches(["h1", "h2", "h3"], 1, 1), 1, 0.05)
        assert t.start(tmp_path, None, lambda m: None, ["h1", "h2", "h3"]) == ""
        assert t.before_batch(1, ["h1"], "canary") == ""
        reads = iter(counters * 2)
        monkeypatch.setattr(t, "_lb_counters", lambda reads=reads: next(reads))
        rolled = t.analyse(1, ["h1"])
        assert list(rolled) == ["h1"] and words in rolled["h1"], rolled
        assert Weights([hap.socket], "triton").current()["h1"] == 0
        t.finish(Report("inv", "d", [["h1"], ["h2", "h3"]]))
    # a sound canary by both: promoted
    t = rollout_traffic.Traffic(hosts, plan_batches(["h1", "h2", "h3"], 1, 1), 1, 0.05)
    assert t.start(tmp_path, None, lambda m: None, ["h1", "h2", "h3"]) == ""
    assert t.before_batch(1, ["h1"], "canary") == ""
    assert t.analyse(1, ["h1"]) == {}
    t.finish(Report("inv", "d", [["h1"], ["h2", "h3"]]))
    assert Weights([hap.socket], "triton").current() == ORIGINAL


def test_a_rollout_row_says_a_quarantined_host_was_deployed_but_left_out(hap, tmp_path, monkeypatch):
    """A batch with a host the quarantine holds: deployed (its pyinfra ran), left out of rotation,
    its report row saying so; the other hosts' rows say nothing of it."""
    from tritonfleet import ROOT
    from tritonfleet.fleet import probe
    from tritonfleet.fleet import rollout as ro
    from tritonfleet.fleet.rollout import engine
    from tritonfleet.inventory import roster
    from tritonfleet.serving.drain import HAProxy as Balancer

    hosts = [host(n, **lb(hap.socket, fleet_workers=1)) for n in ("h1", "h2", "h3")]
    monkeypatch.setenv("TRITONFLEET_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(roster, "load_inventory", lambda *a, **k: hosts)
    monkeypatch.setattr(probe, "probe", lambda h, **k: SimpleNamespace(
        reachable=True, release="r0", unit="u0", version="v0", error=""))
    monkeypatch.setattr(engine, "_gate_all", lambda run, names: {})
    monkeypatch.setattr(engine, "_versions", lambda hs, results: None)
    deployed = []

    def run_pyinfra(inventory, deploy, targets, data, dry=False, **kw):
        deployed.extend([] if dry else targets)
        return ro.PyinfraRun(0, {"results": {"failed_hosts": [], "operations": [
            {"name": "restart triton", "success": list(targets)}]}}, "")

    monkeypatch.setattr(engine.workers, "run_pyinfra", run_pyinfra)
    Balancer([hap.socket], "triton", "h2", hold=True).drain()  # the receiver's quarantine
    report = ro.rollout("inventory.py", str(ROOT / "deploys" / "models.py"), canary=1, batch="100%",
                        echo=lambda m: None)
    by = {r.host: r for r in report.hosts}
    assert sorted(deployed) == ["h1", "h2", "h3"]
    assert by["h2"].result == "updated" and "held out of rotation by the quarantine" in by["h2"].detail
    assert by["h1"].detail == by["h3"].detail == ""
