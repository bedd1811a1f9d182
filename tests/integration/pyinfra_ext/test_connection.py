"""An idle tuned SSH connection against a paramiko server on loopback, with its real waits: it wakes up
rarely, still works, and closes at once (the rest: tests/unit/pyinfra_ext/test_connection.py).
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

from tritonfleet.pyinfra_ext import connection


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
