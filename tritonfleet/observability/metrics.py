"""Triton's metrics as the fleet commands read them: where each host serves them, and what one
read of a host gives (its Prometheus text parsed, the model statistics and configurations).

Used by ``tritonfleet prometheus`` (the addresses Prometheus scrapes) and ``tritonfleet tune``
(the figures it judges). Metric names and labels are those of tritonserver 2.49-2.51
(container 24.08): per model and version ``nv_inference_request_success``,
``nv_inference_request_failure`` (with a ``reason`` label), ``nv_inference_count``,
``nv_inference_exec_count``, ``nv_inference_request_duration_us``,
``nv_inference_queue_duration_us``, ``nv_inference_compute_{input,infer,output}_duration_us``
(cumulative counters; durations only of successful requests), ``nv_inference_pending_request_count``;
per GPU (``gpu_uuid``) ``nv_gpu_utilization`` (0.0-1.0), ``nv_gpu_memory_{total,used}_bytes``;
per host ``nv_cpu_utilization``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import requests

from ..gpu.placement import expected_count
from ..inventory.roster import FleetError, FleetHost
from ..serving import per_gpu, triton_http
from ..serving.triton_http import Sample, parse
from ..settings.access import ConfigError

_MISSING = object()

#: Counters summed per model (over versions and failure reasons) by :func:`model_counters`.
COUNTERS = {
    "requests": "nv_inference_request_success",
    "failures": "nv_inference_request_failure",
    "request_us": "nv_inference_request_duration_us",
    "queue_us": "nv_inference_queue_duration_us",
    "compute_input_us": "nv_inference_compute_input_duration_us",
    "compute_infer_us": "nv_inference_compute_infer_duration_us",
    "compute_output_us": "nv_inference_compute_output_duration_us",
    "inferences": "nv_inference_count",
    "executions": "nv_inference_exec_count",
}


def address(fh: FleetHost) -> str:
    """Where the control machine (and Prometheus) reaches the host's Triton ports."""
    return str(fh.get("health_host") or fh.address)


def metrics_target(fh: FleetHost) -> str:
    """``address:port`` of the host's metrics endpoint."""
    return f"{address(fh)}:{int(fh.get('triton_metrics_port'))}"


def metrics_targets(fh: FleetHost) -> list[tuple[str, int | None]]:
    """``(address:port, GPU index)`` of each of the host's metrics endpoints: the one of its single
    Triton (index None), or with triton_per_gpu one per GPU (gpu_count GPUs: tritonfleet.serving.per_gpu)."""
    if not per_gpu.enabled(fh):
        return [(metrics_target(fh), None)]
    count = fh.get("gpu_count")
    try:
        n = expected_count(count, [])
        if n is None:
            raise ValueError("gpu_count is not set")
        per_gpu.check_layout(fh, n)
        return [(f"{address(fh)}:{per_gpu.ports(fh, i)['triton_metrics_port']}", i) for i in range(n)]
    except ValueError as e:
        raise FleetError(
            f"{fh.name}: triton_per_gpu needs the host's gpu_count for one target per GPU ({e}); "
            "set gpu_count in its inventory host data or group data"
        ) from e


@dataclass
class ModelCounters:
    """One model's cumulative counters on one host (all versions), plus the batch sizes it ran."""

    requests: float = 0.0
    failures: float = 0.0
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0
    inferences: float = 0.0
    executions: float = 0.0
    #: batch size -> executions of that size (Triton's statistics extension, batch_stats)
    batches: Counter = field(default_factory=Counter)

    @property
    def compute_us(self) -> float:
        return self.compute_input_us + self.compute_infer_us + self.compute_output_us

    def __sub__(self, older: ModelCounters) -> ModelCounters:
        """What happened between ``older`` and this read. A counter that went down means the
        server restarted in between: then this read's totals are what happened since."""
        if self.requests < older.requests or self.executions < older.executions:
            return self
        diff = ModelCounters(**{k: getattr(self, k) - getattr(older, k) for k in COUNTERS})
        diff.batches = Counter({b: n - older.batches.get(b, 0) for b, n in self.batches.items()})
        diff.batches = +diff.batches  # drop sizes that did not run in between
        return diff

    def __add__(self, other: ModelCounters) -> ModelCounters:
        total = ModelCounters(**{k: getattr(self, k) + getattr(other, k) for k in COUNTERS})
        total.batches = self.batches + other.batches
        return total


def model_counters(samples: list[Sample]) -> dict[str, ModelCounters]:
    """Per model: the counters summed over versions (and failure reasons). A model is listed when
    Triton reports its ``nv_inference_request_success`` (a loaded model); an unloaded one keeps
    only its failure series, so those alone do not list it."""
    by_name = {v: k for k, v in COUNTERS.items()}
    out: dict[str, ModelCounters] = {}
    loaded = {s.labels.get("model") for s in samples if s.name == COUNTERS["requests"]}
    for s in samples:
        attr = by_name.get(s.name)
        model = s.labels.get("model")
        if attr is None or model not in loaded or s.value != s.value:  # NaN: nothing measured
            continue
        mc = out.setdefault(model, ModelCounters())
        setattr(mc, attr, getattr(mc, attr) + s.value)
    return out


def gauge_mean(samples: list[Sample], name: str) -> float | None:
    """Mean of a gauge over its series (e.g. nv_gpu_utilization over a host's GPUs); None if absent."""
    values = [s.value for s in samples if s.name == name and s.value == s.value]
    return sum(values) / len(values) if values else None


@dataclass
class HostRead:
    """One read of a host: its metrics, and per model the statistics and configuration."""

    host: FleetHost
    models: dict[str, ModelCounters] = field(default_factory=dict)
    gpu_utilization: float | None = None
    cpu_utilization: float | None = None
    configs: dict[str, dict] = field(default_factory=dict)
    error: str | None = None


def batch_sizes(stats: dict) -> Counter:
    """batch size -> executions, from a ``/v2/models/<m>/stats`` answer (all versions)."""
    out: Counter = Counter()
    for ms in stats.get("model_stats", []):
        for b in ms.get("batch_stats", []):
            n = int(b.get("compute_infer", {}).get("count", 0))
            if n:
                out[int(b["batch_size"])] += n
    return out


def read_host(
    fh: FleetHost,
    http_url: str,
    metrics_url: str,
    *,
    configs: bool = True,
    models: set[str] | None = None,
    timeout: float = 5,
    headers: dict | None = None,
) -> HostRead:
    """Read the host's metrics, and per model its statistics (batch sizes run) and, if
    ``configs``, its live configuration. ``models`` restricts the models read; ``headers`` go
    with every request (the host's API key for restricted statistics and configuration)."""
    res = HostRead(fh)
    with triton_http.session(headers) as s:
        url = f"{metrics_url}/metrics"
        try:
            r = s.get(url, timeout=timeout)
            r.raise_for_status()
            samples = parse(r.text)
        except (requests.RequestException, ValueError) as e:
            res.error = f"{url}: {type(e).__name__}: {e}"
            return res
        res.models = {m: c for m, c in model_counters(samples).items() if not models or m in models}
        res.gpu_utilization = gauge_mean(samples, "nv_gpu_utilization")
        res.cpu_utilization = gauge_mean(samples, "nv_cpu_utilization")
        for m, mc in res.models.items():
            for what in ("stats", "config") if configs else ("stats",):
                url = f"{http_url}/v2/models/{m}/{what}"
                try:
                    r = s.get(url, timeout=timeout)
                    r.raise_for_status()
                    body = r.json()
                except (requests.RequestException, ValueError) as e:
                    res.error = f"{url}: {type(e).__name__}: {e}"
                    return res
                if what == "stats":
                    mc.batches = batch_sizes(body)
                else:
                    res.configs[m] = body
    return res


@contextlib.contextmanager
def endpoints(fh: FleetHost):
    """(http_url, metrics_url) of the host as the control machine reaches them: directly
    (``health_via = "direct"``), or through tunnels over the host's own SSH connection
    (``health_via = "ssh"``), closed again on exit (tritonfleet.serving.triton_http)."""
    with contextlib.ExitStack() as stack:
        try:
            at = stack.enter_context(triton_http.endpoints(fh, fh.address, fh.transport))
        except ConfigError as e:
            raise FleetError(f"{fh.name}: {e}") from e
        yield at.http_url, at.metrics_url
