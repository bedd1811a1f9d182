"""The load-balancer drain (tritonfleet.serving.drain) against a real HAProxy (Debian's haproxy 2.6) on
loopback in front of two small HTTP servers, and a deploy on pyinfra's @fake connector behind it
(a server the quarantine holds stays out) (the hooks and the rest of the deploy's use of the
drain: tests/unit/serving/test_drain.py).
"""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.support.fakehost import run_fake
from tests.support.haproxy import HAProxy
from tests.unit.serving.test_drain import _marker_commands, _restart_and_ready, _service_responses
from tritonfleet.serving import drain


class Backend:
    """An HTTP server answering the health check at once and /slow after ``delay`` seconds."""

    def __init__(self, name: str, delay: float = 1.5):
        self.name, self.delay, self.hits = name, delay, 0

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                if self.path == "/slow":
                    outer.hits += 1
                    time.sleep(outer.delay)
                body = outer.name.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def lb(tmp_path):
    a, b = Backend("a"), Backend("b")
    with HAProxy(tmp_path, [("a", a.address), ("b", b.address)], check="/ready", inter="200ms") as hap:
        ha = drain.HAProxy([hap.socket], "triton", "a")
        ha.wait_serving(10)
        drain.HAProxy([hap.socket], "triton", "b").wait_serving(10)
        yield hap, ha, a, b
    a.close()
    b.close()


def test_drain_waits_for_the_request_in_flight_and_sends_no_new_ones(lb):
    hap, ha, a, b = lb
    s = requests.Session()
    # a long request on server a, in flight while it is drained
    slow = {}
    t = threading.Thread(target=lambda: slow.update(r=requests.get(hap.url + "/slow", timeout=10)))
    while True:  # round robin: send until one lands on a
        t = threading.Thread(target=lambda: slow.update(r=requests.get(hap.url + "/slow", timeout=10)))
        t.start()
        time.sleep(0.3)
        if ha.in_flight() == 1:
            break
        t.join()
    assert "set to drain" in ha.drain()
    st = ha.state()
    assert st.drained and not st.serving and st.status == "DRAIN" and st.sessions == 1
    t0 = time.monotonic()
    waited = ha.wait_idle(10)
    t.join()
    assert slow["r"].status_code == 200 and slow["r"].text == "a"  # the request in flight finished
    assert 0.5 < waited < 5 and time.monotonic() - t0 < 5
    assert ha.in_flight() == 0
    before = a.hits
    answers = {s.get(hap.url + "/fast", timeout=5).text for _ in range(8)}
    assert answers == {"b"} and a.hits == before  # drained: nothing new reaches a
    assert "already draining" in ha.drain()
    assert "set to ready" in ha.ready()
    ha.wait_serving(10)
    assert ha.state().serving and ha.ready() == ""  # ready again, and ready() is idempotent
    answers = {s.get(hap.url + "/fast", timeout=5).text for _ in range(8)}
    assert answers == {"a", "b"}


def test_an_operators_maintenance_is_left_alone(lb):
    hap, ha, _, _ = lb
    assert hap.command("set server triton/a state maint").strip() == ""
    assert "maintenance" in ha.drain() and ha.ready() == "" and "MAINT" in ha.held()
    st = ha.state()
    assert st.maintenance and not st.drained  # neither drained nor readied by tritonfleet
    assert ha.wait_serving(1)  # nothing to wait for: it gets no requests by the operator's will


def test_a_drained_server_whose_check_fails_is_not_reported_serving(lb):
    hap, ha, a, _ = lb
    ha.drain()
    a.close()  # Triton did not come back
    deadline = time.monotonic() + 10
    while not ha.state().status.startswith("DOWN"):  # HAProxy's check noticed (fall 2 x 200 ms)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    ha.ready()
    with pytest.raises(drain.DrainError, match=r"health check does not pass"):
        ha.wait_serving(1.5)


def test_wait_idle_gives_up_naming_what_is_in_flight(lb):
    hap, ha, a, _ = lb
    a.delay = 6
    threads = []
    while ha.in_flight() == 0:
        th = threading.Thread(target=lambda: requests.get(hap.url + "/slow", timeout=20))
        th.start()
        threads.append(th)
        time.sleep(0.3)
    ha.drain()
    with pytest.raises(drain.DrainError, match=r"1 request\(s\) still in flight after 1s \(lb_drain_timeout\)"):
        ha.wait_idle(1)
    for th in threads:
        th.join()


def test_haproxy_errors_name_backend_server_and_socket(lb, tmp_path):
    hap, _, _, _ = lb
    with pytest.raises(drain.DrainError, match=r"no server 'zz' in backend 'triton'"):
        drain.HAProxy([hap.socket], "triton", "zz").drain()
    with pytest.raises(drain.DrainError, match=r"no server 'a' in backend 'nope'"):
        drain.HAProxy([hap.socket], "nope", "a").state()
    with pytest.raises(drain.DrainError, match=r"cannot reach HAProxy's runtime API at .*missing.sock"):
        drain.HAProxy([str(tmp_path / "missing.sock")], "triton", "a").drain()
    with pytest.raises(drain.DrainError, match="plain words"):
        drain.HAProxy([hap.socket], "triton", "a/b")
    with pytest.raises(drain.DrainError, match="needs lb_haproxy_sockets"):
        drain.HAProxy([], "triton", "a")
    with pytest.raises(drain.DrainError, match="neither a socket path nor host:port"):
        drain.RuntimeAPI("nonsense").command("show info")


def test_a_held_server_stays_out_after_a_deploys_gate_and_its_own_drain_is_readied(lb, caplog):
    """HAProxy behind a @fake host: a server the quarantine holds (MAINT) is deployed and stays
    out after the gate, the run saying who holds it; a server this run drained is readied, its
    marker written and removed; an operator's drain stays; a cut run's marker is honoured; a
    converged run on a serving server sends nothing for any of it."""
    import logging

    from tritonfleet.serving.ops.lb import MARKER

    caplog.set_level(logging.INFO, logger="pyinfra")
    hap, ha, a, b = lb
    data = {"lb": "haproxy", "lb_haproxy_sockets": [hap.socket], "lb_haproxy_server": "a", "lb_drain_timeout": 10}
    restart = {**data, "triton_stop_timeout": 40}
    # 1. the quarantine's hold (the receiver's balancer is made with hold=True)
    quarantine = drain.HAProxy([hap.socket], "triton", "a", hold=True)
    assert "held in maintenance" in quarantine.drain()
    _, cmds, state = run_fake(_restart_and_ready(), _service_responses(True), restart)
    assert not state.failed_hosts and any(re.search(r"systemctl (re)?start triton", str(c)) for c in cmds)
    st = ha.state()
    assert st.maintenance and not st.serving
    assert "held out of rotation by the quarantine or an operator" in caplog.text and "not readied" in caplog.text
    assert _marker_commands(cmds) == []  # the deploy did not take it out
    assert "set to ready" in quarantine.ready()  # the receiver's release puts it back
    ha.wait_serving(10)
    # 2. serving: this run drains it, restarts, and readies it
    _, cmds, state = run_fake(_restart_and_ready(), _service_responses(True), restart)
    # readied: no drain or maintenance bit left (HAProxy's own check, every 200 ms with fall 2, can
    # miss a beat while this busy process runs the deploy: UP again is waited for, not assumed)
    assert not state.failed_hosts and not ha.state().admin, ha.state()
    ha.wait_serving(10)
    marks = _marker_commands(cmds)
    assert len(marks) == 2 and "umask 077" in marks[0] and "rm -f" in marks[1]
    # 3. an operator's drain, a converged run: not readied (the marker is read: none)
    assert hap.command("set server triton/a state drain").strip() == ""
    caplog.clear()
    _, cmds, state = run_fake(_restart_and_ready(), _service_responses(True), data)
    assert ha.state().drained and "an operator's drain" in caplog.text
    assert [c for c in _marker_commands(cmds) if "cat " in c]
    # 4. the same with a cut run's marker on the host: readied, the marker removed
    _, cmds, state = run_fake(_restart_and_ready(), {**_service_responses(True),
                                                     f"cat {MARKER}": "20261206T040000-1-abcdef root@ctl"}, data)
    assert ha.state().serving or ha.wait_serving(10)
    assert any("rm -f" in c for c in _marker_commands(cmds))
    # 5. converged and serving: nothing sent for the balancer
    _, cmds, state = run_fake(_restart_and_ready(), _service_responses(True), data)
    assert _marker_commands(cmds) == [] and not ha.state().admin, ha.state()  # not taken out
    ha.wait_serving(10)


def test_a_server_held_while_this_run_restarted_it_stays_out_and_loses_the_marker(lb, monkeypatch):
    """The receiver holds the server after this run drained it: the gate's ready leaves it held,
    and this run's marker goes (the holder's release readies it; no stale marker is left to
    ready an operator's later drain)."""
    from tritonfleet.serving.ops import lb as lb_ops

    hap, ha, a, b = lb
    real = drain.HAProxy.wait_idle

    def held_meanwhile(self, *args, **kw):  # the receiver's hold lands during the restart
        drain.HAProxy([hap.socket], "triton", "a", hold=True).drain()
        return real(self, *args, **kw)

    monkeypatch.setattr(drain.HAProxy, "wait_idle", held_meanwhile)
    _, cmds, state = run_fake(_restart_and_ready(), _service_responses(True),
                              {"lb": "haproxy", "lb_haproxy_sockets": [hap.socket], "lb_haproxy_server": "a",
                               "lb_drain_timeout": 10, "triton_stop_timeout": 40})
    assert not state.failed_hosts and ha.state().maintenance
    marks = _marker_commands(cmds)
    assert len(marks) == 2 and "umask 077" in marks[0] and marks[1] == f"rm -f {lb_ops.MARKER}"


def test_a_backend_read_at_once_is_each_server_as_its_own_read(tmp_path):
    """drain.backend_states (the quarantine receiver's one read a round) gives every server exactly
    the state HAProxy.state reads for it alone: serving, drained, in maintenance, down."""
    from tests.support.haproxy import ok_server

    with ok_server() as up:
        servers = [("a", up), ("b", up), ("c", up), ("d", "127.0.0.1:1")]
        with HAProxy(tmp_path, servers, check="/", inter="100ms") as hap:
            one = {n: drain.HAProxy([hap.socket], "triton", n) for n, _ in servers}
            one["a"].wait_serving(20)
            one["b"]._set("drain")
            one["c"]._set("maint")
            deadline = time.monotonic() + 20
            while not one["d"].state().status.startswith("DOWN") and time.monotonic() < deadline:
                time.sleep(0.1)
            apis = [drain.RuntimeAPI(hap.socket)]
            at_once = drain.backend_states(apis, "triton")
            assert set(at_once) == {"a", "b", "c", "d"}
            for n, lb in one.items():
                alone = lb.state()
                assert (at_once[n].status, at_once[n].admin, at_once[n].sessions) == \
                    (alone.status, alone.admin, alone.sessions), n
            assert at_once["a"].serving and at_once["b"].drained and at_once["c"].maintenance
            assert not at_once["d"].serving
            with pytest.raises(drain.DrainError, match="Can't find backend"):  # as its own read says
                drain.backend_states(apis, "nosuch")
