"""The one Triton endpoint client (tritonfleet.serving.triton_http): where a host answers, direct
or through SSH tunnels bounded by its dead-link bound, and HTTP sessions that never go through the
control machine's proxy. The health gate, the metrics reads, tune, the load test and the
performance gate all reach a host through it, and nothing else opens a tunnel or a session."""

from __future__ import annotations

import ast
import http.server
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from tritonfleet import ROOT
from tritonfleet.core import tunnel
from tritonfleet.serving import triton_http
from tritonfleet.settings.access import ConfigError

SETTINGS = {"health_via": "direct", "health_host": None, "triton_http_port": 8000, "triton_metrics_port": 8002,
            "triton_grpc_port": 8001, "ssh_keepalive_interval": 7, "ssh_keepalive_count": 4}


def getter(**over):
    data = {**SETTINGS, **over}
    return data


def test_direct_endpoints_use_health_host_else_the_address():
    with triton_http.endpoints(getter(), "10.0.0.5") as at:
        assert at == triton_http.Endpoints("http://10.0.0.5:8000", "http://10.0.0.5:8002", "")
    with triton_http.endpoints(getter(health_host="lb.example", triton_http_port=9000), "10.0.0.5", grpc=True) as at:
        assert at == triton_http.Endpoints("http://lb.example:9000", "http://lb.example:8002", "lb.example:8001")


def test_tunnels_carry_the_dead_link_bound_and_close(monkeypatch):
    made = []

    class Tunnel:
        def __init__(self, transport, port, channel_timeout=30):
            self.port, self.closed = 40000 + port, False
            made.append((transport, port, channel_timeout, self))

        def close(self):
            self.closed = True

    monkeypatch.setattr(triton_http, "SSHTunnel", Tunnel)
    with triton_http.endpoints(getter(health_via="ssh"), "h1", lambda: "the transport", grpc=True) as at:
        assert at == triton_http.Endpoints("http://127.0.0.1:48000", "http://127.0.0.1:48002", "127.0.0.1:48001")
        assert not any(t.closed for *_, t in made)
    # every tunnel (the load test's gRPC one too) fails after interval x count, as the host's link does
    assert [(tr, p, bound) for tr, p, bound, _ in made] == [("the transport", 8000, 28), ("the transport", 8002, 28),
                                                          ("the transport", 8001, 28)]
    assert all(t.closed for *_, t in made)


@pytest.mark.parametrize("over, transport, message", [
    ({"health_via": "telnet"}, None, "health_via must be 'direct' or 'ssh', not 'telnet'"),
    ({"health_via": "ssh"}, None, "health_via = 'ssh' needs the host's SSH connection"),
    ({"health_via": "ssh", "ssh_keepalive_count": 0}, lambda: None, "ssh_keepalive_count must be a whole number"),
])
def test_bad_settings_are_config_errors(over, transport, message):
    with pytest.raises(ConfigError, match=message), triton_http.endpoints(getter(**over), "h1", transport):
        pass


def test_a_real_tunnel_over_a_fake_transport_reaches_the_port():
    """core.tunnel forwards a local port through the transport's direct-tcpip channel."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def open_channel(kind, dest, origin, timeout=None):
        assert kind == "direct-tcpip" and dest == ("127.0.0.1", 8000) and timeout == 3
        return socket.create_connection(server.getsockname())

    tun = tunnel.SSHTunnel(SimpleNamespace(open_channel=open_channel), 8000, channel_timeout=3)
    try:
        with socket.create_connection(("127.0.0.1", tun.port), timeout=5) as c:
            peer, _ = server.accept()
            c.sendall(b"ping")
            assert peer.recv(4) == b"ping"
            peer.close()
    finally:
        tun.close()
        server.close()


def test_sessions_ignore_the_proxy_of_the_control_machine(monkeypatch):
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    # a proxy that does not exist: a session that honoured it would fail
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        with triton_http.session({"triton-key": "k"}) as s:
            r = s.get(f"http://127.0.0.1:{srv.server_address[1]}/", timeout=5)
            assert r.text == "ok" and s.headers["triton-key"] == "k"
    finally:
        srv.shutdown()


def _calls(path: Path) -> list[tuple[int, str]]:
    """(line, dotted callee) of every call in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            out.append((node.lineno, ast.unparse(node.func)))
    return out


#: modules that open sessions to servers that are not Triton (and why)
NOT_TRITON = {
    "tritonfleet/model_repo/http_store.py": "the model origin (an HTTP server the release is uploaded to)",
    "tritonfleet/fleet/rollout/canary.py": "Prometheus's HTTP API (the canary analysis reads Triton's counters from there)",
}


def test_only_the_one_client_opens_tunnels_and_sessions():
    found = []
    for p in sorted((ROOT / "tritonfleet").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel == "tritonfleet/serving/triton_http.py" or rel in NOT_TRITON:
            continue
        for line, func in _calls(p):
            if func.endswith("SSHTunnel") or func in ("requests.Session", "Session"):
                found.append(f"{rel}:{line}: {func}()")
    assert not found, "Triton endpoints reached around tritonfleet.serving.triton_http:\n" + "\n".join(found)
