"""Loopback ports for test servers (tritonfleet_testbed/ports.py) and the tritonserver starter's
answer to a port someone else took (tritonfleet_testbed/localtriton.py).

Why: the validator's corpus starts 16 tritonservers at once (tests/unit/model_repo/test_validate.py).
One of them once found another's gRPC listener on the HTTP port it had been handed: its
readiness probe read HTTP/2 bytes (``BadStatusLine``) and the fixture failed."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet_testbed import localtriton, ports
from tritonfleet_testbed.localtriton import LocalTriton


class _Kernel:
    """Stands in for socket.socket in ports: bind(0) hands out ``offers`` in order."""

    def __init__(self, offers):
        self.offers = list(offers)

    def __call__(self, *a, **kw):
        kernel = self

        class _Sock:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def bind(self, addr):
                self.port = kernel.offers.pop(0)

            def getsockname(self):
                return ("127.0.0.1", self.port)

        return _Sock()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1024, 1040), min_size=1, max_size=60))
def test_a_port_is_never_handed_out_twice(offers):
    """Whatever the kernel repeats, this process hands out each port once, and only ports
    the kernel offered."""
    distinct = list(dict.fromkeys(offers))
    saved_socket, saved_issued = ports.socket.socket, dict(ports._issued)
    ports._issued.clear()
    ports.socket.socket = _Kernel(offers + [99999])  # type: ignore[misc]
    try:
        got = [ports.free_port() for _ in distinct]
    finally:
        ports.socket.socket = saved_socket  # type: ignore[misc]
        ports._issued.clear()
        ports._issued.update(saved_issued)
    assert got == distinct


def test_threads_at_once_get_distinct_real_ports():
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda _: ports.free_port(), range(96)))
    assert len(set(got)) == len(got)
    for port in got:  # and each was free: it binds
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def _grpc_like_listener(stop: threading.Event) -> tuple[socket.socket, int]:
    """A listener that answers any connection with HTTP/2 frame bytes, as gRPC does."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:  # read the request, answer a SETTINGS frame, close cleanly
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x7f\xff\xff\xff")
                    conn.shutdown(socket.SHUT_WR)
                    conn.recv(65536)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_a_taken_http_port_is_retried_on_new_ports(tmp_path, monkeypatch):
    """Handed a port that another server's gRPC holds, the starter does not take that server's
    bytes for its own answer: its tritonserver says the address is in use, and it starts again
    on new ports."""
    stop = threading.Event()
    srv, taken = _grpc_like_listener(stop)
    handed = iter([taken])
    monkeypatch.setattr(localtriton, "free_port", lambda: next(handed, None) or ports.free_port())
    (tmp_path / "repo").mkdir()
    try:
        with LocalTriton(tmp_path / "repo", model_control_mode="explicit") as triton:
            assert triton.ready
            assert triton.http_port != taken
            retried = triton.retried_logs
    finally:
        stop.set()
        srv.close()
    assert len(retried) == 1 and "in use" in retried[0].lower(), retried
