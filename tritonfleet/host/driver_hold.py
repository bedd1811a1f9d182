"""The driver hold a failed driver change leaves on a host (tritonfleet.fleet.rollout.driver writes
it, ``tritonfleet status`` reads it): the branch the host stays on, what was tried, why it came
back. Pure text and parsing."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.shell import q

#: the hold (JSON: branch, tried, reason, time)
HOLD_FILE = "/var/lib/tritonfleet/driver-hold.json"


def hold_command(hold: dict) -> str:
    """Shell writing ``hold`` to HOLD_FILE (whole, then renamed)."""
    text = json.dumps(hold, sort_keys=True)
    return (
        f"mkdir -p {q(str(Path(HOLD_FILE).parent))} && printf '%s\\n' {q(text)} > {HOLD_FILE}.tmp && "
        f"mv {HOLD_FILE}.tmp {HOLD_FILE}"
    )


RELEASE_COMMAND = f"rm -f {HOLD_FILE}"


def parse_hold(lines: list[str]) -> dict | None:
    """The hold file's content (the probe's section), None when there is none; an unreadable one is
    a hold whose reason says so (a host is never released by a file it cannot read)."""
    text = "\n".join(lines).strip()
    if not text:
        return None
    try:
        hold = json.loads(text)
    except ValueError:
        return {"branch": None, "reason": f"unreadable hold file {HOLD_FILE}"}
    if not isinstance(hold, dict):
        return {"branch": None, "reason": f"unreadable hold file {HOLD_FILE}"}
    return hold


def describe(hold: dict) -> str:
    """One line for the status table and the rollout's report."""
    if not hold.get("branch"):
        return f"driver held ({hold.get('reason', 'no reason recorded')})"
    tried = f": {hold['tried']} failed its validation" if hold.get("tried") else ""
    why = f" ({hold['reason']})" if hold.get("reason") else ""
    return f"driver held at {hold['branch']}{tried}{why}"
