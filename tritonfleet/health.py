"""The health gate: Triton answers live, ready, every model ready, and serves metrics.

Runs on the control machine with requests, either straight to the host's ports or through a
tunnel over the host's own SSH connection (for firewalls that open 8000-8002 only to the load
balancer and Prometheus).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from dataclasses import dataclass, field

import requests


class HealthError(RuntimeError):
    pass


@dataclass
class Check:
    endpoint: str
    ok: bool
    detail: str


@dataclass
class HealthResult:
    ok: bool
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)


def _get(session: requests.Session, url: str, timeout: float) -> tuple[bool, str]:
    try:
        r = session.get(url, timeout=timeout)
    except requests.RequestException as e:
        return False, f"no answer ({type(e).__name__}: {e})"
    body = r.text.strip().replace("\n", " ")[:200]
    return r.status_code == 200, f"HTTP {r.status_code} {body}".strip()


def check_once(http_url: str, metrics_url: str, models: list[str], timeout: float = 5) -> HealthResult:
    with requests.Session() as s:
        return _check(s, http_url, metrics_url, models, timeout)


def _check(s: requests.Session, http_url: str, metrics_url: str, models: list[str], timeout: float) -> HealthResult:
    checks = []
    for path in ("/v2/health/live", "/v2/health/ready"):
        ok, detail = _get(s, http_url + path, timeout)
        checks.append(Check(http_url + path, ok, detail))
        if not ok:
            return HealthResult(False, checks)
    for m in models:
        url = f"{http_url}/v2/models/{m}/ready"
        ok, detail = _get(s, url, timeout)
        checks.append(Check(url, ok, detail))
    url = metrics_url + "/metrics"
    try:
        r = s.get(url, timeout=timeout)
        ok = r.status_code == 200 and "nv_inference_request_success" in r.text
        detail = f"HTTP {r.status_code}" + ("" if ok else ", no nv_inference_request_success")
    except requests.RequestException as e:
        ok, detail = False, f"no answer ({type(e).__name__})"
    checks.append(Check(url, ok, detail))
    return HealthResult(all(c.ok for c in checks), checks)


def wait_healthy(http_url: str, metrics_url: str, models: list[str], timeout: float = 180,
                 request_timeout: float = 5, interval: float = 1.0) -> HealthResult:
    """Retry until everything answers or ``timeout`` seconds pass."""
    t0 = time.monotonic()
    while True:
        res = check_once(http_url, metrics_url, models, request_timeout)
        res.seconds = time.monotonic() - t0
        if res.ok or res.seconds >= timeout:
            return res
        time.sleep(interval)


class SSHTunnel:
    """Forward 127.0.0.1:<random> to ``remote_port`` on the host over an open paramiko transport.
    ``channel_timeout``: seconds opening a channel, or sending into one, may wait for the host
    (its dead-link bound); a request through a dead tunnel then fails instead of hanging."""

    def __init__(self, transport, remote_port: int, remote_host: str = "127.0.0.1",
                 channel_timeout: float = 30):
        self.transport, self.remote = transport, (remote_host, remote_port)
        self.channel_timeout = channel_timeout
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._open: list = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, addr = self.sock.accept()
            except OSError:
                continue
            try:
                chan = self.transport.open_channel("direct-tcpip", self.remote, addr,
                                                   timeout=self.channel_timeout)
                chan.settimeout(self.channel_timeout)
            except Exception:
                client.close()
                continue
            self._open += [client, chan]
            threading.Thread(target=self._pipe, args=(client, chan), daemon=True).start()

    def _pipe(self, client, chan):
        with contextlib.suppress(OSError, EOFError, ValueError):
            self._pump(client, chan)

    def _pump(self, client, chan):
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

    def close(self):
        self._stop.set()
        self.sock.close()
        for s in self._open:
            with contextlib.suppress(Exception):
                s.close()


def journal_excerpt(lines: list[str], keep: int = 15) -> list[str]:
    """The unit journal's error lines (Triton's E-level log lines, failures), else its tail."""
    import re

    bad = [ln for ln in lines if re.search(r"\]: E\d{4} |\bE\d{4} \d|error|failed|unavailable", ln, re.I)
           and "| " not in ln]
    return (bad or lines)[-keep:]


def triton_cause(lines: list[str]) -> str:
    """Triton's own first error in the unit's journal, one line: a model that failed to load
    first, else the first E-level line ("" when there is none)."""
    import re

    errors = []
    for ln in lines:
        m = re.search(r"\bE\d{4} [\d:.]+\s+\d+ \S+\] (.*)", ln)
        if m:
            errors.append(m.group(1).strip().strip("\""))
    loads = [e for e in errors if "failed to load" in e]
    return ((loads or errors or [""])[0])[:240]


def gate(get, address: str, models: list[str], transport=None, timeout: float | None = None) -> HealthResult:
    """Wait until the host whose tunables ``get`` reads is healthy (or ``timeout`` passes).
    ``address``: its SSH address; ``transport``: its open paramiko transport (health_via ssh)."""
    from . import config
    from .connection import dead_after

    via = get("health_via")
    tunnels: list[SSHTunnel] = []
    http_port, metrics_port = get("triton_http_port"), get("triton_metrics_port")
    if via == "ssh":
        if transport is None:
            raise config.ConfigError("health_via = 'ssh' needs the host's SSH connection")
        try:
            bound = dead_after({k: get(k) for k in ("ssh_keepalive_interval", "ssh_keepalive_count")})
        except ValueError as e:
            raise config.ConfigError(str(e)) from e
        tunnels = [SSHTunnel(transport, http_port, channel_timeout=bound),
                   SSHTunnel(transport, metrics_port, channel_timeout=bound)]
        http_url = f"http://127.0.0.1:{tunnels[0].port}"
        metrics_url = f"http://127.0.0.1:{tunnels[1].port}"
    elif via == "direct":
        addr = get("health_host") or address
        http_url, metrics_url = f"http://{addr}:{http_port}", f"http://{addr}:{metrics_port}"
    else:
        raise config.ConfigError(f"health_via must be 'direct' or 'ssh', not {via!r}")
    try:
        return wait_healthy(http_url, metrics_url, models, get("health_timeout") if timeout is None else timeout,
                            get("health_request_timeout"))
    finally:
        for t in tunnels:
            t.close()


def gate_current_host(models: list[str]) -> HealthResult:
    """pyinfra callback: health-gate the host being deployed; raise with details on failure."""
    from pyinfra import host, logger

    from . import config

    transport = None
    if config.get("health_via") == "ssh":
        transport = host.connector.client.get_transport()
    try:
        res = gate(config.get, host.data.get("ssh_hostname") or host.name, models, transport)
    except config.ConfigError as e:
        raise config.ConfigError(f"{host.name}: {e}") from e
    if not res.ok:
        bad = res.first_failure
        service = config.get("triton_service")
        _, out = host.run_shell_command(f"journalctl -u {service} -n 300 --no-pager 2>&1 || true")
        journal = "\n    ".join(journal_excerpt(out.stdout_lines))
        cause = triton_cause(out.stdout_lines)
        raise HealthError(
            f"{host.name}: health gate failed after {res.seconds:.0f}s"
            + (f" (Triton: {cause})" if cause else "") + f": {bad.endpoint} -> {bad.detail}\n"
            f"  the {service} unit's journal (errors, newest last):\n    {journal}"
        )
    logger.info(f"{host.name}: healthy in {res.seconds:.1f}s ({len(models)} models ready, metrics served)")
    return res
