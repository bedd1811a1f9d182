"""``tritonfleet tune``: judge each model's dynamic batching from the fleet's live metrics.

Per model (per group, or per host): mean queue time against mean compute time per request,
batch efficiency (inferences per execution), the largest batch run, utilization, and advice:

* queue time dominates compute time while utilization stays under ``monitor_low_utilization``
  (the runbook: GPU under 40% while queue time climbs): lower max_queue_delay_microseconds;
* utilization above ``monitor_busy_utilization`` while batches stay below the smallest
  preferred batch size and requests do not already wait longer than they compute: raise
  max_queue_delay_microseconds so the batcher can fill them;
* preferred batch sizes the load never reaches: the batcher waits the whole queue delay for a
  batch that does not come.

Utilization is the host's GPUs' (``nv_gpu_utilization``) for models on GPU instances and
Triton's ``nv_cpu_utilization`` for models whose instance groups are all KIND_CPU. Counters are
read twice, ``window`` seconds apart, and the differences judged (window 0: totals since each
server started). Batch sizes come from Triton's statistics extension (``/v2/models/<m>/stats``),
the settings from the live configuration (``/v2/models/<m>/config``).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.connection_errors import CONNECTION_ERRORS
from ..inventory import roster
from ..inventory.roster import FleetHost, parallel
from ..serving import apikey
from ..settings.defaults import DEFAULTS as d
from . import metrics
from .metrics import HostRead, ModelCounters


@dataclass(frozen=True)
class Thresholds:
    queue_compute_ratio: float = 1.0
    low_utilization: float = 0.4
    busy_utilization: float = 0.8

    @classmethod
    def of(cls, fh: FleetHost) -> Thresholds:
        return cls(
            float(fh.get("monitor_queue_compute_ratio")),
            float(fh.get("monitor_low_utilization")),
            float(fh.get("monitor_busy_utilization")),
        )


@dataclass(frozen=True)
class TuneThresholds:
    """The batching settings of a model's live configuration."""

    max_batch_size: int = 0
    dynamic_batching: bool = False
    max_queue_delay_us: int = 0
    preferred: tuple[int, ...] = ()
    device: str = "gpu"  #: "cpu" when every instance group is KIND_CPU

    @classmethod
    def from_config(cls, cfg: dict) -> TuneThresholds:
        db = cfg.get("dynamic_batching")
        kinds = {g.get("kind", "KIND_AUTO") for g in cfg.get("instance_group") or []}
        return cls(
            max_batch_size=int(cfg.get("max_batch_size") or 0),
            dynamic_batching=db is not None,
            max_queue_delay_us=int((db or {}).get("max_queue_delay_microseconds") or 0),
            preferred=tuple(sorted(int(p) for p in (db or {}).get("preferred_batch_size") or [])),
            device="cpu" if kinds == {"KIND_CPU"} else "gpu",
        )


@dataclass
class TuneRow:
    name: str  #: group or host
    model: str
    hosts: list[str]
    counters: ModelCounters
    settings: TuneThresholds
    utilization: float | None
    seconds: float | None  #: the window; None: totals since each server started
    advice: list[str] = field(default_factory=list)

    @property
    def requests(self) -> float:
        return self.counters.requests

    @property
    def rate(self) -> float | None:
        return self.counters.requests / self.seconds if self.seconds else None

    @property
    def queue_ms(self) -> float | None:
        c = self.counters
        return c.queue_us / c.requests / 1000 if c.requests else None

    @property
    def compute_ms(self) -> float | None:
        c = self.counters
        return c.compute_us / c.requests / 1000 if c.requests else None

    @property
    def batch(self) -> float | None:
        c = self.counters
        return c.inferences / c.executions if c.executions else None

    @property
    def largest_batch(self) -> int | None:
        return max(self.counters.batches) if self.counters.batches else None

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "model": self.model,
            "hosts": self.hosts,
            "window_s": self.seconds,
            "requests": self.requests,
            "requests_per_s": self.rate,
            "failures": self.counters.failures,
            "queue_ms": self.queue_ms,
            "compute_ms": self.compute_ms,
            "batch_efficiency": self.batch,
            "largest_batch": self.largest_batch,
            "batch_sizes": {str(k): v for k, v in sorted(self.counters.batches.items())},
            "device": self.settings.device,
            "utilization": self.utilization,
            "max_batch_size": self.settings.max_batch_size,
            "dynamic_batching": self.settings.dynamic_batching,
            "max_queue_delay_us": self.settings.max_queue_delay_us,
            "preferred_batch_size": list(self.settings.preferred),
            "advice": self.advice,
        }


def _pct(u: float) -> str:
    return f"{u * 100:.0f}%"


def advise(row: TuneRow, t: Thresholds) -> list[str]:
    """The runbook's advice for one row (an empty list: nothing to change, or no traffic)."""
    s, u, dev = row.settings, row.utilization, row.settings.device.upper()
    if not row.requests or row.batch is None:
        return []
    q, c, b = row.queue_ms, row.compute_ms, row.batch
    out = []
    queue_dominates = q > t.queue_compute_ratio * c
    if queue_dominates and u is not None and u < t.low_utilization:
        if s.dynamic_batching and s.max_queue_delay_us > 0:
            out.append(
                f"lower max_queue_delay_microseconds (now {s.max_queue_delay_us}): requests "
                f"wait {q:.1f} ms in the queue against {c:.1f} ms of compute while the {dev} "
                f"is {_pct(u)} busy"
            )
        else:
            out.append(
                f"add instances (instance_group count): requests wait {q:.1f} ms in the "
                f"queue against {c:.1f} ms of compute while the {dev} is {_pct(u)} busy, "
                "with no queue delay set"
            )
    elif queue_dominates and u is None:
        out.append(
            f"requests wait {q:.1f} ms in the queue against {c:.1f} ms of compute; no "
            f"{dev} utilization metric to tell an idle {dev} (lower "
            "max_queue_delay_microseconds) from a busy one (add instances)"
        )
    if u is not None and u >= t.busy_utilization and s.max_batch_size > 1:
        target = s.preferred[0] if s.preferred else s.max_batch_size
        if not s.dynamic_batching and b < target:
            out.append(f"enable dynamic_batching: the {dev} is {_pct(u)} busy running batches of {b:.1f} on average")
        elif s.dynamic_batching and b < target and not queue_dominates:
            out.append(
                f"raise max_queue_delay_microseconds (now {s.max_queue_delay_us}): the {dev} "
                f"is {_pct(u)} busy while batches average {b:.1f}"
                + (f" (smallest preferred batch size {target})" if s.preferred else "")
                + ": a longer wait fills them"
            )
    largest = row.largest_batch
    if s.dynamic_batching and s.preferred and largest is not None:
        never = [p for p in s.preferred if p > largest]
        if never:
            out.append(
                f"preferred_batch_size {', '.join(map(str, never))} never reached "
                f"(largest batch run: {largest}): while no preferred size can be "
                "formed, each batch waits the whole max_queue_delay_microseconds; list "
                "sizes the load reaches"
            )
    return out


def api_key_header(h: FleetHost) -> dict:
    """The header with the host's API key when statistics, configuration or the repository index
    are restricted (triton_restricted_apis): read over the host's SSH connection into memory, never shown ({}
    when there is none: Triton's 403 then names the missing header)."""
    apis = set(h.get("triton_restricted_apis") or [])
    if not apis & {"statistics", "model-config", "model-repository"}:
        return {}
    try:
        ok, text = roster.run(h, apikey.read_command(h.get("triton_api_key_file")), timeout=30)
    except (roster.FleetError, *CONNECTION_ERRORS):  # no connection: the read reports it
        return {}
    key = text.strip().splitlines()[0].strip() if ok and text.strip() else ""
    return {apikey.HEADER: key} if key else {}


def read_fleet(
    hosts: list[FleetHost], window: float, models: set[str] | None = None
) -> tuple[list[tuple[HostRead, HostRead | None]], float | None]:
    """Each host read once (window 0) or twice, ``window`` seconds apart; (reads, seconds)."""

    def connect(h: FleetHost) -> None:  # SSH connections at once; a failure shows below
        with contextlib.suppress(*CONNECTION_ERRORS):
            if h.get("health_via") == "ssh" and not h.pyinfra_host.connected:
                h.pyinfra_host.connect(reason="tritonfleet", show_errors=False, raise_exceptions=True)

    parallel(hosts, connect)
    with contextlib.ExitStack() as stack:
        urls = {}
        for h in hosts:
            try:
                urls[h.name] = stack.enter_context(metrics.endpoints(h))
            except (roster.FleetError, ValueError, *CONNECTION_ERRORS) as e:  # reported per host, the others go on
                urls[h.name] = e

        keys = dict(zip([h.name for h in hosts], parallel(hosts, api_key_header), strict=True))

        def read(h: FleetHost, configs: bool) -> HostRead:
            u = urls[h.name]
            if isinstance(u, Exception):
                return HostRead(h, error=f"no connection: {type(u).__name__}: {u}")
            return metrics.read_host(h, *u, configs=configs, models=models, headers=keys[h.name])

        first = parallel(hosts, lambda h: read(h, True))
        if window <= 0:
            return [(r, None) for r in first], None
        # only the hosts read once are read again; when none was, there is nothing to wait for
        alive = [h for h, r in zip(hosts, first, strict=True) if not r.error]
        if not alive:
            return [(r, r) for r in first], None
        t0 = time.monotonic()
        time.sleep(window)
        again = dict(zip([h.name for h in alive], parallel(alive, lambda h: read(h, False)), strict=True))
        second = [again.get(r.host.name, r) for r in first]
        return list(zip(first, second, strict=True)), time.monotonic() - t0


def rows(
    reads: list[tuple[HostRead, HostRead | None]], seconds: float | None, per_host: bool = False
) -> tuple[list[TuneRow], list[str]]:
    """Rows per (group or host, model) in inventory order, and errors (one per host). A row's
    settings and thresholds are its first host's."""
    errors: list[str] = []
    acc: dict[tuple[str, str], tuple[TuneRow, list[float], Thresholds]] = {}
    for first, second in reads:
        bad = first.error or (second.error if second else None)
        if bad:
            errors.append(f"{first.host.name}: {bad}")
            continue
        h = first.host
        name = h.name if per_host else (h.group or h.name)
        for model, now in (second or first).models.items():
            if model not in first.models or model not in first.configs:
                continue  # loaded between the two reads: no configuration read
            settings = TuneThresholds.from_config(first.configs[model])
            attr = "cpu_utilization" if settings.device == "cpu" else "gpu_utilization"
            us = [getattr(r, attr) for r in (first, second) if r and getattr(r, attr) is not None]
            if (name, model) not in acc:
                acc[(name, model)] = (
                    TuneRow(name, model, [], ModelCounters(), settings, None, seconds),
                    [],
                    Thresholds.of(h),
                )
            row, utils, _ = acc[(name, model)]
            row.hosts.append(h.name)
            row.counters = row.counters + (now - first.models[model] if second else now)
            if us:
                utils.append(sum(us) / len(us))
    out = []
    names = list(dict.fromkeys(name for name, _ in acc))
    for key in sorted(acc, key=lambda k: (names.index(k[0]), k[1])):
        row, utils, thresholds = acc[key]
        row.utilization = sum(utils) / len(utils) if utils else None
        row.advice = advise(row, thresholds)
        out.append(row)
    return out, errors


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rs: list[TuneRow], per_host: bool = False) -> str:
    """The rows as an aligned text table; advice items on lines of their own under each row."""
    head = [
        "HOST" if per_host else "GROUP",
        "MODEL",
        "HOSTS",
        "REQUESTS",
        "REQ/S",
        "QUEUE MS",
        "COMPUTE MS",
        "BATCH",
        "LARGEST",
        "UTIL",
        "QUEUE DELAY US",
        "ADVICE",
    ]
    lines = [head]
    for r in rs:
        util = "-" if r.utilization is None else f"{r.settings.device} {_pct(r.utilization)}"
        delay = str(r.settings.max_queue_delay_us) if r.settings.dynamic_batching else "no batcher"
        advice = r.advice or (["-"] if r.requests else ["no requests"])
        lines.append(
            [
                r.name,
                r.model,
                str(len(r.hosts)),
                f"{r.requests:.0f}",
                _fmt(r.rate, ".2f"),
                _fmt(r.queue_ms, ".2f"),
                _fmt(r.compute_ms, ".2f"),
                _fmt(r.batch, ".2f"),
                "-" if r.largest_batch is None else str(r.largest_batch),
                util,
                delay,
                advice[0],
            ]
        )
        lines += [[""] * (len(head) - 1) + [a] for a in advice[1:]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)) + "  " + line[-1] for line in lines
    )


# ---- a loadtest run as input ---------------------------------------------------------------------

#: throughput growing less than this from one concurrency step to the next counts as levelled off
LEVEL_OFF_GAIN = 0.10
#: the load generator using more than this share of a core: its figures are the client's limit
CLIENT_BUSY = 0.8


def default_thresholds() -> Thresholds:
    """The thresholds' defaults (tritonfleet/settings/defaults.py)."""
    return Thresholds(
        float(d["monitor_queue_compute_ratio"]),
        float(d["monitor_low_utilization"]),
        float(d["monitor_busy_utilization"]),
    )


def _cite(r: dict, source: str) -> str:
    """The figures of one loadtest step, as advice cites them."""
    util = "-" if r.get("utilization") is None else f"{r.get('device', 'gpu')} {_pct(r['utilization'])}"
    return (
        f"[{source}: {r['host']} {r['model']} at concurrency {r['concurrency']}: "
        f"{r['throughput']:.1f} inf/s, p95 {_fmt(r.get('p95_ms'), '.1f')} ms, queue "
        f"{_fmt(r.get('queue_us_avg'), '.0f')} us vs compute {_fmt(r.get('compute_us_avg'), '.0f')} us "
        f"per request, mean batch {_fmt(r.get('batch_avg'), '.2f')}, utilization {util}]"
    )


def loadtest_rows(doc: dict, source: str, thresholds: Callable[[str], Thresholds]) -> list[TuneRow]:
    """Rows from a ``tritonfleet loadtest --json`` document: one per host, model and concurrency
    (name ``<host> c=<n>``), judged by :func:`advise` on the step's Triton figures, plus what only
    a sweep shows (throughput levelling off, a client-bound step). Every advice item ends with
    the figures it used (``source``: how to name the file)."""
    results = doc.get("results")
    if not isinstance(results, list):
        raise ValueError("no 'results' list: not the output of tritonfleet loadtest --json")
    out: list[TuneRow] = []
    by_series: dict[tuple[str, str], list[tuple[dict, TuneRow]]] = {}
    for r in results:
        n = float(r.get("triton_requests") or r["requests"])
        q, c, b = r.get("queue_us_avg"), r.get("compute_us_avg"), r.get("batch_avg")
        counters = ModelCounters(
            requests=n,
            failures=float(r.get("triton_failures") or 0),
            queue_us=(q or 0) * n,
            compute_infer_us=(c or 0) * n,
            inferences=n,
            executions=n / b if b else 0.0,
            batches=Counter({int(k): v for k, v in (r.get("batch_sizes") or {}).items()}),
        )
        settings = TuneThresholds(
            max_batch_size=int(r.get("max_batch_size") or 0),
            dynamic_batching=bool(r.get("dynamic_batching")),
            max_queue_delay_us=int(r.get("max_queue_delay_us") or 0),
            preferred=tuple(sorted(r.get("preferred_batch_size") or [])),
            device=r.get("device") or "gpu",
        )
        row = TuneRow(
            f"{r['host']} c={r['concurrency']}",
            r["model"],
            [r["host"]],
            counters,
            settings,
            r.get("utilization"),
            float(r.get("duration_s") or 0) or None,
        )
        cite = _cite(r, source)
        row.advice = [f"{a} {cite}" for a in advise(row, thresholds(r["host"]))]
        busy = r.get("client_busy")
        if busy is not None and busy > CLIENT_BUSY:
            row.advice.append(
                f"the load generator used {_pct(busy)} of a core here: this step measured the "
                f"client's limit, not the server's (one core drives about "
                f"{_fmt(r.get('client_core_rate'), '.0f')} requests/s); spread the load over more "
                f"cores or machines {cite}"
            )
        by_series.setdefault((r["host"], r["model"]), []).append((r, row))
        out.append(row)
    for series in by_series.values():
        series.sort(key=lambda x: x[0]["concurrency"])
        for (a, _), (b, row_b) in zip(series, series[1:], strict=False):
            ta, tb = a["throughput"], b["throughput"]
            pa, pb = a.get("p95_ms"), b.get("p95_ms")
            if ta > 0 and tb < ta * (1 + LEVEL_OFF_GAIN) and pa and pb and pb > pa:
                row_b.advice.append(
                    f"throughput levels off: {ta:.1f} -> {tb:.1f} inf/s from concurrency "
                    f"{a['concurrency']} to {b['concurrency']} while p95 rises {pa:.1f} -> {pb:.1f} ms: "
                    "the server is saturated at about "
                    f"{a['concurrency']} requests in flight; more only queues (add instances or hosts, "
                    f"or cap client concurrency there) {_cite(b, source)}"
                )
                break
    return out
