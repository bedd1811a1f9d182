"""The health gate against a real tritonserver (the nvidia-pytriton binary, loopback ports)."""

from __future__ import annotations

import socket
import threading

import paramiko
import pytest

from tests.support.tritonproc import copy_repository, local_server
from tritonfleet.core import tunnel
from tritonfleet.serving import health
from tritonfleet_testbed.ports import free_port

MODELS = ["resnet50_onnx", "text_classifier_onnx"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("health")
    repo = copy_repository(work / "repo", kind_cpu=True)
    with local_server(repo, work) as srv:
        yield srv


def urls(srv):
    return f"http://127.0.0.1:{srv.http_port}", f"http://127.0.0.1:{srv.metrics_port}"


def test_healthy_server_passes(server):
    http, metrics = urls(server)
    res = health.wait_healthy(http, metrics, MODELS, timeout=30)
    assert res.ok, res.checks
    endpoints = [c.endpoint for c in res.checks]
    assert endpoints == [f"{http}/v2/health/live", f"{http}/v2/health/ready",
                         f"{http}/v2/models/resnet50_onnx/ready",
                         f"{http}/v2/models/text_classifier_onnx/ready", f"{metrics}/metrics"]


def test_missing_model_fails_naming_the_endpoint(server):
    http, metrics = urls(server)
    res = health.wait_healthy(http, metrics, MODELS + ["nosuch_model"], timeout=2, interval=0.5)
    assert not res.ok
    bad = res.first_failure
    assert bad.endpoint.endswith("/v2/models/nosuch_model/ready")
    assert "HTTP 400" in bad.detail or "HTTP 404" in bad.detail
    assert res.seconds >= 2  # bounded retries, then it gives up


def test_wrong_metrics_port_fails(server):
    http, _ = urls(server)
    res = health.check_once(http, http, MODELS)  # the HTTP port serves no /metrics
    assert not res.ok and res.first_failure.endpoint.endswith("/metrics")


def test_nothing_listening_fails_fast():
    port = free_port()
    res = health.wait_healthy(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}", MODELS,
                              timeout=1, request_timeout=1, interval=0.2)
    assert not res.ok and "no answer" in res.first_failure.detail


class _SSHServer(paramiko.ServerInterface):
    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username):
        return "none"

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        self.dest = destination
        return paramiko.OPEN_SUCCEEDED


def _serve_ssh(sock, server_iface, key, opened):
    conn, _ = sock.accept()
    t = paramiko.Transport(conn)
    t.add_server_key(key)
    t.start_server(server=server_iface)
    while t.is_active():
        chan = t.accept(timeout=0.5)
        if chan is None:
            continue
        dest = server_iface.dest
        opened.append(dest)
        up = socket.create_connection(dest)

        def pump(a, b):
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        if isinstance(s, socket.socket):
                            s.shutdown(socket.SHUT_RDWR)
                        s.close()
                    except (OSError, EOFError):
                        pass

        threading.Thread(target=pump, args=(chan, up), daemon=True).start()
        threading.Thread(target=pump, args=(up, chan), daemon=True).start()


def test_gate_through_an_ssh_tunnel(server):
    """health_via=ssh: the requests travel inside the host's SSH connection (direct-tcpip)."""
    host_key = paramiko.RSAKey.generate(2048)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    opened: list = []
    threading.Thread(target=_serve_ssh, args=(lsock, _SSHServer(), host_key, opened), daemon=True).start()
    client = paramiko.Transport(lsock.getsockname())
    client.connect()
    client.auth_none("root")
    tunnels = [tunnel.SSHTunnel(client, server.http_port), tunnel.SSHTunnel(client, server.metrics_port)]
    try:
        res = health.wait_healthy(f"http://127.0.0.1:{tunnels[0].port}",
                                  f"http://127.0.0.1:{tunnels[1].port}", MODELS, timeout=20)
    finally:
        for t in tunnels:
            t.close()
        client.close()
    assert res.ok, res.checks
    assert ("127.0.0.1", server.http_port) in opened and ("127.0.0.1", server.metrics_port) in opened


class _RefusingSSHServer(_SSHServer):
    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED  # sshd's AllowTcpForwarding no


def test_a_tunnel_that_cannot_open_a_channel_says_so_in_the_gate():
    """health_via=ssh to a host whose sshd refuses forwarding: the gate fails naming the refused
    channel, not only a connection the tunnel closed."""
    host_key = paramiko.RSAKey.generate(2048)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    threading.Thread(target=_serve_ssh, args=(lsock, _RefusingSSHServer(), host_key, []), daemon=True).start()
    client = paramiko.Transport(lsock.getsockname())
    client.connect()
    client.auth_none("root")
    settings = {"health_via": "ssh", "triton_http_port": 8000, "triton_metrics_port": 8002,
                "ssh_keepalive_interval": 5, "ssh_keepalive_count": 2, "health_timeout": 1,
                "health_request_timeout": 2}
    try:
        res = health.gate(settings, "127.0.0.1", MODELS, transport=client)
    finally:
        client.close()
    assert not res.ok
    detail = res.first_failure.detail
    assert "the SSH tunnel to 127.0.0.1:8000 on the host could not open a channel" in detail, detail
    assert "ChannelException" in detail, detail


def test_triton_cause_names_the_model_that_failed_to_load():
    from tritonfleet.serving.unit_watch import triton_cause

    journal = [
        "Dec 03 09:18:40 tb1-t4 docker[123]: I1203 09:18:40.100 1 server.cc:1] started",
        "Dec 03 09:18:40 tb1-t4 docker[123]: E1203 09:18:40.200 1 model_repository_manager.cc:1] Poll failed",
        "Dec 03 09:18:40 tb1-t4 docker[123]: E1203 09:18:40.300 1 model_lifecycle.cc:638] \"failed to load "
        "'text_classifier_onnx' version 1: Internal: model.onnx: external data weights.bin not found\"",
    ]
    assert triton_cause(journal) == ("failed to load 'text_classifier_onnx' version 1: Internal: model.onnx: "
                                     "external data weights.bin not found")
    assert triton_cause(journal[:2]) == "Poll failed"
    assert triton_cause(journal[:1]) == ""
