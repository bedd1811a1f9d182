"""What the quarantine receiver does to a host: its load balancer (exactly the deploy's drain,
tritonfleet.serving.drain) and the deploy's warm inference gate (tritonfleet.serving.health)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import requests
from pyinfra.api.exceptions import PyinfraError

from ...inventory.roster import FleetHost
from ...model_repo.render import host_repository, model_names
from ...serving import drain, health, triton_http
from .planning import QuarantineError

#: seconds a refused connection is retried before the gate gives up at once (a Triton that is
#: down refuses; waiting the whole gate timeout for it tells nothing more)
REFUSED_RETRY_SECONDS = 3.0


def _metrics_reader(fh: FleetHost) -> Callable[[], str]:
    def read() -> str:
        url = f"http://{fh.get('health_host') or fh.address}:{int(fh.get('triton_metrics_port'))}/metrics"
        try:
            with triton_http.session() as s:
                r = s.get(url, timeout=5)
                r.raise_for_status()
                return r.content.decode("utf-8", "replace")
        except requests.RequestException as e:
            raise drain.DrainError(f"Triton's metrics at {url} do not answer: {e}") from e

    return read


def balancer(fh: FleetHost) -> drain.Balancer | None:
    """The host's load balancer from its tunables (the drain's own), None when ``lb`` is not set."""
    return drain.from_settings(fh, fh.name, fh.get("health_host") or fh.address, _metrics_reader(fh), hold=True)


def refused(address: str, port: int, within: float = REFUSED_RETRY_SECONDS) -> str:
    """Why ``address:port`` refuses every connection for ``within`` seconds, or "" as soon as one
    is accepted (or fails otherwise: a timeout is for the gate to judge)."""
    deadline = time.monotonic() + within
    while True:
        try:
            socket.create_connection((address, port), timeout=2).close()
            return ""
        except ConnectionRefusedError as e:
            if time.monotonic() >= deadline:
                return f"{address}:{port} refuses connections ({e.strerror}, for {within:.0f} s): Triton is not running"
        except OSError:
            return ""
        time.sleep(0.5)


def warm_gate(fh: FleetHost, timeout: float) -> tuple[bool, str]:
    """The warm inference gate of the deploy, for one host: (passed, what it found). A Triton
    that refuses connections fails it after a few seconds, not the whole timeout."""
    if fh.get("health_via") != "ssh":
        why = refused(fh.get("health_host") or fh.address, int(fh.get("triton_http_port")))
        if why:
            return False, why

    local, _, _ = host_repository(fh, gpus=1)
    models = model_names(local)
    transport = None
    if fh.get("health_via") == "ssh":
        h = fh.pyinfra_host
        try:
            if not h.connected:
                h.connect(reason="tritonfleet quarantine", show_errors=False, raise_exceptions=True)
        except PyinfraError as e:
            raise QuarantineError(f"cannot reach {fh.name} over SSH for its gate (health_via ssh): {e}") from e
        transport = h.connector.client.get_transport()
    said: list[str] = []
    warm = health.warm_check(str(local), models, max(float(fh.get("health_request_timeout")), 30.0), said.append)
    res = health.gate(fh, fh.address, models, transport, timeout, None, warm)
    if res.ok:
        return True, said[-1] if said else "healthy"
    if res.verdict:
        return False, res.verdict.short or res.verdict.cause
    bad = res.first_failure
    return False, f"{bad.endpoint} -> {bad.detail}" if bad else "no answer"
