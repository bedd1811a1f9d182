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
