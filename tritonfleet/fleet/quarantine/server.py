"""The quarantine receiver's HTTP API (Alertmanager's webhook, the state, release and hold) and
``serve``, which runs it until SIGTERM."""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ...core.errors import UsageError
from .planning import QuarantineError, now_iso
from .receiver import Receiver

MAX_BODY = 1 << 20


def handler_for(rec: Receiver, request_timeout: float):
    class Handler(BaseHTTPRequestHandler):
        server_version = "tritonfleet-quarantine"

        def log_message(self, fmt, *args):  # requests are not events; the actions are logged
            return

        def _send(self, status: int, body: dict | str) -> None:
            data = (json.dumps(body, indent=2) if isinstance(body, dict) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                raise ValueError(f"body of {n} bytes is too large")
            raw = self.rfile.read(n) if n else b"{}"
            data = json.loads(raw or b"{}")
            if not isinstance(data, dict):
                raise ValueError("the body is not a JSON object")
            return data

        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/-/healthy":
                return self._send(200, "ok\n")
            if self.path == "/v1/quarantine":
                return self._send(200, rec.snapshot())
            return self._send(404, {"error": f"no such path {self.path}"})

        def do_POST(self):  # noqa: N802 - http.server's name
            try:
                body = self._body()
            except ValueError as e:
                return self._send(400, {"error": str(e)})
            if self.path == "/alerts":
                rec.submit("alerts", body)
                return self._send(200, {"ok": True})
            m = re.match(r"^/v1/hosts/([^/]+)/(release|hold)$", self.path)
            if not m:
                return self._send(404, {"error": f"no such path {self.path}"})
            name, action = urllib.parse.unquote(m.group(1)), m.group(2)
            by = str(body.get("by") or "")
            args = (name, by) if action == "release" else (name, str(body.get("reason") or ""), by)
            try:
                result = rec.submit(action, *args).result(timeout=request_timeout)
            except QuarantineError as e:
                return self._send(409, {"host": name, "ok": False, "error": str(e)})
            except TimeoutError:
                return self._send(504, {"host": name, "ok": False, "error": "the receiver did not finish in time"})
            return self._send(200 if result.get("ok") else 409, result)

    return Handler


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {listen!r}: expected address:port (e.g. 127.0.0.1:9095)")
    return host.strip("[]"), int(port)


def serve(rec: Receiver, listen: str) -> None:
    """Run until SIGTERM/Ctrl-C, or until the worker fails (a bug: RuntimeError after its
    traceback; systemd's Restart= starts the receiver again, from its state file)."""
    host, port = parse_listen(listen)
    try:
        server = ThreadingHTTPServer((host, port), handler_for(rec, rec.gate_timeout + 60))
    except OSError as e:
        raise UsageError(f"--listen {listen}: cannot listen there: {e.strerror}") from e
    web = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="quarantine-http",
                           daemon=True)
    rec.start()
    web.start()
    rec.echo(f"{now_iso()} - listening on http://{listen} (Alertmanager webhook: POST /alerts); "
             f"{len(rec.hosts)} hosts, budget " + ", ".join(f"{g}: {n}" for g, n in sorted(rec.limits.items())))
    try:
        while rec.worker is not None and rec.worker.is_alive():
            rec.worker.join(timeout=1)
    finally:
        server.shutdown()
        server.server_close()
        rec.close()
    if rec.crashed is not None:
        raise RuntimeError(f"the quarantine worker failed: {type(rec.crashed).__name__}: {rec.crashed}")

