"""`tritonfleet status --pull`: each host as its own signed report and its pointer on the origin
say, with what is not right (no SSH)."""

from __future__ import annotations

import time

from ...settings.defaults import DEFAULTS
from .origin import PullSite, parse_iso, printable
from .reports import Reports, short
from .signing import pointer_release


def status(hosts: list, origin: PullSite, now: float | None = None) -> list[dict]:
    """Each host as its own signed report says (no SSH): the release it should run (its pointer),
    the one it ran last, the result, when; ``drift`` says what is not right (no report, an
    unsigned, forged or malformed one, an unreadable pointer, a failed run, a stale origin, not on
    its desired release, no run for longer than two converge intervals). Never raises for what a
    report or pointer holds."""
    now = time.time() if now is None else now
    reports = Reports(origin)
    rows = []
    for fh in hosts:
        got, why = reports.check(fh.name)
        rep = got or {}
        ptr, ptr_why = pointer_release(origin.pointer(fh.name))
        want = (ptr or {}).get("release")
        drift = []
        if ptr_why:
            drift.append(ptr_why)
        finished = rep.get("finished")
        stamp = parse_iso(finished)
        age = None if stamp is None else now - stamp
        if why == "no report":
            drift.append("no report (not converging itself: bootstrap it)")
        elif why:
            drift.append(why)
        elif rep.get("result") in ("failed", "refused"):
            drift.append(printable(f"last run {rep['result']}: {rep.get('error') or '?'}"))
        if rep.get("stale"):
            drift.append(printable(rep["stale"]))
        if rep and want and rep.get("release") != want and rep.get("result") != "running":
            drift.append(f"runs {short(rep.get('release'))}, should run {short(want)}")
        limit = 2 * float(fh.get("pull_converge_interval", DEFAULTS["pull_converge_interval"])) + float(
            fh.get("pull_poll_interval", DEFAULTS["pull_poll_interval"])
        )
        if age is not None and age > limit:
            drift.append(f"no run for {age / 60:.0f} min (its timer stopped, or it cannot reach the origin)")
        rows.append(
            {
                "host": fh.name,
                "desired": want,
                "release": rep.get("release"),
                "result": rep.get("result"),
                "finished": finished,
                "age_seconds": None if age is None else round(age),
                "generation": rep.get("generation"),
                "error": printable(rep.get("error") or ""),
                "drift": drift,
            }
        )
    return rows
