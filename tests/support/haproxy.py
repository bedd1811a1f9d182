"""A real HAProxy (Debian's package) for tests: on loopback, its runtime API on a unix socket in a
temporary directory, started in the foreground and stopped by its process id."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tritonfleet.serving.haproxy_config import traffic_lines

CONFIG = """\
global
  stats socket {sock} mode 600 level admin
  maxconn 512
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
frontend fe
  bind 127.0.0.1:{port}
  default_backend {backend}
backend {backend}
  balance {balance}
  option httpchk GET {check}
  default-server check inter {inter} fall 2 rise 2
{extra}{servers}
"""


class _Answers(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.server.body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def ok_server(body: bytes = b"") -> Iterator[str]:
    """An HTTP server on loopback that answers every GET with 200 and ``body`` (a backend server
    for HAProxy's checks and requests), in a thread while the block runs; its ``127.0.0.1:<port>``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    srv.body = body  # type: ignore[attr-defined]
    srv.handle_error = lambda *a: None  # HAProxy's checks close connections early
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HAProxy:
    """``servers``: [(name, "address:port")]. ``url``: the frontend; ``socket``: the runtime API."""

    def __init__(self, directory: Path, servers: list[tuple[str, str]], backend: str = "triton",
                 check: str = "/v2/health/ready", inter: str = "1s", balance: str = "roundrobin",
                 extra: list[str] | None = None, recommended: bool = False):
        """``balance``: the backend's algorithm; ``extra``: more lines for the backend;
        ``recommended``: the backend lines docs/operations.md recommends for Triton
        (``haproxy_config.TRAFFIC_LINES``: retries elsewhere, failing servers marked down)."""
        exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
        assert Path(exe).exists(), "haproxy is not installed (bash scripts/setup installs it)"
        self.dir = directory
        self.socket = str(directory / "admin.sock")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend = backend
        extra = [*(traffic_lines() if recommended else []), *(extra or [])]
        cfg = directory / "haproxy.cfg"
        cfg.write_text(CONFIG.format(sock=self.socket, port=self.port, backend=backend, check=check, inter=inter,
                                     balance=balance, extra="".join(f"  {line}\n" for line in extra),
                                     servers="\n".join(f"  server {n} {a}" for n, a in servers)))
        self.log = open(directory / "haproxy.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([exe, "-f", str(cfg), "-db"], stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        # ready when the runtime API accepts a connection, not when its file appears: HAProxy binds
        # the socket (the file appears) and listens on it in a later step of its start, and a
        # connection in between is refused (CI on a loaded machine: "[Errno 111] Connection refused")
        deadline = time.monotonic() + 10
        while not self._accepts():
            assert self.proc.poll() is None, (directory / "haproxy.log").read_text()
            assert time.monotonic() < deadline, "haproxy did not open its runtime API socket"
            time.sleep(0.05)

    def _accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(self.socket)
            except OSError:
                return False
        return True

    def command(self, line: str) -> str:
        from tritonfleet.serving.drain import RuntimeAPI

        return RuntimeAPI(self.socket).command(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def main(argv: list[str]) -> int:
    """``python tests/support/haproxy.py SOCKET COMMAND``: one runtime API command (a load balancer hook
    in tests); exit status 1 when HAProxy answers anything (its answer to `set server` is empty
    on success)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tritonfleet.serving.drain import RuntimeAPI

    answer = RuntimeAPI(argv[0]).command(argv[1]).strip()
    if answer:
        print(answer, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
