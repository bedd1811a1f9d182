"""Traffic canary and capacity rules on the testbed, with real components: Debian's HAProxy on this
machine's loopback in front of the deployed hosts, Debian's Prometheus scraping their Triton
metrics (1 s) and the rollout's state endpoint, a client loop of known size through HAProxy.

* an identical release at a 5% canary weight: of 10,000 requests the canary gets 5 +/- 1 points
  (its own Triton counters and HAProxy's answers agree), its state is in Prometheus and in
  `tritonfleet status`, a pause holds the verdict until `--continue`, the canary is promoted and
  the weights come back;
* a regression (a model that fails on token ids its vocabulary lacks; 2% of the client's requests
  carry one) at a 25% weight, with `rollout_max_unavailable` 25% over a backend of four servers
  (the three hosts and a local tritonserver) one of which is in maintenance when the rollout starts:
  a batch that can never pass is refused first with no host changed; then the canary waits for the
  server to come back, is analysed, rolled back and the rollout halts; an independent reading of
  HAProxy's stats every second never sees more than one server out.

The 10- and 20-run figures are bench/run.py canary's (docs/fleet-operations.md). Each test leaves
the hosts as it found them (the regression is rolled back; the identical release changes nothing).
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.support.canary_load import (
    Client,
    Prometheus,
    StatReader,
    regression_repository,
    wait_for_state,
)
from tests.support.haproxy import HAProxy
from tests.support.testbed import INVENTORY, TRITONFLEET, env, live_release, success_count
from tests.support.tritonproc import copy_repository, local_server
from tritonfleet import ROOT
from tritonfleet.serving.drain import HAProxy as Runtime
from tritonfleet.serving.haproxy_weights import Weights
from tritonfleet_testbed.ports import free_port

SERVER_HEADER = ["http-response set-header X-Server %[srv_name]"]


def new_dir(path):
    path.mkdir(parents=True)
    return path


def start_rollout(log_dir, *args: str) -> subprocess.Popen:
    e = dict(env(), TRITONFLEET_LOG_DIR=str(log_dir))
    return subprocess.Popen([TRITONFLEET, "rollout", INVENTORY, "deploys/models.py", *args, "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e,
                            stdin=subprocess.DEVNULL)


def finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[int, dict, str]:
    out, _ = proc.communicate(timeout=timeout)
    start = out.find("\n{")
    try:
        return proc.returncode, json.loads(out[start + 1:]), out
    except ValueError:
        return proc.returncode, {}, out


@pytest.fixture(scope="module")
def prometheus(deployed, tmp_path_factory):
    """One Prometheus for the module: the hosts' Triton metrics and the rollouts' state endpoint
    (every rollout here serves it on the same port, one after the other)."""
    port = free_port()
    prom = Prometheus(tmp_path_factory.mktemp("prom"), INVENTORY, port, env())
    try:
        yield prom, port
    finally:
        prom.stop()


def lb_data(sock: str, prom: Prometheus, port: int, **more) -> list[str]:
    data = {"lb": "haproxy", "lb_haproxy_sockets": json.dumps([sock]), "canary_prometheus_url": prom.url,
            "rollout_metrics_listen": f"127.0.0.1:{port}", "canary_step_seconds": 2, **more}
    return [a for k, v in data.items() for a in ("--data", f"{k}={v}")]


def test_five_percent_canary_of_an_identical_release_is_promoted(deployed, prometheus, tmp_path):
    testbed, _, _ = deployed
    hosts = testbed.hosts
    canary = hosts[0]
    prom, port = prometheus
    with HAProxy(new_dir(tmp_path / "hap"), [(h.name, f"{h.address}:8000") for h in hosts], extra=SERVER_HEADER) as hap:
        for h in hosts:
            Runtime([hap.socket], "triton", h.name).wait_serving(30)
        before = {h.name: success_count(h.address, "text_classifier_onnx") for h in hosts}
        proc = start_rollout(tmp_path / "rollouts", "--canary-weight", "5", "--batch", "2", *lb_data(
            hap.socket, prom, port, canary_analysis_seconds=30, canary_min_requests=300,
            canary_max_extensions=0))
        wait_for_state(tmp_path / "rollouts", canary.name, "analysing", 120, proc)
        # at most 400 a second: the 10,000 requests span about 25 s of the 30 s window, so the analysis
        # has requests in most of its 2 s steps (it needs 5 of each side). Unpaced, a quiet machine sent
        # them in 8 s: 4 steps, "not enough to judge", rolled back (a CI run)
        client = Client(hap.url, 10_000, rate=400, threads=12, max_seconds=300).start()
        # pause: the verdict waits for --continue (the weights stay: the client's 10,000 requests
        # all go out with the canary's share, however long the loaded machine takes)
        paused = subprocess.run([TRITONFLEET, "rollout", "--pause"], cwd=ROOT, capture_output=True, text=True,
                                env=dict(env(), TRITONFLEET_LOG_DIR=str(tmp_path / "rollouts")))
        assert paused.returncode == 0, paused.stdout + paused.stderr
        # the state, from the rollout's own endpoint through Prometheus, and in status
        expr = f'tritonfleet_rollout_host_state{{host="{canary.name}", state="analysing"}} == 1'
        deadline = time.monotonic() + 60
        while not prom.query(expr):
            assert time.monotonic() < deadline, ("the canary's state is not in Prometheus",
                                                 prom.query('up{job="tritonfleet-rollout"}'))
            time.sleep(0.5)
        res = subprocess.run([TRITONFLEET, "status", INVENTORY, "--json"], cwd=ROOT, capture_output=True,
                             text=True, env=dict(env(), TRITONFLEET_LOG_DIR=str(tmp_path / "rollouts")))
        rows = {r["host"]: r for r in json.loads(res.stdout)}
        assert rows[canary.name]["rollout"] == "analysing (paused)"
        assert {rows[h.name]["rollout"] for h in hosts[1:]} == {"pending (paused)"}
        client.join(300)
        assert client.done == 10_000, (client.done, client.seconds)
        after = {h.name: success_count(h.address, "text_classifier_onnx") for h in hosts}
        # past the window the rollout holds: paused in its state file and in Prometheus
        state = wait_for_state(tmp_path / "rollouts", canary.name, "analysing", 5)
        deadline = time.monotonic() + 90
        while not state["paused"]:
            assert proc.poll() is None and time.monotonic() < deadline, "the rollout did not hold"
            time.sleep(0.5)
            state = wait_for_state(tmp_path / "rollouts", canary.name, "analysing", 5)
        deadline = time.monotonic() + 10
        while not prom.query("tritonfleet_rollout_paused == 1"):
            assert time.monotonic() < deadline, "the pause is not in Prometheus"
            time.sleep(0.5)
        cont = subprocess.run([TRITONFLEET, "rollout", "--continue"], cwd=ROOT, capture_output=True, text=True,
                              env=dict(env(), TRITONFLEET_LOG_DIR=str(tmp_path / "rollouts")))
        assert cont.returncode == 0, cont.stdout + cont.stderr
        rc, report, out = finish(proc)
        weights = Weights([hap.socket], "triton").current()
    assert rc == 0, (report.get("canary", {}).get("why"), out[-4000:])
    assert report["canary"]["verdict"] == "promote", report["canary"]
    assert [h["result"] for h in report["hosts"]] == ["unchanged"] * 3
    assert weights == {h.name: 1 for h in hosts}  # put back
    # the figure: the canary's part of the 10,000 requests, by HAProxy's answers and by Triton's counters
    served = {n: after[n] - before[n] for n in after}
    by_triton = served[canary.name] / sum(served.values())
    by_lb = client.by_server[canary.name] / client.done
    share = report["canary"]["share"]
    print(f"\ncanary share figures: {json.dumps({'asked': 0.05, 'weights': report['canary']['weights'], 'share': share, 'requests': client.done, 'seconds': round(client.seconds, 1), 'by_haproxy': by_lb, 'by_triton': by_triton, 'failures': len(client.failures), 'looks': [lk['canary']['requests'] for lk in report['canary']['looks']]})}")
    assert client.failures == []
    assert sum(served.values()) >= 10_000  # the health gate's own inferences besides
    assert abs(by_triton - 0.05) <= 0.01 and abs(by_lb - 0.05) <= 0.01, (by_triton, by_lb)
    assert abs(share - 0.05) < 0.005
    [look] = report["canary"]["looks"]
    assert look["canary"]["requests"] >= 300 and look["canary"]["error_ratio"] == 0
    # the latency was compared with a host of the old release under the canary's load
    assert report["canary"]["matched"] == [report["batches"][1][0]] and look["matched"]["requests"] >= 300


def test_regression_is_rolled_back_and_capacity_holds(deployed, prometheus, tmp_path):
    testbed, _, _ = deployed
    hosts = testbed.hosts
    canary = hosts[0]
    prom, port = prometheus
    release_before = {h.name: live_release(h) for h in hosts}
    bad = regression_repository(tmp_path / "regression")
    local_repo = copy_repository(tmp_path / "local-repo", kind_cpu=True)
    with local_server(local_repo, tmp_path) as local, \
            HAProxy(new_dir(tmp_path / "hap"), [(h.name, f"{h.address}:8000") for h in hosts]
                    + [("local", local.url)], extra=SERVER_HEADER) as hap:
        for name in [h.name for h in hosts] + ["local"]:
            Runtime([hap.socket], "triton", name).wait_serving(30)
        rules = {"rollout_max_unavailable": "25%"}  # 4 servers: one out at most
        # 1. a batch of two can never pass: refused before any host is changed
        proc = start_rollout(tmp_path / "refused", "--canary", "0", "--batch", "2",
                             *lb_data(hap.socket, prom, port, **rules))
        rc, report, out = finish(proc)
        assert rc == 1 and "can never go out" in report["halted"] and "allows 1" in report["halted"], out[-3000:]
        assert [h["result"] for h in report["hosts"]] == ["not touched"] * 3
        # 2. the regression at a 25% weight, the local server in maintenance at the start
        hap.command("set server triton/local state maint")
        with StatReader(hap.command) as stats:
            client = Client(hap.url, 20_000, rate=50, threads=8, poison=0.02, max_seconds=400).start()
            proc = start_rollout(tmp_path / "rollouts", "--canary-weight", "25", "--batch", "1", "--data",
                                 f"model_repository={bad}", *lb_data(
                                     hap.socket, prom, port, canary_analysis_seconds=25, canary_max_extensions=3,
                                     canary_min_requests=150, **rules))
            deadline = time.monotonic() + 120
            while True:  # the canary batch is up (batch 1 in the state file): it waits for capacity
                f = next((tmp_path / "rollouts").glob("*/state.json"), None)
                state = json.loads(f.read_text()) if f else {}
                if state.get("batch") == 1:
                    break
                assert proc.poll() is None and time.monotonic() < deadline, "the rollout did not reach its canary"
                time.sleep(0.2)
            time.sleep(5)
            assert json.loads(f.read_text())["hosts"][canary.name]["state"] == "pending"
            hap.command("set server triton/local state ready")
            rc, report, out = finish(proc)
            time.sleep(2)
            client.stop()
    assert rc == 1, out[-4000:]
    cn = report["canary"]
    figures = {"verdict": cn["verdict"], "why": cn["why"][:200],
               "decided_after_s": round(cn["decided"] - cn["analysis_start"], 1),
               "rolled_back_after_s": round(cn["rolled_back"] - cn["analysis_start"], 1),
               "looks": [(lk["canary"]["requests"], lk["canary"]["error_ratio"]) for lk in cn["looks"]],
               "most_out": stats.most_out, "samples": len(stats.samples),
               "capacity": [(c["label"], c.get("waited_s"), c.get("watched", {}).get("max_out")) for c in report["capacity"]],
               "client": {"sent": client.done, "failed_by_server": dict(client.failed_by_server)}}
    print(f"\ncanary regression figures: {json.dumps(figures)}")
    assert cn["verdict"] == "roll back" and "error ratio" in cn["why"], cn
    assert "canary analysis" in report["halted"] or "failure(s)" in report["halted"]
    results = {h["host"]: h["result"] for h in report["hosts"]}
    assert results == {canary.name: "rolled back", hosts[1].name: "not touched", hosts[2].name: "not touched"}
    assert {h.name: live_release(h) for h in hosts} == release_before  # as found
    # the canary waited for the server in maintenance, then went; never more than one server out
    [cap] = [c for c in report["capacity"] if c["batch"] == 1]
    assert cap["ok"] and cap["waited_s"] >= 4, cap
    assert cap["watched"]["max_out"] == 1  # the rollout's own readings
    assert stats.most_out == 1 and len(stats.samples) >= 40, stats.samples[-5:]
    out = [names for _, _, names in stats.samples]
    assert ["local"] in out and [canary.name] in out  # each out in turn, never both
    # the errors the client saw came from the canary only
    assert set(client.failed_by_server) == {canary.name}, client.failed_by_server
    assert client.failed_by_server[canary.name] >= 1
