"""The load-balancer drain (tritonfleet.serving.drain) against a real HAProxy (Debian's haproxy 2.6) on
loopback in front of two small HTTP servers (the hooks and the deploy's use of the drain:
tests/unit/serving/test_drain.py).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.support.haproxy import HAProxy
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
