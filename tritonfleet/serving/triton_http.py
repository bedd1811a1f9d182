"""Triton's endpoints as the control machine reaches them: the one client.

``endpoints`` says where a host's Triton answers (directly, or through SSH tunnels bounded by the
host's dead-link bound) and ``session`` is the HTTP session every read uses (never through a
proxy): the health gate, the metrics reads (``tritonfleet tune``), the load test and the
rollout's performance gate all reach a host through them. ``parse`` reads Triton's metrics (the
Prometheus text exposition of ``/metrics``) into samples, for them and for the drain.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import requests

from ..core.tunnel import SSHTunnel
from ..pyinfra_ext.connection import dead_after
from ..settings.access import ConfigError, Settings


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition. A counter's samples carry the name the
    exposition gives its family (prometheus_client's parser appends ``_total`` to counter
    samples; Triton's counters have no such suffix). prometheus_client is imported here, not with
    this module: the health gate of every deploy reads no metric's value (the import was 19 ms of
    a one-host no-op)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = family.name if family.type == "counter" and s.name == f"{family.name}_total" else s.name
            out.append(Sample(name, dict(s.labels), float(s.value)))
    return out


# --- where a host's Triton answers ---------------------------------------------------------------


@dataclass(frozen=True)
class Endpoints:
    """Where one Triton answers, as the control machine reaches it."""

    http_url: str  #: http://addr:port
    metrics_url: str  #: http://addr:port (without /metrics)
    grpc_url: str = ""  #: addr:port (when asked for)
    #: the SSH tunnels behind the URLs (health_via = "ssh"), for :attr:`tunnel_error`
    tunnels: tuple[SSHTunnel, ...] = field(default=(), compare=False, repr=False)

    @property
    def tunnel_error(self) -> str:
        """Why a tunnel could not open its last channel ("" when none failed): a request through
        it failed with a bare closed connection, this says why (the gate's report adds it)."""
        return next((t.error for t in self.tunnels if t.error), "")


@contextlib.contextmanager
def endpoints(
    settings: Settings, address: str, transport: Callable[[], Any] | None = None, grpc: bool = False
) -> Iterator[Endpoints]:
    """The Triton endpoints of a host (or of one of its per-GPU instances: ``settings`` holds its
    tunables), closed again on exit. ``health_via = "direct"``: the host's ``health_host``, else
    ``address``. ``health_via = "ssh"``: tunnels over the host's own SSH connection
    (``transport()`` returns its open paramiko transport), for firewalls that open Triton's ports
    only to the load balancer and Prometheus; each tunnel bounded by the host's dead-link bound
    (ssh_keepalive_interval x ssh_keepalive_count, tritonfleet.pyinfra_ext.connection): a request
    through a link that died fails instead of hanging. ``grpc``: the gRPC port too.

    The one way the health gate, the metrics reads (tune, prometheus's checks), the load test and
    the rollout's performance gate reach a host. A bad health_via or keepalive setting is a
    ConfigError (the callers add the host's name)."""
    via = settings.get("health_via")
    keys = ["triton_http_port", "triton_metrics_port"] + (["triton_grpc_port"] if grpc else [])
    ports = [int(settings.get(k)) for k in keys]
    if via == "direct":
        addr = settings.get("health_host") or address
        yield Endpoints(f"http://{addr}:{ports[0]}", f"http://{addr}:{ports[1]}", f"{addr}:{ports[2]}" if grpc else "")
        return
    if via != "ssh":
        raise ConfigError(f"health_via must be 'direct' or 'ssh', not {via!r} (group data)")
    if transport is None:
        raise ConfigError("health_via = 'ssh' needs the host's SSH connection")
    try:
        bound = dead_after({k: settings.get(k) for k in ("ssh_keepalive_interval", "ssh_keepalive_count")})
    except ValueError as e:
        raise ConfigError(str(e)) from e
    link = transport()
    tunnels: list[SSHTunnel] = []
    try:
        for port in ports:
            tunnels.append(SSHTunnel(link, port, channel_timeout=bound))
        local = [f"127.0.0.1:{t.port}" for t in tunnels]
        yield Endpoints(f"http://{local[0]}", f"http://{local[1]}", local[2] if grpc else "", tuple(tunnels))
    finally:
        for t in tunnels:
            t.close()


def session(headers: dict | None = None) -> requests.Session:
    """An HTTP session for a host's Triton: never through a proxy (the fleet's own addresses; the
    proxy variables of the control machine are for the internet), with ``headers`` on every
    request (the host's API key for the restricted APIs)."""
    s = requests.Session()
    s.trust_env = False
    s.headers.update(headers or {})
    return s
