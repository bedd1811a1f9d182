"""``tritonfleet loadtest``: real inference load on each host's models, closed loop.

Per host, model and concurrency ``c``: ``c`` workers on one asyncio event loop (tritonclient's
``http.aio`` or ``grpc.aio`` client), each sending one request (batch 1) and the next as soon as
the answer is back, for ``duration`` seconds. Inputs are generated from the model's live
configuration (``/v2/models/<m>/config``: names, data types, dims; ``-1`` dims become 1).

What is measured per step:

* on the client: requests answered, errors, throughput (inferences/s = answered requests of
  batch 1 over the wall time of the step), latency percentiles (p50/p95/p99, from every
  request's own time), and the load generator's own CPU cost (process CPU seconds per request,
  so ``1 / cost`` is the request rate one control-machine core can drive, and ``busy``, the
  share of one core the client used: near 1.0 the client, not the server, is the limit);
* on the server: Triton's counters from its metrics endpoint read before and after the step
  (``nv_inference_request_success``, ``nv_inference_queue_duration_us``,
  ``nv_inference_compute_{input,infer,output}_duration_us``, ``nv_inference_count`` /
  ``nv_inference_exec_count``): the step's mean queue and compute time per request and the mean
  batch the server ran.

Hosts are reached the way ``tritonfleet tune`` and the health gate reach them
(``health_via``: directly at ``health_host`` / the SSH address, or through tunnels over the
host's SSH connection). Hosts are measured one after the other, so each step has the control
machine to itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import requests

from ..core.connection_errors import CONNECTION_ERRORS
from ..core.errors import TritonfleetError
from ..inventory.roster import FleetError, FleetHost
from ..serving import triton_http
from ..settings.access import ConfigError
from . import metrics
from .metrics import ModelCounters
from .tune import TuneThresholds, api_key_header

PROTOCOLS = ("http", "grpc")

#: config.pbtxt data type -> (Triton's wire data type, numpy dtype)
DTYPES: dict[str, tuple[str, type]] = {
    "TYPE_BOOL": ("BOOL", np.bool_),
    "TYPE_UINT8": ("UINT8", np.uint8),
    "TYPE_UINT16": ("UINT16", np.uint16),
    "TYPE_UINT32": ("UINT32", np.uint32),
    "TYPE_UINT64": ("UINT64", np.uint64),
    "TYPE_INT8": ("INT8", np.int8),
    "TYPE_INT16": ("INT16", np.int16),
    "TYPE_INT32": ("INT32", np.int32),
    "TYPE_INT64": ("INT64", np.int64),
    "TYPE_FP16": ("FP16", np.float16),
    "TYPE_FP32": ("FP32", np.float32),
    "TYPE_FP64": ("FP64", np.float64),
    "TYPE_STRING": ("BYTES", np.object_),
}


class LoadTestError(TritonfleetError, RuntimeError):
    pass


@dataclass(frozen=True)
class InputSpec:
    name: str
    datatype: str  #: Triton's wire data type (FP32, INT64, BYTES, ...)
    shape: tuple[int, ...]  #: as sent: batch 1 first when the model batches


def input_specs(config: dict) -> list[InputSpec]:
    """The inputs one request of batch 1 carries, from a model's live configuration (the JSON
    of ``/v2/models/<m>/config``). Optional inputs are left out; variable dims (-1) are 1."""
    batching = int(config.get("max_batch_size") or 0) > 0
    out = []
    for inp in config.get("input") or []:
        if inp.get("optional"):
            continue
        dtype = inp.get("data_type", "")
        if dtype not in DTYPES:
            raise LoadTestError(
                f"input {inp.get('name')!r} of model {config.get('name')!r} has data "
                f"type {dtype or '(none)'}, which the load test cannot generate"
            )
        dims = tuple(1 if int(d) < 0 else int(d) for d in inp.get("dims") or [])
        out.append(InputSpec(inp["name"], DTYPES[dtype][0], ((1,) if batching else ()) + dims))
    if not out:
        raise LoadTestError(f"model {config.get('name')!r} has no required inputs to send")
    return out


def make_data(spec: InputSpec, rng: np.random.Generator) -> np.ndarray:
    """Data for one input: normal floats, small non-negative integers (valid token ids, masks,
    class ids), random booleans, short byte strings."""
    np_type = next(t for w, t in DTYPES.values() if w == spec.datatype)
    if spec.datatype == "BYTES":
        return np.array([b"tritonfleet"] * math.prod(spec.shape), dtype=np.object_).reshape(spec.shape)
    if spec.datatype == "BOOL":
        return rng.integers(0, 2, spec.shape).astype(np.bool_)
    if spec.datatype.startswith("FP"):
        return rng.standard_normal(spec.shape).astype(np_type)
    return rng.integers(0, 100, spec.shape).astype(np_type)


def request_errors() -> tuple[type[BaseException], ...]:
    """What one inference request fails with: Triton's refusal or an error it answered
    (tritonclient's InferenceServerException, gRPC's errors converted to it), the HTTP client's
    (aiohttp) and gRPC's own errors, a socket's, the request's timeout. Anything else is a bug."""
    import aiohttp
    import grpc
    from tritonclient.utils import InferenceServerException

    return (InferenceServerException, aiohttp.ClientError, grpc.RpcError, asyncio.TimeoutError, OSError)


def client_module(protocol: str):
    if protocol == "http":
        import tritonclient.http.aio as mod
    elif protocol == "grpc":
        import tritonclient.grpc.aio as mod
    else:
        raise LoadTestError(f"--protocol must be http or grpc, not {protocol!r}")
    return mod


def make_inputs(specs: list[InputSpec], protocol: str, seed: int = 0) -> list:
    """tritonclient InferInput objects for ``specs`` (built once, sent with every request)."""
    mod = client_module(protocol)
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        inp = mod.InferInput(s.name, list(s.shape), s.datatype)
        inp.set_data_from_numpy(make_data(s, rng))
        out.append(inp)
    return out


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation (numpy's default); None if empty."""
    return float(np.percentile(values, q)) if values else None


@dataclass
class Step:
    """One host, model and concurrency: what the client saw and what Triton counted."""

    host: str
    model: str
    concurrency: int
    protocol: str
    duration_s: float
    requests: int  #: answered without error
    errors: int
    throughput: float  #: inferences/s (batch 1 requests answered / wall seconds)
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    queue_us_avg: float | None  #: Triton: queue time per request over the step
    compute_us_avg: float | None  #: Triton: compute input + infer + output per request
    compute_input_us_avg: float | None = None
    compute_infer_us_avg: float | None = None
    compute_output_us_avg: float | None = None
    request_us_avg: float | None = None  #: Triton: whole request time per request
    triton_requests: float | None = None  #: Triton's nv_inference_request_success delta
    triton_failures: float | None = None
    batch_avg: float | None = None  #: Triton: inferences per execution over the step
    batch_sizes: dict[str, float] = field(default_factory=dict)  #: batch size -> executions in the step
    utilization: float | None = None  #: the host's GPUs (or Triton's CPU figure for KIND_CPU models)
    device: str = "gpu"
    max_batch_size: int = 0
    dynamic_batching: bool = False
    max_queue_delay_us: int = 0
    preferred_batch_size: list[int] = field(default_factory=list)
    client_cpu_ms_per_request: float | None = None
    client_core_rate: float | None = None  #: requests/s one control-machine core can drive
    client_busy: float | None = None  #: the client's CPU seconds / wall seconds
    first_error: str = ""
    label: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Progress:
    requests: int = 0
    errors: int = 0
    started: float = 0.0


async def _drive(
    client,
    model: str,
    inputs: list,
    outputs: list | None,
    concurrency: int,
    duration: float,
    progress: Progress,
    timeout: float,
) -> tuple[list[float], list[str]]:
    failed_request = request_errors()  # (imports the clients' modules: before the clock starts)
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + duration

    async def worker() -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(client.infer(model, inputs, outputs=outputs), timeout)
            except failed_request as e:  # every failed request is counted and the first kept
                errors.append(f"{type(e).__name__}: {e}"[:300])
                progress.errors += 1
                if len(errors) > 1000 and not latencies:
                    return  # nothing works: do not spin
                continue
            latencies.append(time.perf_counter() - t0)
            progress.requests += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass
class Target:
    """Where one host's Triton answers, as the control machine reaches it."""

    name: str
    http_url: str  #: http://addr:port
    grpc_url: str  #: addr:port
    metrics_url: str  #: http://addr:port (without /metrics)
    #: the host's API key header for the restricted APIs the load test reads (repository index,
    #: configuration, statistics; ``triton_restricted_apis``); inference needs none
    headers: dict = field(default_factory=dict)


@contextlib.contextmanager
def target(fh: FleetHost) -> Iterator[Target]:
    """The host's endpoints: direct, or SSH tunnels (``health_via = "ssh"``), closed on exit
    (tritonfleet.serving.triton_http, with the host's dead-link bound on every tunnel)."""
    with contextlib.ExitStack() as stack:
        try:
            at = stack.enter_context(triton_http.endpoints(fh, fh.address, fh.transport, grpc=True))
        except ConfigError as e:
            raise FleetError(f"{fh.name}: {e}") from e
        yield Target(fh.name, at.http_url, at.grpc_url, at.metrics_url, api_key_header(fh))


def _session(t: Target | None = None) -> requests.Session:
    return triton_http.session(t.headers if t is not None else None)


def ready_models(t: Target, timeout: float = 10) -> list[str]:
    """Models the host has loaded and ready (Triton's repository index)."""
    with _session(t) as s:
        r = s.post(f"{t.http_url}/v2/repository/index", json={"ready": True}, timeout=timeout)
        r.raise_for_status()
        return sorted({m["name"] for m in r.json() if m.get("state", "READY") == "READY"})


def model_config(t: Target, model: str, timeout: float = 10) -> dict:
    with _session(t) as s:
        r = s.get(f"{t.http_url}/v2/models/{model}/config", timeout=timeout)
        if r.status_code != 200:
            raise LoadTestError(
                f"{t.name}: {t.http_url}/v2/models/{model}/config -> HTTP "
                f"{r.status_code} {r.text.strip()[:200]} (is the model loaded? "
                "tritonfleet status shows the models each host serves)"
            )
        return r.json()


@dataclass
class Snapshot:
    counters: ModelCounters | None  #: with the batch sizes run (Triton's statistics extension)
    gpu_utilization: float | None
    cpu_utilization: float | None


def snapshot(t: Target, model: str, timeout: float = 10) -> Snapshot:
    with _session(t) as s:
        r = s.get(f"{t.metrics_url}/metrics", timeout=timeout)
        r.raise_for_status()
        samples = metrics.parse(r.text)
        counters = metrics.model_counters(samples).get(model)
        if counters is not None:
            st = s.get(f"{t.http_url}/v2/models/{model}/stats", timeout=timeout)
            if st.status_code == 200:
                counters.batches = metrics.batch_sizes(st.json())
    return Snapshot(
        counters, metrics.gauge_mean(samples, "nv_gpu_utilization"), metrics.gauge_mean(samples, "nv_cpu_utilization")
    )


def _per_request(total: float, n: float) -> float | None:
    return total / n if n else None


def run_step(
    t: Target,
    model: str,
    config: dict,
    concurrency: int,
    duration: float,
    protocol: str,
    *,
    echo: Callable[[str], None] | None = None,
    timeout: float = 60,
    settle: float = 2.0,
    label: str = "",
) -> Step:
    """One step of load on one model of one host, with Triton's counters read around it."""
    settings = TuneThresholds.from_config(config)
    specs = input_specs(config)
    mod = client_module(protocol)
    inputs = make_inputs(specs, protocol)
    outputs = [mod.InferRequestedOutput(o["name"]) for o in config.get("output") or []] or None
    before = snapshot(t, model)
    progress = Progress()

    async def main() -> tuple[list[float], list[str], float, float]:
        if protocol == "http":
            client = mod.InferenceServerClient(t.http_url.removeprefix("http://"), conn_limit=max(100, concurrency))
        else:
            client = mod.InferenceServerClient(t.grpc_url)
        ticker = None
        try:
            if echo:
                ticker = asyncio.ensure_future(_tick(progress, t.name, model, concurrency, duration, echo))
            cpu0, t0 = _cpu_seconds(), time.perf_counter()
            progress.started = t0
            lat, errs = await _drive(client, model, inputs, outputs, concurrency, duration, progress, timeout)
            return lat, errs, time.perf_counter() - t0, _cpu_seconds() - cpu0
        finally:
            if ticker:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            await client.close()

    lat, errs, wall, cpu = asyncio.run(main())
    # Triton counts a request when its response is released, which can be a moment after the
    # client has it: wait (bounded) until the server's count reaches the client's
    deadline = time.monotonic() + settle
    while True:
        after = snapshot(t, model)
        have = after.counters.requests if after.counters else 0
        base = before.counters.requests if before.counters else 0
        if have - base >= len(lat) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    d = None
    if after.counters is not None:
        d = after.counters - before.counters if before.counters is not None else after.counters
    util = after.cpu_utilization if settings.device == "cpu" else after.gpu_utilization
    n = len(lat)
    lat_ms = [x * 1000 for x in lat]
    return Step(
        host=t.name,
        model=model,
        concurrency=concurrency,
        protocol=protocol,
        duration_s=wall,
        requests=n,
        errors=len(errs),
        throughput=n / wall if wall > 0 else 0.0,
        p50_ms=percentile(lat_ms, 50),
        p95_ms=percentile(lat_ms, 95),
        p99_ms=percentile(lat_ms, 99),
        queue_us_avg=_per_request(d.queue_us, d.requests) if d else None,
        compute_us_avg=_per_request(d.compute_us, d.requests) if d else None,
        compute_input_us_avg=_per_request(d.compute_input_us, d.requests) if d else None,
        compute_infer_us_avg=_per_request(d.compute_infer_us, d.requests) if d else None,
        compute_output_us_avg=_per_request(d.compute_output_us, d.requests) if d else None,
        request_us_avg=_per_request(d.request_us, d.requests) if d else None,
        triton_requests=d.requests if d else None,
        triton_failures=d.failures if d else None,
        batch_avg=_per_request(d.inferences, d.executions) if d else None,
        batch_sizes={str(k): v for k, v in sorted(d.batches.items())} if d else {},
        utilization=util,
        device=settings.device,
        max_batch_size=settings.max_batch_size,
        dynamic_batching=settings.dynamic_batching,
        max_queue_delay_us=settings.max_queue_delay_us,
        preferred_batch_size=list(settings.preferred),
        client_cpu_ms_per_request=cpu / (n + len(errs)) * 1000 if n + len(errs) else None,
        client_core_rate=(n + len(errs)) / cpu if cpu > 0 else None,
        client_busy=cpu / wall if wall > 0 else None,
        first_error=errs[0] if errs else "",
        label=label,
    )


async def _tick(p: Progress, host: str, model: str, c: int, duration: float, echo: Callable[[str], None]) -> None:
    while True:
        await asyncio.sleep(1.0)
        el = time.perf_counter() - p.started
        echo(
            f"[{host} {model} c={c}] {min(el, duration):.0f}/{duration:.0f}s {p.requests} requests "
            f"{p.errors} errors {p.requests / el if el else 0:.1f} inf/s"
        )


def warm_up(t: Target, model: str, config: dict, protocol: str, requests_: int = 8) -> None:
    """A few requests before the first measured step (model and connection warm); not counted."""
    mod = client_module(protocol)
    inputs = make_inputs(input_specs(config), protocol)

    async def main() -> None:
        client = (
            mod.InferenceServerClient(t.http_url.removeprefix("http://"))
            if protocol == "http"
            else mod.InferenceServerClient(t.grpc_url)
        )
        try:
            for _ in range(requests_):
                await client.infer(model, inputs)
        finally:
            await client.close()

    asyncio.run(main())


@dataclass
class HostRun:
    host: str
    steps: list[Step] = field(default_factory=list)
    error: str = ""


def run_host(
    fh: FleetHost,
    models: list[str] | None,
    concurrencies: list[int],
    duration: float,
    protocol: str = "http",
    echo: Callable[[str], None] | None = None,
    warmup: int = 8,
) -> HostRun:
    """Every model (``None``: every model the host has ready) at every concurrency on one host.
    A host that cannot be reached or measured gets ``error`` (naming the host and what to fix).

    The load runs in a child process (``python -m tritonfleet.observability.loadtest``): pyinfra's command
    line monkey-patches this process with gevent, under which gRPC's asyncio client stalls, and
    the child's CPU time is then exactly the load generator's. SSH tunnels stay here."""
    res = HostRun(fh.name)
    try:
        with target(fh) as t:
            res.steps = run_child(t, models, concurrencies, duration, protocol, warmup, echo is not None)
    except LoadTestError as e:
        res.error = str(e)
    except (FleetError, ValueError, *CONNECTION_ERRORS) as e:  # requests' errors are OSErrors
        res.error = (
            f"{fh.name}: {type(e).__name__}: {e} (check that this machine reaches the host's "
            "Triton ports: health_host / ssh_hostname, triton_http_port, triton_grpc_port, "
            'triton_metrics_port; or set health_via = "ssh")'
        )
    return res


def run_target(
    t: Target,
    models: list[str] | None,
    concurrencies: list[int],
    duration: float,
    protocol: str = "http",
    echo: Callable[[str], None] | None = None,
    warmup: int = 8,
    label: str = "",
) -> list[Step]:
    names = list(models) if models else ready_models(t)
    if not names:
        raise LoadTestError(f"{t.name}: no model is ready on {t.http_url}; nothing to load")
    steps = []
    for m in names:
        cfg = model_config(t, m)
        if warmup:
            warm_up(t, m, cfg, protocol, warmup)
        for c in concurrencies:
            step = run_step(t, m, cfg, c, duration, protocol, echo=echo, label=label)
            if echo:
                echo(
                    f"[{t.name} {m} c={c}] done: {step.requests} requests, {step.errors} errors, "
                    f"{step.throughput:.1f} inf/s, p95 {_f(step.p95_ms, '.1f')} ms"
                )
            steps.append(step)
    return steps


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def client_summary(steps: list[Step]) -> dict:
    """The load generator's cost over all steps: CPU ms per request and the rate one core drives."""
    n = sum(s.requests + s.errors for s in steps)
    cpu = sum((s.client_cpu_ms_per_request or 0) * (s.requests + s.errors) / 1000 for s in steps)
    return {
        "requests": n,
        "cpu_s": round(cpu, 3),
        "cpu_ms_per_request": cpu / n * 1000 if n else None,
        "core_rate": n / cpu if cpu > 0 else None,
    }


#: a step whose client used more than this share of one core is marked client-bound
CLIENT_BOUND_BUSY = 0.8


def table(steps: list[Step]) -> str:
    head = [
        "HOST",
        "MODEL",
        "CONC",
        "REQUESTS",
        "ERRORS",
        "INF/S",
        "P50 MS",
        "P95 MS",
        "P99 MS",
        "QUEUE US",
        "COMPUTE US",
        "BATCH",
        "CLIENT CPU",
        "LIMIT",
    ]
    rows = [head]
    for s in steps:
        busy = s.client_busy or 0
        rows.append(
            [
                s.label or s.host,
                s.model,
                str(s.concurrency),
                str(s.requests),
                str(s.errors),
                f"{s.throughput:.1f}",
                _f(s.p50_ms, ".2f"),
                _f(s.p95_ms, ".2f"),
                _f(s.p99_ms, ".2f"),
                _f(s.queue_us_avg, ".0f"),
                _f(s.compute_us_avg, ".0f"),
                _f(s.batch_avg, ".2f"),
                f"{busy * 100:.0f}%",
                "client?" if busy > CLIENT_BOUND_BUSY else "server",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def parse_concurrency(text: str) -> list[int]:
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(c < 1 for c in out):
        raise LoadTestError(f"--concurrency takes numbers >= 1 separated by commas (e.g. 1,4,16,64), not {text!r}")
    return out


def plot(steps: list[Step], path: str, title: str = "") -> None:
    """Throughput and p95 latency against concurrency, one line per host (or label) and model."""
    try:
        import matplotlib
    except ImportError as e:
        raise LoadTestError(
            "--plot needs matplotlib: pip install 'tritonfleet[plot]' (or pip install matplotlib)"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[Step]] = {}
    for s in steps:
        series.setdefault(f"{s.label or s.host} {s.model}", []).append(s)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, ss in series.items():
        ss = sorted(ss, key=lambda s: s.concurrency)
        xs = [s.concurrency for s in ss]
        ax1.plot(xs, [s.throughput for s in ss], marker="o", label=name)
        ax2.plot(xs, [s.p95_ms if s.p95_ms is not None else float("nan") for s in ss], marker="o", label=name)
    ticks = sorted({s.concurrency for s in steps})
    for ax, what in ((ax1, "throughput (inferences/s)"), (ax2, "p95 latency (ms, log scale)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(what)
        ax.grid(True, alpha=0.3)
    ax1.set_ylim(bottom=0)
    ax2.set_yscale("log")
    ax1.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stderr_echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_child(
    t: Target,
    models: list[str] | None,
    concurrencies: list[int],
    duration: float,
    protocol: str,
    warmup: int,
    progress: bool,
    label: str = "",
) -> list[Step]:
    """:func:`run_target` in a fresh interpreter; its progress lines go to this stderr."""
    job = {
        "target": asdict(t),
        "models": models,
        "concurrencies": concurrencies,
        "duration": duration,
        "protocol": protocol,
        "warmup": warmup,
        "progress": progress,
        "label": label,
    }
    # generous bound: every step, its warm-up and its counter reads, plus start-up
    n_models = len(models) if models else 16
    limit = n_models * len(concurrencies) * (duration + 90) + 120
    try:
        res = subprocess.run(
            [sys.executable, "-m", "tritonfleet.observability.loadtest"],
            input=json.dumps(job),
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            timeout=limit,
        )
    except subprocess.TimeoutExpired as e:
        raise LoadTestError(f"{t.name}: the load did not finish within {limit:.0f}s") from e
    try:
        out = json.loads(res.stdout)
    except ValueError:
        raise LoadTestError(
            f"{t.name}: the load generator failed (exit status {res.returncode}): {res.stdout.strip()[-500:]}"
        ) from None
    if out.get("error"):
        raise LoadTestError(out["error"])
    return [Step(**s) for s in out["steps"]]


def _child_errors() -> tuple[type[BaseException], ...]:
    """What the child reports to its parent as the host's error: the host or its settings, a
    connection, a request (anything else is a bug: its traceback)."""
    return (FleetError, ValueError, *CONNECTION_ERRORS, *request_errors())


def _child_main() -> None:
    job = json.loads(sys.stdin.read())
    t = Target(**job["target"])
    try:
        steps = run_target(
            t,
            job["models"],
            job["concurrencies"],
            job["duration"],
            job["protocol"],
            stderr_echo if job["progress"] else None,
            job["warmup"],
            job["label"],
        )
        out: dict = {"steps": [s.as_dict() for s in steps]}
    except LoadTestError as e:
        out = {"error": str(e)}
    except _child_errors() as e:  # reported by the parent
        out = {
            "error": (
                f"{t.name}: {type(e).__name__}: {e} (check that this machine reaches the "
                "host's Triton ports: health_host / ssh_hostname, triton_http_port, "
                'triton_grpc_port, triton_metrics_port; or set health_via = "ssh")'
            )
        }
    print(json.dumps(out))


if __name__ == "__main__":
    _child_main()
