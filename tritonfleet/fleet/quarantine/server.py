"""The quarantine receiver's HTTP API (Alertmanager's webhook, the state, release and hold) and
``serve``, which runs it until SIGTERM.

Every request but ``GET /-/healthy`` carries ``Authorization: Bearer <token>`` (``GET
/v1/quarantine`` is open only with ``public_read``): the operator's token may do everything, the
webhook's (when it has its own) only ``POST /alerts``; the audit trail names the token that
matched, never what the body says. ``POST /v1/hosts/<host>/fault`` (the collectors' direct path,
with ``push_secret``) takes only that host's own token, the HMAC of its name under the secret
(tritonfleet.gpu.fault_push.host_token), and no other. A POST is ``application/json`` (a browser's cross-site
"simple" POST is not) with a ``Content-Length`` of at most ``MAX_BODY``; a body not of the
expected shape is a 4xx and nothing is queued. Each connection has a socket timeout, the server a
bound on connections at once, the worker a bounded queue (503 beyond it)."""

from __future__ import annotations

import hmac
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ...core.errors import UsageError
from ...gpu.fault_push import host_token
from .planning import QuarantineError, clean, now_iso, webhook_alerts
from .push import fault_body_error
from .receiver import Busy, Receiver, UnknownHost

MAX_BODY = 1 << 20
#: seconds a connection may stay silent (a slow or partial request does not hold a thread for good)
SOCKET_TIMEOUT = 10.0
#: connections served at once; one more is answered 503 and closed
MAX_CONNECTIONS = 32


@dataclass(frozen=True)
class Caller:
    """A token and whom it stands for: ``name`` goes into the audit trail; ``webhook_only``: it
    may only ``POST /alerts`` (Alertmanager's own token)."""

    name: str
    token: str
    webhook_only: bool = False


class _Refused(Exception):
    def __init__(self, status: int, error: str):
        super().__init__(error)
        self.status, self.error = status, error


def handler_for(
    rec: Receiver, request_timeout: float, callers: list[Caller], public_read: bool = False, push_secret: str = ""
):
    if not callers or any(not c.token for c in callers):
        raise UsageError("the quarantine receiver needs a token (tritonfleet quarantine token --out PATH)")

    class Handler(BaseHTTPRequestHandler):
        server_version = "tritonfleet-quarantine"
        timeout = SOCKET_TIMEOUT

        def log_message(self, fmt, *args):  # requests are not events; the actions are logged
            return

        def _send(self, status: int, body: dict | str, extra: dict | None = None) -> None:
            data = (json.dumps(body, indent=2) if isinstance(body, dict) else body).encode()
            extra = dict(extra or {})
            self.send_response(status)
            self.send_header(
                "Content-Type",
                extra.pop("Content-Type", None) or ("application/json" if isinstance(body, dict) else "text/plain"),
            )
            self.send_header("Content-Length", str(len(data)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _caller(self, webhook: bool) -> Caller:
            """The caller whose token the request carries (401 without one that matches)."""
            got = self.headers.get("Authorization") or ""
            scheme, _, token = got.partition(" ")
            presented = token.strip().encode() if scheme.lower() == "bearer" else b""
            found = None
            for c in callers:  # every token compared, in constant time each
                if hmac.compare_digest(presented, c.token.encode()) and presented:
                    found = found or c
            if found is None or (found.webhook_only and not webhook):
                raise _Refused(401, "a valid bearer token is needed (Authorization: Bearer <token>)")
            return found

        def _host_caller(self, name: str) -> str:
            """A host's collector pushing a fault of itself: its token is the HMAC of its name under
            the push secret (tritonfleet.gpu.fault_push.host_token); 401 otherwise."""
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            want = host_token(push_secret, name).encode() if push_secret and name in rec.hosts else b""
            if not want or scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), want):
                raise _Refused(401, "a valid bearer token is needed (the host's push token)")
            return f"collector of {name}"

        def _body(self) -> dict:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "application/json":
                raise _Refused(415, f"Content-Type {ctype or 'none'}: only application/json is taken")
            length = self.headers.get("Content-Length")
            if length is None:
                raise _Refused(411, "Content-Length is required")
            if not length.strip().isdigit():
                raise _Refused(400, "Content-Length is not a non-negative whole number")
            n = int(length)
            if n > MAX_BODY:
                raise _Refused(413, f"a body of {n} bytes is too large (at most {MAX_BODY})")
            raw = self.rfile.read(n)
            if len(raw) != n:
                raise _Refused(400, f"the body ended after {len(raw)} of {n} bytes")
            try:
                data = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise _Refused(400, f"the body is not JSON: {e}") from None
            if not isinstance(data, dict):
                raise _Refused(400, "the body is not a JSON object")
            return data

        def do_GET(self):  # noqa: N802 - http.server's name
            try:
                if self.path == "/-/healthy":
                    return self._send(200, "ok\n")
                if self.path == "/v1/quarantine":
                    if not public_read:
                        self._caller(webhook=False)
                    return self._send(200, rec.snapshot())
                if self.path == "/metrics":  # the event latency histograms and the breaker
                    if not public_read:
                        self._caller(webhook=False)
                    return self._send(
                        200, rec.latency.text().decode(), {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
                    )
                return self._send(404, {"error": f"no such path {self.path[:100]}"})
            except _Refused as e:
                return self._send(
                    e.status, {"error": e.error}, {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
                )

        def do_POST(self):  # noqa: N802 - http.server's name
            try:
                self._post()
            except _Refused as e:
                self.close_connection = True
                self._send(e.status, {"error": e.error}, {"WWW-Authenticate": "Bearer"} if e.status == 401 else None)
            except Busy as e:
                self._send(503, {"ok": False, "error": str(e)}, {"Retry-After": "5"})
            except TimeoutError:
                self.close_connection = True  # the caller stopped sending: nothing was queued

        def _post(self) -> None:
            m = re.match(r"^/v1/hosts/([^/]+)/(release|hold|fault)$", self.path)
            if self.path != "/alerts" and not m:
                raise _Refused(404, f"no such path {self.path[:100]}")
            if m is not None and m.group(2) == "fault":
                return self._fault(urllib.parse.unquote(m.group(1)))
            caller = self._caller(webhook=self.path == "/alerts")
            body = self._body()
            if m is None:
                try:
                    good, skipped = webhook_alerts(body)
                except ValueError as e:
                    raise _Refused(400, str(e)) from None
                rec.submit("alerts", body, caller.name)
                return self._send(200, {"ok": True, "alerts": len(good), "skipped": skipped})
            name, action = urllib.parse.unquote(m.group(1)), m.group(2)
            if name not in rec.hosts:  # answered here: an unknown name never reaches a log line
                return self._send(
                    404,
                    {
                        "host": clean(name, 64),
                        "ok": False,
                        "error": f"{clean(name, 64)} is not a host of the inventory",
                    },
                )
            for key in ("by", "reason"):
                if not isinstance(body.get(key, ""), str):
                    raise _Refused(400, f"{key} is not a string")
            force = body.get("force", False)
            if not isinstance(force, bool):
                raise _Refused(400, "force is not true or false")
            by, reason = body.get("by", ""), body.get("reason", "")
            if action == "release":
                fut = rec.submit("release", name, by, caller.name)
            else:
                if force and not reason.strip():
                    raise _Refused(400, "a forced hold needs a reason")
                fut = rec.submit("hold", name, reason, by, caller.name, force)
            try:
                result = fut.result(timeout=request_timeout)
            except UnknownHost as e:
                return self._send(404, {"host": name, "ok": False, "error": str(e)})
            except QuarantineError as e:
                return self._send(409, {"host": name, "ok": False, "error": str(e)})
            except TimeoutError:
                return self._send(504, {"host": name, "ok": False, "error": "the receiver did not finish in time"})
            return self._send(200 if result.get("ok") else 409, result)

        def _fault(self, name: str) -> None:
            """The direct path: stored for the worker, answered at once (202)."""
            caller = self._host_caller(name)
            body = self._body()
            why = fault_body_error(body)
            if why:
                raise _Refused(400, why)
            if not rec.push_fault(name, body, caller):
                raise Busy("the receiver is busy (too many pushed faults waiting): try again")
            return self._send(202, {"ok": True, "host": name})

    return Handler


class BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most ``MAX_CONNECTIONS`` connections served at once."""

    daemon_threads = True

    def __init__(self, *args, **kw):
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kw)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1)
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 5\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {listen!r}: expected address:port (e.g. 127.0.0.1:9095)")
    return host.strip("[]"), int(port)


def serve(rec: Receiver, listen: str, callers: list[Caller], public_read: bool = False, push_secret: str = "") -> None:
    """Run until SIGTERM/Ctrl-C, or until the worker ends (only when the interpreter does: a bug
    is an error event and the worker goes on)."""
    host, port = parse_listen(listen)
    handler = handler_for(rec, rec.gate_timeout + 60, callers, public_read, push_secret)
    try:
        server = BoundedServer((host, port), handler)
    except OSError as e:
        raise UsageError(f"--listen {listen}: cannot listen there: {e.strerror}") from e
    web = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="quarantine-http", daemon=True
    )
    rec.start()
    web.start()
    rec.echo(
        f"{now_iso()} - listening on http://{listen} (Alertmanager webhook: POST /alerts; bearer token "
        f"of {', '.join(c.name for c in callers)}{'; the hosts push faults' if push_secret else ''}); "
        f"{len(rec.hosts)} hosts, budget " + ", ".join(f"{g}: {n}" for g, n in sorted(rec.limits.items()))
    )
    try:
        while rec.worker is not None and rec.worker.is_alive():
            rec.worker.join(timeout=1)
    finally:
        server.shutdown()
        server.server_close()
        rec.close()
    if rec.crashed is not None:
        raise RuntimeError(f"the quarantine worker failed: {type(rec.crashed).__name__}: {rec.crashed}")
