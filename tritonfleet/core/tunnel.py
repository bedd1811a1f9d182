"""A local TCP port forwarded to a port on a host, over an SSH connection that is already open
(a paramiko transport: pyinfra's own connection to the host), so the control machine reaches a
service the host's firewall opens to nobody else. Used through tritonfleet.serving.triton_http.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Any

from paramiko import SSHException


class SSHTunnel:
    """Forward 127.0.0.1:<random> to ``remote_port`` on the host over an open paramiko transport.
    ``channel_timeout``: seconds opening a channel, or sending into one, may wait for the host
    (its dead-link bound); a request through a dead tunnel then fails instead of hanging."""

    def __init__(
        self, transport: Any, remote_port: int, remote_host: str = "127.0.0.1", channel_timeout: float = 30
    ) -> None:
        self.transport, self.remote = transport, (remote_host, remote_port)
        self.channel_timeout = channel_timeout
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._open: list[Any] = []
        #: why the last channel could not be opened (the client's connection was closed): said in
        #: the gate's report next to the request that failed, instead of a bare closed connection
        self.error = ""
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, addr = self.sock.accept()
            except OSError:
                continue
            try:
                chan = self.transport.open_channel("direct-tcpip", self.remote, addr, timeout=self.channel_timeout)
                chan.settimeout(self.channel_timeout)
            except (SSHException, OSError, EOFError) as e:  # the host refused or the link is gone
                self.error = (
                    f"the SSH tunnel to {self.remote[0]}:{self.remote[1]} on the host could not open "
                    f"a channel: {type(e).__name__}: {e}"
                )
                client.close()
                continue
            self.error = ""
            self._open += [client, chan]
            threading.Thread(target=self._pipe, args=(client, chan), daemon=True).start()

    def _pipe(self, client: socket.socket, chan: Any) -> None:
        with contextlib.suppress(OSError, EOFError, ValueError):
            self._pump(client, chan)

    def _pump(self, client: socket.socket, chan: Any) -> None:
        with contextlib.closing(client), contextlib.closing(chan):
            while not self._stop.is_set():
                r, _, _ = select.select([client, chan], [], [], 0.5)
                if client in r:
                    data = client.recv(65536)
                    if not data:
                        return
                    chan.sendall(data)
                if chan in r:
                    data = chan.recv(65536)
                    if not data:
                        return
                    client.sendall(data)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for s in self._open:
            with contextlib.suppress(OSError, EOFError):
                s.close()
