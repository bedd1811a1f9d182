"""Each host's state in a running rollout (tritonfleet.fleet.rollout.state): the state file, the
metrics it serves (parsed with prometheus_client's own parser, and scraped by Debian's Prometheus
in tests/testbed/test_canary.py), pause and continue, and what `tritonfleet status` shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import requests
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from tritonfleet.cli import fleet as cli_fleet
from tritonfleet.core.errors import TritonfleetError, UsageError
from tritonfleet.fleet.rollout import state as rs
from tritonfleet_testbed.ports import free_port


@pytest.fixture
def base(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONFLEET_LOG_DIR", str(tmp_path))
    return tmp_path


def _metrics(url: str) -> dict[tuple, float]:
    text = requests.get(url, timeout=5).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_states_file_and_metrics(base):
    d = base / "20260101-000000"
    d.mkdir()
    st = rs.HostStates(d, ["tb1", "tb2"], echo=lambda m: None)
    port = free_port()
    said = st.serve(f"127.0.0.1:{port}")
    assert said == f"rollout state metrics on http://127.0.0.1:{port}/metrics"
    try:
        st.set(["tb1"], "draining")
        assert json.loads((d / rs.STATE_FILE).read_text())["hosts"]["tb1"]["state"] == "draining"  # at once
        st.update(batch=1, canary_share=0.05)
        data = json.loads((d / rs.STATE_FILE).read_text())
        assert data["hosts"]["tb1"]["state"] == "draining" and data["hosts"]["tb2"]["state"] == "pending"
        assert data["pid"] == os.getpid() and data["listen"] == f"127.0.0.1:{port}"
        m = _metrics(f"http://127.0.0.1:{port}/metrics")
        rollout = ("rollout", d.name)
        for state in rs.STATES:
            assert m[("tritonfleet_rollout_host_state", (("host", "tb1"), rollout, ("state", state)))] == \
                (1.0 if state == "draining" else 0.0)
        assert m[("tritonfleet_rollout_batch", (rollout,))] == 1.0
        assert m[("tritonfleet_rollout_canary_share", (rollout,))] == 0.05
        assert m[("tritonfleet_rollout_paused", (rollout,))] == 0.0
        with pytest.raises(ValueError):
            st.set(["tb1"], "sleeping")
        # a second rollout on the same port: told, and it goes on without the endpoint
        (base / "x").mkdir()
        other = rs.HostStates(base / "x", ["tb1"], echo=lambda m: None)
        assert "cannot listen on" in other.serve(f"127.0.0.1:{port}") and other.listen == ""
        other.close()
    finally:
        st.close()
    assert json.loads((d / rs.STATE_FILE).read_text())["ended"] is True
    with pytest.raises(requests.RequestException):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    with pytest.raises(UsageError, match="address:port"):
        rs.HostStates(d, ["a"]).serve("localhost")


def test_pause_holds_until_continue(base):
    d = base / "r1"
    d.mkdir()
    said = []
    st = rs.HostStates(d, ["tb1"], echo=said.append)
    assert rs.pause(None) == f"pausing the rollout in {d}: it holds before its next batch or canary verdict"
    assert rs.host_column() == {"tb1": "pending (paused)"}
    held = {}

    def hold():
        t0 = time.monotonic()
        st.hold("before batch 2/3")
        held["s"] = time.monotonic() - t0

    t = threading.Thread(target=hold)
    t.start()
    time.sleep(1.5)
    assert t.is_alive() and json.loads((d / rs.STATE_FILE).read_text())["paused"] is True
    assert rs.unpause(str(d)) == f"the rollout in {d} goes on"
    t.join(5)
    assert not t.is_alive() and held["s"] >= 1.4
    assert said[0] == "paused before batch 2/3: `tritonfleet rollout --continue` goes on"
    assert json.loads((d / rs.STATE_FILE).read_text())["paused"] is False
    with pytest.raises(TritonfleetError, match="is not paused"):
        rs.unpause(str(d))
    st.close()
    with pytest.raises(UsageError, match="no running rollout"):
        rs.pause(None)


def test_status_column_names_dead_and_newest_rollouts(base):
    # a rollout whose process died (a pid that is gone), and a newer running one with tb2 only
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    old = base / "old"
    old.mkdir()
    (old / rs.STATE_FILE).write_text(json.dumps({"pid": int(dead.stdout), "ended": False, "paused": False,
                                                 "hosts": {"tb1": {"state": "updating"}, "tb2": {"state": "done"}}}))
    time.sleep(0.05)
    new = base / "new"
    new.mkdir()
    st = rs.HostStates(new, ["tb2"], echo=lambda m: None)
    st.set(["tb2"], "analysing")
    assert rs.host_column() == {"tb2": "analysing", "tb1": "updating (rollout died: --resume)"}
    st.close()
    assert rs.host_column() == {"tb1": "updating (rollout died: --resume)", "tb2": "done (rollout died: --resume)"}


def test_status_table_has_the_column_only_during_a_rollout():
    from tritonfleet.fleet.probe import HostStatus

    rows = [HostStatus("tb1", "10.0.0.1", "T4", reachable=True), HostStatus("tb2", "10.0.0.2", "T4", reachable=True)]
    plain = cli_fleet.status_table(rows)
    assert "ROLLOUT" not in plain
    table = cli_fleet.status_table(rows, {"tb1": "analysing"}).splitlines()
    head = table[0].split()
    assert head[-2:] == ["ROLLOUT", "DRIFT"]
    assert table[1].split()[-2:] == ["analysing", "none"] and table[2].split()[-2:] == ["-", "none"]


def test_pause_and_continue_commands(base):
    from tritonfleet.cli import main

    d = base / "r2"
    d.mkdir()
    st = rs.HostStates(d, ["tb1"], echo=lambda m: None)
    run = CliRunner().invoke(main, ["rollout", "--pause"])
    assert run.exit_code == 0 and "pausing the rollout" in run.output and (d / rs.PAUSE_FILE).exists()
    run = CliRunner().invoke(main, ["rollout", "--continue", "--journal", str(d)])
    assert run.exit_code == 0 and not (d / rs.PAUSE_FILE).exists()
    run = CliRunner().invoke(main, ["rollout", "--continue"])  # a run that failed: exit status 1
    assert run.exit_code == 1 and "is not paused" in run.output
    run = CliRunner().invoke(main, ["rollout", "--pause", "inv.py"])  # bad input: exit status 2
    assert run.exit_code == 2 and "take no INVENTORY" in run.output
    st.close()


def test_the_metrics_endpoint_changes_nothing_whatever_it_is_sent(base):
    """The state endpoint is read only (docs/security.md, threat model): generated requests of any
    method, path and body, oversized and half-sent ones, change no host's state and the endpoint
    goes on answering."""
    import socket

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as stn

    d = base / "20260101-000001"
    d.mkdir()
    st = rs.HostStates(d, ["tb1", "tb2"], echo=lambda m: None)
    port = free_port()
    st.serve(f"127.0.0.1:{port}")
    st.set(["tb1"], "gating")
    before = st.snapshot()
    url = f"http://127.0.0.1:{port}"
    stuck = socket.create_connection(("127.0.0.1", port))  # a request that never ends
    stuck.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{")
    try:
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(method=stn.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
               path=stn.sampled_from(["/", "/metrics", "/pause", "/v1/hosts/tb1/state", "/../state.json"]),
               body=stn.binary(max_size=2048))
        def hostile(method, path, body):
            try:
                requests.request(method, url + path, data=body, timeout=5,
                                 headers={"Content-Type": "application/json"})
            except requests.RequestException:
                pass
            assert st.snapshot()["hosts"] == before["hosts"]

        hostile()
        big = requests.post(url + "/metrics", data=b"x" * (4 << 20), timeout=10)
        assert big.status_code < 500 or big.status_code == 405
        m = _metrics(url + "/metrics")
        assert m[("tritonfleet_rollout_host_state", (("host", "tb1"), ("rollout", d.name), ("state", "gating")))] == 1.0
        assert json.loads((d / rs.STATE_FILE).read_text())["hosts"] == before["hosts"]
        assert not (d / rs.PAUSE_FILE).exists()
    finally:
        stuck.close()
        st.close()
