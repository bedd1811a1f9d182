"""Pull mode's reports, read on the control side: each host's signed report on the origin,
verified against its enrolled report key and checked for shape, and the one-line words for a
person."""

from __future__ import annotations

import json
from pathlib import Path

from .origin import (
    HOST_SIGNERS,
    MAX_SMALL,
    REPORT_NAMESPACE,
    RESULTS,
    PullSite,
    is_release_id,
    parse_iso,
    printable,
)
from .signing import verify


class Reports:
    """The hosts' signed reports on the origin, read and verified again only when a file changed
    (a stat a host). A report counts only when its host's report key signed it (host-signers)."""

    def __init__(self, origin: PullSite):
        self.origin = origin
        self._seen: dict[str, tuple[int, int, dict | None, str]] = {}

    def read(self, host: str) -> dict | None:
        """The host's report when it is signed by the host and well formed, else None."""
        return self.check(host)[0]

    def check(self, host: str) -> tuple[dict | None, str]:
        """(the report, "") or (None, why not): "no report", or the report is unreadable, not
        signed, its signature refused, or malformed."""
        path = self.origin.report(host)
        try:
            st = path.stat()
        except OSError:
            return None, "no report"
        seen = self._seen.get(host)
        if seen and seen[:2] == (st.st_mtime_ns, st.st_size):
            return seen[2], seen[3]
        rep, why = self._verify(host, path, st.st_size)
        self._seen[host] = (st.st_mtime_ns, st.st_size, rep, why)
        return rep, why

    def _verify(self, host: str, path: Path, size: int) -> tuple[dict | None, str]:
        if size > MAX_SMALL:
            return None, f"report unreadable: {size} bytes (more than {MAX_SMALL})"
        try:
            outer = json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            return None, f"report unreadable: {printable(e)[:120]}"
        if not isinstance(outer, dict) or not isinstance(outer.get("payload"), str):
            return None, "report not signed (no signed payload: its host runs an older agent, or it is forged)"
        signature = outer.get("signature")
        if not isinstance(signature, str) or not signature.strip():
            return None, "report not signed (no signature)"
        signers = self.origin.root / HOST_SIGNERS
        if not signers.is_file():
            return None, f"report signature refused: {signers} missing (tritonfleet bootstrap enrols the hosts' keys)"
        why = verify(signers, outer["payload"].encode(), signature, identity=host, namespace=REPORT_NAMESPACE)
        if why:
            return None, f"report signature refused: {printable(why)[:160]}"
        try:
            rep = json.loads(outer["payload"])
        except ValueError as e:
            return None, f"report malformed: {printable(e)[:120]}"
        bad = report_problem(host, rep)
        return (None, f"report malformed: {bad}") if bad else (rep, "")


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def report_problem(host: str, rep: object) -> str:
    """What is wrong with a report payload's shape ("" when nothing): what the rollout and status
    read of it has the types they expect."""
    if not isinstance(rep, dict):
        return "not an object"
    checks = (
        ("host", rep.get("host") == host, f"names host {printable(rep.get('host'))[:40]!r}"),
        ("release", rep.get("release") is None or is_release_id(rep.get("release")), "release is not a release id"),
        (
            "generation",
            rep.get("generation") is None or _int(rep.get("generation")),
            "generation is not a whole number",
        ),
        ("result", rep.get("result") in (*RESULTS, "running"), "result is not ok, failed, refused or running"),
        (
            "started",
            rep.get("started") is None or parse_iso(rep.get("started")) is not None,
            "started is not a time like 2026-01-02T03:04:05Z",
        ),
        (
            "finished",
            rep.get("finished") is None or parse_iso(rep.get("finished")) is not None,
            "finished is not a time like 2026-01-02T03:04:05Z",
        ),
        ("error", isinstance(rep.get("error", ""), str), "error is not text"),
        ("stale", isinstance(rep.get("stale", ""), str), "stale is not text"),
        ("changed", rep.get("changed") is None or _int(rep.get("changed")), "changed is not a whole number"),
        ("failure", rep.get("failure") is None or isinstance(rep.get("failure"), dict), "failure is not an object"),
    )
    return next((why for _, ok, why in checks if not ok), "")


def short(release: str | None) -> str:
    return printable(release or "-")[:12]


def describe(rep: dict | None, why: str = "") -> str:
    """One line of a host's report for a person (control characters escaped)."""
    if not rep:
        return why or "no report"
    when = rep.get("finished") or rep.get("started") or "?"
    text = f"{rep.get('result', '?')} on {short(rep.get('release'))} at {when}"
    return printable(f"{text}: {rep['error']}" if rep.get("error") else text)
