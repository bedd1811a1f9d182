"""The rollout's report: a row a host (batch, result, version before and after, why it failed),
the table ``tritonfleet rollout`` prints, and the rollout's ending, one for the push and the pull
rollouts (tritonfleet.fleet.pull.rollout): its time, the journal's end, the exit status."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from . import driver, perfgate, traffic
from .journal import Journal


@dataclass
class HostResult:
    host: str
    batch: int | None = None
    result: str = "not touched"
    seconds: float = 0.0
    before: str = "-"
    after: str = "-"
    detail: str = ""
    failure: dict | None = None  # the full failure report (tritonfleet.core.report.Failure.to_json)

    @property
    def ok(self) -> bool:
        return self.result in ("updated", "unchanged")


@dataclass
class Report:
    inventory: str
    deploy: str
    batches: list[list[str]]
    hosts: list[HostResult] = field(default_factory=list)
    halted: str = ""
    seconds: float = 0.0
    log_dir: str = ""
    perf: dict = field(default_factory=dict)  #: --perf-gate: per canary, before, after, verdict
    staged: dict = field(default_factory=dict)  #: --stage: {"seconds", "hosts", "failed"}
    capacity: list = field(default_factory=list)  #: capacity checks per batch (tritonfleet.fleet.rollout.traffic)
    canary: dict = field(default_factory=dict)  #: the traffic canary's share, looks and verdict
    driver: dict = field(default_factory=dict)  #: a driver change: per host, from, to, validations, hold

    @property
    def ok(self) -> bool:
        return not self.halted and all(h.ok for h in self.hosts)

    def to_json(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


DETAIL_WIDTH = 100  # characters of a host's detail in its row; a longer one is printed whole below the table


def table(report: Report) -> str:
    rows = [("HOST", "BATCH", "RESULT", "TIME", "BEFORE", "AFTER", "DETAIL")]
    cut = [r for r in report.hosts if len(r.detail) > DETAIL_WIDTH]
    for r in report.hosts:
        detail = r.detail if len(r.detail) <= DETAIL_WIDTH else f"{r.detail[: DETAIL_WIDTH - 12]}... (below)"
        rows.append(
            (r.host, str(r.batch or "-"), r.result, f"{r.seconds:.1f}s" if r.batch else "-", r.before, r.after, detail)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)) + "  " + row[-1] for row in rows]
    lines += [f"{r.host}: {r.detail}" for r in cut]
    lines += perfgate.lines(report.perf)
    lines += traffic.lines(report)
    lines += driver.lines(report.driver)
    verdict = "OK" if report.ok else ("HALTED" if report.halted else "FAILED")
    lines.append(
        f"{verdict}: {sum(r.ok for r in report.hosts)}/{len(report.hosts)} host(s) on the new "
        f"version in {report.seconds:.1f}s"
    )
    return "\n".join(lines)


def finish(
    report: Report,
    journal: Journal,
    started: float,
    echo: Callable[[str], None],
    wind_down: Callable[[Report], None] | None = None,
    **end,
) -> Report:
    """The end of a rollout, push or pull: its time since ``started`` (time.monotonic), the hosts
    it never reached keep the version they had, the HALTED line, then ``wind_down`` (the push
    rollout's traffic: weights back, its capacity and canary rows) and the journal's ``end``
    (with ``end``'s fields): from there on ``--resume`` has nothing to go on with."""
    report.seconds = time.monotonic() - started
    for r in report.hosts:
        if r.result == "not touched" and r.after == "-":
            r.after = r.before
    if report.halted:
        echo(f"HALTED: {report.halted}")
    if wind_down is not None:
        wind_down(report)
    journal.write("end", ok=report.ok, halted=report.halted, **end)
    return report


def exit_status(report: Report, plan_only: bool = False) -> int:
    """The rollout command's exit status: 0 when every host ended on the new version (a plan
    only: when nothing halted it), else 1."""
    return 0 if report.ok or plan_only and not report.halted else 1
