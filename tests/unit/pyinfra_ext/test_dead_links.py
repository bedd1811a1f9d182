"""A host that stops answering, on this machine: the keepalive settings every SSH path gets
(pyinfra's connection, OpenSSH transfers, transfers over the connection, health tunnels). The same
on real hosts, with their packets dropped, is in testbed/test_faults.py."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tritonfleet.core import tunnel
from tritonfleet.pyinfra_ext import connection, transfer

# --------------------------------------------------------------------------- dead links


@pytest.fixture
def tcp_pair():
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    yield cli
    for s in (cli, conn, srv):
        s.close()


def test_sockets_give_up_on_a_silent_peer_after_interval_times_count(tcp_pair):
    assert connection.tune_socket(tcp_pair, 4, 5)
    opt = tcp_pair.getsockopt
    assert opt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert opt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 4
    assert opt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 4
    assert opt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 5
    # unacknowledged data (a keepalive, a transfer) for 20 s closes the connection
    assert opt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 20_000


def test_pyinfra_connections_get_the_hosts_keepalive(tcp_pair):
    calls = []
    transport = SimpleNamespace(sock=tcp_pair, set_keepalive=calls.append)
    host = SimpleNamespace(data={"ssh_keepalive_interval": 2, "ssh_keepalive_count": 3},
                           connector=SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport)))
    assert connection.tune_host(host)
    assert calls == [2]  # paramiko sends an SSH keepalive every 2 s
    assert tcp_pair.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 6000


@given(st.one_of(st.integers(-5, 10_000), st.text(max_size=6), st.floats(allow_nan=True), st.none()),
       st.one_of(st.integers(-5, 50), st.text(max_size=4), st.none()))
@example(float("inf"), None)  # once raised OverflowError instead of naming the tunable
@example(True, 3)
def test_keepalive_values_are_whole_numbers_of_at_least_one(interval, count):
    data = {"ssh_keepalive_interval": interval, "ssh_keepalive_count": count}
    try:
        got = connection.keepalive(data)
    except ValueError as e:
        assert "ssh_keepalive_" in str(e) and "group data" in str(e)
        return
    want = [connection.KEEPALIVE_INTERVAL if interval is None else interval,
            connection.KEEPALIVE_COUNT if count is None else count]
    assert got == (int(str(want[0])), int(str(want[1]))) and min(got) >= 1


def ssh_host(**data):
    from pyinfra.connectors.ssh import SSHConnector

    connector = SSHConnector.__new__(SSHConnector)
    connector.data = {"ssh_hostname": "10.0.0.5", "ssh_user": "root", **data}
    return SimpleNamespace(name="gpu1", connector=connector, data=data)


def test_openssh_transfers_end_when_the_host_stops_answering():
    argv = transfer.ssh_argv(ssh_host(ssh_keepalive_interval=7, ssh_keepalive_count=2), "tar -x")
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert {"ServerAliveInterval=7", "ServerAliveCountMax=2", "ConnectTimeout=14"} <= set(opts)
    assert argv[-2:] == ["10.0.0.5", "tar -x"]
    with pytest.raises(transfer.TransferError, match="gpu1: ssh_keepalive_count must be"):
        transfer.ssh_argv(ssh_host(ssh_keepalive_count="three"), "true")


class SilentChannel:
    """A paramiko channel whose host stopped taking data (its window never reopens)."""

    def __init__(self):
        self.closed = False
        self.status_event = threading.Event()
        self.timeouts = []

    def settimeout(self, t):
        self.timeouts.append(t)

    def exec_command(self, cmd):
        pass

    def exit_status_ready(self):
        return False

    def send(self, data):
        time.sleep(0.05)
        raise TimeoutError

    def shutdown_write(self):
        pass

    def close(self):
        self.closed = True


def test_a_transfer_over_the_connection_gives_up_after_the_bound(tmp_path):
    chan = SilentChannel()
    opened = {}

    def open_session(**kw):
        opened.update(kw)
        return chan

    transport = SimpleNamespace(open_session=open_session, is_active=lambda: True)
    host = SimpleNamespace(name="gpu1", data={"ssh_keepalive_interval": 1, "ssh_keepalive_count": 1},
                           connector=SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport)))
    src = tmp_path / "data"
    src.write_bytes(os.urandom(1 << 16))
    t0 = time.monotonic()
    rc, err = transfer._over_connection(host, open(src, "rb"), "tar -x")
    took = time.monotonic() - t0
    assert rc == -1 and b"no answer from the host (the host took no data for 1s" in err
    assert b"ssh_keepalive_interval x ssh_keepalive_count = 1s" in err
    assert took < 30 and opened["timeout"] == 1 and chan.timeouts == [1]


def test_health_tunnels_bound_their_channels():
    opened = []

    class Chan:
        def settimeout(self, t):
            opened.append(("settimeout", t))

        def fileno(self):
            raise OSError

        def close(self):
            pass

    transport = SimpleNamespace(open_channel=lambda *a, **kw: opened.append(("open", kw.get("timeout"))) or Chan())
    tun = tunnel.SSHTunnel(transport, 8000, channel_timeout=6)
    try:
        socket.create_connection(("127.0.0.1", tun.port), timeout=5).close()
        deadline = time.monotonic() + 10
        while len(opened) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        tun.close()
    assert opened[:2] == [("open", 6), ("settimeout", 6)]


def _resolved_kex(argv: list[str]) -> list[str]:
    """The key exchange list OpenSSH itself makes of ``argv``'s options (``ssh -G``: the resolved
    configuration, nothing is connected)."""
    opts = argv[1 : argv.index("--")]
    out = subprocess.run(["ssh", "-G", *opts, "10.0.0.5"], capture_output=True, text=True, check=True).stdout
    return next(ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("kexalgorithms ")).split(",")


def test_the_lock_holder_offers_curve25519_first_and_transfers_keep_openssh_s_default():
    from tritonfleet.pyinfra_ext import hostlock

    host = ssh_host()
    holder = hostlock.Holder(host, wait=5, interval=5, count=3, holder="test")
    first = hostlock.HOLDER_KEX_FIRST.split(",")
    default = _resolved_kex(transfer.ssh_argv(host, "tar -x"))
    # curve25519 first, then the rest of OpenSSH's own list in its order (a server without
    # curve25519 picks from it)
    assert _resolved_kex(holder.argv("ssh")) == first + [a for a in default if a not in first]
    assert set(first) <= set(default)  # this OpenSSH knows them
