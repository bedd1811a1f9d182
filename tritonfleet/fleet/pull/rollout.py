"""The pull-mode rollout: the push rollout's plan (canary, batches, failure budget, rollback,
journal) with each batch published instead of deployed, and the hosts' reports awaited."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ...core.errors import UsageError
from ...inventory import roster
from ...settings.defaults import DEFAULTS
from ..rollout.journal import JOURNAL, Journal
from ..rollout.plan import RolloutError, parse_max_fail, plan_batches
from ..rollout.report import HostResult, Report, finish
from .origin import INCLUDE, RESULTS, PullSite, is_release_id
from .release import host_entries, publish_release
from .reports import Reports, describe, short
from .signing import check_sign_key, pointer_release, publish_desired


def rollout(
    inventory: str,
    deploy: str,
    origin: PullSite,
    key: Path,
    *,
    limit: list[str] | None = None,
    canary: int = 1,
    batch: str | int = "25%",
    max_fail: str | int = 0,
    data: dict | None = None,
    timeout: float | None = None,
    include: tuple[str, ...] = INCLUDE,
    echo: Callable[[str], None] = print,
    poll: float = 1.0,
):
    """Publish the repository (``deploy`` and what ``include`` names, from the current directory)
    as a release, then move the targets to it batch by batch: canary first, each batch's pointers
    published and its hosts' reports awaited; a host that fails (or does not report within
    ``timeout``) is pointed back at the release it ran before; more than ``max_fail`` failures
    halt the rollout, the hosts not reached yet keep their pointers. Returns the push rollout's
    Report (tritonfleet.fleet.rollout), so both modes print and exit alike."""
    parse_max_fail(max_fail, 0)  # its form (N or P%), before anything runs
    check_sign_key(key)
    t_start = time.monotonic()
    try:
        hosts = roster.load_inventory(inventory, data=data, limit=limit)
        batches = plan_batches([h.name for h in hosts], canary, batch)
        max_fail = parse_max_fail(max_fail, len(hosts))  # P%: of the targets, rounded down
    except (roster.FleetError, RolloutError) as e:
        raise UsageError(str(e)) from e
    names = [h.name for h in hosts]
    wait = float(
        timeout if timeout is not None else hosts[0].get("pull_report_timeout", DEFAULTS["pull_report_timeout"])
    )
    report = Report(inventory, deploy, batches, [HostResult(n) for n in names])
    with origin.lock(f"pull rollout of {deploy}"):
        sha = publish_release(origin, hosts, deploy, Path.cwd(), include)
        entries, _ = host_entries(hosts, Path.cwd())
        ttl = float(hosts[0].get("pull_pointer_ttl", DEFAULTS["pull_pointer_ttl"]))
        rollout_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{sha[:8]}"
        logs = Path(os.environ.get("TRITONFLEET_LOG_DIR", ".tritonfleet/rollouts")) / rollout_id
        logs.mkdir(parents=True, exist_ok=True)
        report.log_dir = str(logs)
        journal = Journal(logs / JOURNAL)
        journal.write(
            "start",
            mode="pull",
            inventory=inventory,
            deploy=deploy,
            origin=str(origin.root),
            release=sha,
            limit=list(limit or []),
            canary=canary,
            batch=str(batch),
            max_fail=max_fail,
            batches=batches,
            hosts=names,
            cwd=os.getcwd(),
            pid=os.getpid(),
        )
        echo(
            f"pull rollout of release {short(sha)} ({deploy}) to {len(names)} host(s) of {inventory} through "
            f"{origin.root}: {len(batches)} batch(es) {[len(b) for b in batches]}, canary {min(canary, len(names))}, "
            f"max {max_fail} failure(s), {wait:.0f} s a batch for the reports; journal in {logs}"
        )
        reports = Reports(origin)
        run = _PullRun(origin, key, sha, rollout_id, report, journal, reports, echo, wait, poll, max_fail, canary)
        run.entries, run.ttl = entries, ttl
        try:
            run.before()
            if run.failures <= max_fail:
                run.batches(batches)
            else:
                report.halted = f"{run.failures} host(s) never reported (not converging themselves; max {max_fail})"
        except KeyboardInterrupt:
            report.halted = (
                f"interrupted (Ctrl-C) during {run.current or 'the start'}: the pointers published so far "
                "stay; `tritonfleet status --pull ORIGIN` shows where each host is"
            )
        # the hosts it reached (a batch): the ending fills in only those it did not reach
        results = {r.host: asdict(r) for r in report.hosts if r.batch}
        finish(report, journal, t_start, echo, results=results)
    return report


class _PullRun:
    def __init__(self, origin, key, sha, rollout_id, report, journal, reports, echo, wait, poll, max_fail, canary):
        self.origin, self.key, self.sha, self.rollout_id = origin, key, sha, rollout_id
        self.report, self.journal, self.reports, self.echo = report, journal, reports, echo
        self.wait, self.poll, self.max_fail, self.canary = wait, poll, max_fail, canary
        self.results = {r.host: r for r in report.hosts}
        self.was: dict[str, dict | None] = {}  # each host's own earlier pointer (release, host data)
        self.entries: dict[str, dict] = {}  # each host's data for the new release
        self.ttl: float | None = None
        self.unreachable: list[str] = []
        self.failures = 0
        self.current = ""

    def before(self) -> None:
        """Where every target is: its pointer's release and its last report. A host that never
        reported is not converging itself (no bootstrap, or gone): not touched, a failure."""
        for name, r in self.results.items():
            # what a host goes back to comes from the control machine's own pointer, never a report
            self.was[name], _ = pointer_release(self.origin.pointer(name))
            rep, why = self.reports.check(name)
            r.before = short((rep or {}).get("release"))
            if rep is None:
                r.result = "unreachable"
                r.detail = (
                    "no report on the origin: not converging itself (bootstrap it)"
                    if why == "no report"
                    else f"{why}: not counted"
                )
                self.unreachable.append(name)
        self.failures = len(self.unreachable)
        self.journal.write(
            "before",
            hosts={
                n: {"pointer": (self.was[n] or {}).get("release"), "report": self.reports.read(n)} for n in self.results
            },
        )
        if self.unreachable:
            self.echo(f"never reported (not touched): {', '.join(self.unreachable)}")

    def batches(self, batches: list[list[str]]) -> None:
        for i, b in enumerate(batches, 1):
            todo = [n for n in b if n not in self.unreachable]
            if not todo:
                continue
            label = "canary" if i == 1 and self.canary else f"batch {i}/{len(batches)}"
            self.current = label
            t0 = time.monotonic()
            gen = publish_desired(
                self.origin,
                self.key,
                dict.fromkeys(todo, self.sha),
                self.rollout_id,
                {n: self.entries.get(n) for n in todo},
                self.ttl,
            )
            self.journal.write("batch", index=i, hosts=todo, generation=gen)
            self.echo(
                f"[{label}] release {short(self.sha)} published for {len(todo)} host(s); waiting for their reports"
            )
            outcome = self.await_reports(todo, gen, self.sha)
            failed = {n: why for n, (ok, why, _) in outcome.items() if not ok}
            elapsed = time.monotonic() - t0
            for n in todo:
                r = self.results[n]
                r.batch, r.seconds = i, elapsed
                rep = outcome[n][2]
                r.after = short((rep or {}).get("release"))
                if n in failed:
                    r.result, r.detail = "failed", failed[n]
                    r.failure = (rep or {}).get("failure")
                else:
                    r.result = "updated" if (rep or {}).get("changed", 1) else "unchanged"
            if failed:
                self.echo(f"[{label}] failed: " + "; ".join(f"{n}: {w}" for n, w in failed.items()))
                self.roll_back(list(failed), i)
            self.failures += len(failed)
            self.journal.write(
                "batch-done", index=i, failures=self.failures, results={n: asdict(self.results[n]) for n in todo}
            )
            self.echo(f"[{label}] done in {elapsed:.1f}s: " + ", ".join(f"{n} {self.results[n].result}" for n in todo))
            if self.failures > self.max_fail:
                left = sum(len([n for n in bb if n not in self.unreachable]) for bb in batches[i:])
                self.report.halted = (
                    f"{self.failures} failure(s), more than --max-fail {self.max_fail}: halted after "
                    f"{label}; {left} host(s) not touched"
                )
                return

    def await_reports(
        self, hosts: list[str], generation: int, release: str
    ) -> dict[str, tuple[bool, str, dict | None]]:
        """Each host's verdict once its report of ``generation`` (or a later one) is final: (ok,
        why not, the report); a host with no such report within the wait is failed."""
        pending, out = set(hosts), {}
        deadline = time.monotonic() + self.wait
        while pending:
            for n in sorted(pending):
                rep = self.reports.read(n)  # signed by the host and well formed, else None
                if not rep or (rep.get("generation") or 0) < generation or rep.get("result") not in RESULTS:
                    continue
                ok = rep["result"] == "ok" and rep.get("release") == release
                out[n] = (ok, "" if ok else describe(rep), rep)
                pending.discard(n)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        for n in pending:
            rep, why = self.reports.check(n)
            out[n] = (
                False,
                f"no report of release {short(release)} within {self.wait:.0f} s (last: {describe(rep, why)})",
                rep,
            )
        return out

    def roll_back(self, failed: list[str], index: int) -> None:
        # back to the host's own earlier pointer: its release and its data (a rollout of new data
        # alone keeps the release id)
        back = {
            n: self.was[n]["release"]
            for n in failed
            if self.was.get(n)
            and is_release_id(self.was[n]["release"])
            and (self.was[n]["release"] != self.sha or self.was[n].get("host_data") != self.entries.get(n))
        }
        for n in failed:
            if n not in back:
                self.results[n].detail += " (no earlier release on the origin: nothing to roll back to)"
        if not back:
            return
        self.echo(f"rolling back {', '.join(back)} to the release each ran before")
        gen = publish_desired(
            self.origin,
            self.key,
            back,
            self.rollout_id,
            {n: (self.was[n] or {}).get("host_data") for n in back},
            self.ttl,
        )
        self.journal.write("rollback", index=index, hosts=back, generation=gen)
        by_release: dict[str, list[str]] = {}
        for n, rel in back.items():
            by_release.setdefault(rel, []).append(n)
        for rel, names in by_release.items():
            for n, (ok, why, rep) in self.await_reports(names, gen, rel).items():
                r = self.results[n]
                r.after = short((rep or {}).get("release"))
                if ok:
                    r.result = "rolled back"
                else:
                    r.result, r.detail = "rollback failed", f"{r.detail}; rollback: {why}"
