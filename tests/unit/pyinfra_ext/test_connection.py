"""TCP_NODELAY on the SSH connections: the socket option itself, the pyinfra state hook, and
(on the testbed) a real pyinfra run and the fleet commands' connections."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from tritonfleet.pyinfra_ext import connection


@pytest.fixture
def tcp_pair():
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    yield cli
    for s in (cli, conn, srv):
        s.close()


def nodelay(sock) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def fake_host(sock, connected=True):
    transport = SimpleNamespace(sock=sock)
    client = SimpleNamespace(get_transport=lambda: transport)
    return SimpleNamespace(connected=connected, connector=SimpleNamespace(client=client))


def test_tune_socket_sets_nodelay_and_keepalive(tcp_pair):
    assert nodelay(tcp_pair) == 0
    assert connection.tune_socket(tcp_pair)
    assert nodelay(tcp_pair) == 1
    assert tcp_pair.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1


def test_non_tcp_transports_are_left_alone():
    a, b = socket.socketpair()
    try:
        assert not connection.tune_socket(a)  # a ProxyCommand-like pipe
    finally:
        a.close()
        b.close()
    assert not connection.tune_socket(object())
    assert not connection.tune_host(SimpleNamespace(connector=SimpleNamespace()))  # not ssh


def test_an_idle_tuned_connection_wakes_up_rarely_and_still_works_and_closes_at_once(tmp_path):
    """paramiko polls an idle connection every 0.1 s; a tuned one every IDLE_POLL s, and it still
    runs commands, sends keepalives, and closing it returns at once."""
    import threading
    import time

    import paramiko

    key = paramiko.ECDSAKey.generate(bits=256)
    srv = socket.create_server(("127.0.0.1", 0))

    class Server(paramiko.ServerInterface):
        def check_auth_publickey(self, username, key):
            return paramiko.AUTH_SUCCESSFUL

        def get_allowed_auths(self, username):
            return "publickey"

        def check_channel_request(self, kind, chanid):
            return paramiko.OPEN_SUCCEEDED

        def check_channel_exec_request(self, channel, command):
            def answer():
                channel.sendall(b"ok\n")
                channel.send_exit_status(0)
                channel.close()
            threading.Timer(0.05, answer).start()
            return True

    def serve():
        conn, _ = srv.accept()
        t = paramiko.Transport(conn)
        t.add_server_key(key)
        t.start_server(server=Server())

    threading.Thread(target=serve, daemon=True).start()
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", srv.getsockname()[1], username="u", pkey=paramiko.ECDSAKey.generate(bits=256),
                   look_for_keys=False, allow_agent=False, auth_timeout=5)
    try:
        host = SimpleNamespace(connected=True, data={"ssh_keepalive_interval": 1},
                               connector=SimpleNamespace(client=client))
        transport = client.get_transport()
        wakeups = []
        real = transport.packetizer._check_keepalive
        transport.packetizer._check_keepalive = lambda: wakeups.append(time.monotonic()) or real()
        time.sleep(1.0)
        before = len(wakeups)
        assert before >= 5  # paramiko's own 0.1 s poll
        assert connection.tune_host(host)
        time.sleep(0.3)  # the poll in progress ends
        wakeups.clear()
        sent = transport.packetizer._Packetizer__sent_packets
        time.sleep(3.2)
        assert len(wakeups) <= 3.2 / connection.IDLE_POLL + 1, wakeups
        assert transport.packetizer._Packetizer__sent_packets > sent  # keepalives still go out
        _, out, _ = client.exec_command("anything")
        assert out.read() == b"ok\n"
    finally:
        t0 = time.monotonic()
        client.close()
        assert time.monotonic() - t0 < 0.3  # close returns at once
        # its thread ends at its next wake-up (IDLE_POLL); the bound leaves room for a loaded
        # machine, where the thread may wait for a core well past its wake-up
        transport.join(connection.IDLE_POLL + 10)
        assert not transport.is_alive()
        srv.close()


def test_tune_state_tunes_connected_hosts_and_later_connections(tcp_pair):
    from pyinfra.api.state import BaseStateCallback

    handlers = []
    later = socket.create_connection(tcp_pair.getpeername())
    try:
        now, waiting = fake_host(tcp_pair), fake_host(later, connected=False)
        state = SimpleNamespace(inventory=[now, waiting], add_callback_handler=handlers.append)
        assert connection.tune_state(state) == 1
        assert nodelay(tcp_pair) == 1 and nodelay(later) == 0
        assert connection.tune_state(state) == 1 and len(handlers) == 1  # registered once
        assert isinstance(handlers[0], BaseStateCallback)
        handlers[0].host_connect(state, waiting)  # pyinfra calls this after each connect
        assert nodelay(later) == 1
    finally:
        later.close()
