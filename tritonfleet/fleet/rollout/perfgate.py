"""The performance gate of ``tritonfleet rollout --perf-gate``: a short fixed load on each canary
before and after its update (``tritonfleet loadtest``'s load generator, one model, one
concurrency), and a verdict: the canary fails when its throughput dropped, or its p95 latency
rose, by more than the tunables allow. The rollout then rolls it back like a canary that failed
its health gate, and halts.

Tunables (group data): ``perf_gate_model`` (None: the first model the canary serves),
``perf_gate_concurrency``, ``perf_gate_duration``, ``perf_gate_max_throughput_drop``,
``perf_gate_max_p95_rise``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from ...core.connection_errors import CONNECTION_ERRORS
from ...core.errors import TritonfleetError
from ...inventory.roster import FleetError, FleetHost
from ...observability import loadtest


class PerfGateError(TritonfleetError, RuntimeError):
    pass


@dataclass
class Measurement:
    model: str
    concurrency: int
    duration_s: float
    requests: int
    errors: int
    throughput: float
    p95_ms: float | None
    first_error: str = ""

    def summary(self) -> str:
        p95 = "-" if self.p95_ms is None else f"{self.p95_ms:.1f}"
        err = f", {self.errors} errors" if self.errors else ""
        return f"{self.throughput:.1f} inf/s, p95 {p95} ms ({self.requests} requests{err})"


@dataclass(frozen=True)
class Limits:
    max_throughput_drop: float
    max_p95_rise: float


def judge(before: Measurement, after: Measurement, limits: Limits) -> str:
    """Why ``after`` fails against ``before`` ("" when it passes)."""
    why = []
    if after.errors or not after.requests:
        why.append(
            f"{after.errors} of {after.requests + after.errors} requests failed after the update"
            + (f" (first: {after.first_error})" if after.first_error else "")
        )
    if before.throughput > 0:
        drop = 1 - after.throughput / before.throughput
        if drop > limits.max_throughput_drop:
            why.append(
                f"throughput {before.throughput:.1f} -> {after.throughput:.1f} inf/s "
                f"(-{drop * 100:.0f}%, perf_gate_max_throughput_drop allows "
                f"-{limits.max_throughput_drop * 100:.0f}%)"
            )
    if before.p95_ms and after.p95_ms is not None:
        rise = after.p95_ms / before.p95_ms - 1
        if rise > limits.max_p95_rise:
            why.append(
                f"p95 {before.p95_ms:.1f} -> {after.p95_ms:.1f} ms (+{rise * 100:.0f}%, "
                f"perf_gate_max_p95_rise allows +{limits.max_p95_rise * 100:.0f}%)"
            )
    return "; ".join(why)


def measure(fh: FleetHost, model: str | None = None) -> Measurement:
    """The gate's fixed load on one host. ``model`` None: ``perf_gate_model``, else the first
    model the host serves."""
    conc = int(fh.get("perf_gate_concurrency"))
    duration = float(fh.get("perf_gate_duration"))
    model = model or fh.get("perf_gate_model")
    try:
        with loadtest.target(fh) as t:
            if not model:
                ready = loadtest.ready_models(t)
                if not ready:
                    raise PerfGateError(f"{fh.name}: no model is ready to measure (set perf_gate_model)")
                model = ready[0]
            [step] = loadtest.run_child(t, [model], [conc], duration, "http", warmup=8, progress=False)
    except loadtest.LoadTestError as e:
        raise PerfGateError(str(e)) from e
    except PerfGateError:
        raise
    except (FleetError, ValueError, *CONNECTION_ERRORS) as e:  # named with the host
        raise PerfGateError(f"{fh.name}: {type(e).__name__}: {e}") from e
    return Measurement(
        model, conc, step.duration_s, step.requests, step.errors, step.throughput, step.p95_ms, step.first_error
    )


class Gate:
    """Before/after measurements of the canary hosts of one rollout."""

    def __init__(self, echo: Callable[[str], None] = print):
        self.echo = echo
        self.before: dict[str, Measurement] = {}
        self.after: dict[str, Measurement] = {}
        self.verdict: dict[str, str] = {}

    def measure_before(self, hosts: list[FleetHost]) -> None:
        """Raises :class:`PerfGateError` (nothing changed yet) when a host cannot be measured."""
        for fh in hosts:  # one after the other: each measurement has the control machine alone
            m = measure(fh)
            if m.errors or not m.requests:
                raise PerfGateError(
                    f"{fh.name}: the performance gate's load failed before the update "
                    f"({m.errors} errors; first: {m.first_error}); nothing was changed"
                )
            self.before[fh.name] = m
            self.echo(f"[perf gate] {fh.name} before: {m.model} at concurrency {m.concurrency}: {m.summary()}")

    def measure_after(self, hosts: list[FleetHost]) -> dict[str, str]:
        """Measure each host again; {host: why it fails} for those that fail."""
        failed = {}
        for fh in hosts:
            b = self.before.get(fh.name)
            if b is None:
                continue
            try:
                a = measure(fh, b.model)
            except PerfGateError as e:
                failed[fh.name] = self.verdict[fh.name] = f"performance gate: {e}"
                continue
            self.after[fh.name] = a
            why = judge(
                b, a, Limits(float(fh.get("perf_gate_max_throughput_drop")), float(fh.get("perf_gate_max_p95_rise")))
            )
            self.verdict[fh.name] = f"failed: {why}" if why else "passed"
            self.echo(
                f"[perf gate] {fh.name} after: {a.model} at concurrency {a.concurrency}: "
                f"{a.summary()}: {self.verdict[fh.name]}"
            )
            if why:
                failed[fh.name] = f"performance gate: {why}"
        return failed

    def report(self) -> dict:
        return {
            n: {
                "before": asdict(b),
                "after": asdict(self.after[n]) if n in self.after else None,
                "verdict": self.verdict.get(n, "not measured after"),
            }
            for n, b in self.before.items()
        }


def lines(perf: dict) -> list[str]:
    """The report's measurements (``Gate.report()``), a line per canary."""
    out = []
    for n, r in perf.items():
        b = Measurement(**r["before"])
        a = Measurement(**r["after"]) if r.get("after") else None
        out.append(
            f"perf gate  {n}: {b.model} c={b.concurrency}: before {b.summary()}; after "
            f"{a.summary() if a else '-'}: {r['verdict']}"
        )
    return out
