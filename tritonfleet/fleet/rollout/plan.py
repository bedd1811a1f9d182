"""The rollout's plan: the canary and the batches, in inventory order, and a failed plan's own
words (pre-flight's message, from pyinfra's output)."""

from __future__ import annotations

import math

from ...core.errors import UsageError


class RolloutError(UsageError, RuntimeError):
    """The rollout cannot start or resume as asked (arguments, journal): exit status 2."""


def parse_batch(batch: str | int, total: int) -> int:
    """Batch size: N hosts, or P% of the target hosts (at least 1)."""
    text = str(batch).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            return max(1, math.ceil(total * pct / 100))
        n = int(text)
        if n < 1:
            raise ValueError
        return n
    except ValueError:
        raise RolloutError(
            f"--batch must be a number of hosts (>= 1) or a percentage like 25%, not {batch!r}"
        ) from None


def parse_max_fail(max_fail: str | int, total: int) -> int:
    """Failures tolerated: N hosts, or P% of the ``total`` target hosts, rounded down (10% of
    9 hosts tolerates none)."""
    text = str(max_fail).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct <= 100:
                raise ValueError
            return math.floor(total * pct / 100)
        n = int(text)
        if n < 0:
            raise ValueError
        return n
    except ValueError:
        raise RolloutError(
            f"--max-fail must be a number of hosts (>= 0) or a percentage of the targets like 10%, not {max_fail!r}"
        ) from None


def plan_batches(names: list[str], canary: int, batch: str | int) -> list[list[str]]:
    """Canary hosts first (a batch of their own), then batches of the rest, in inventory order."""
    if canary < 0:
        raise RolloutError("--canary must be >= 0")
    out: list[list[str]] = []
    head, rest = names[:canary], names[canary:]
    if head:
        out.append(head)
    size = parse_batch(batch, len(names))
    out += [rest[i : i + size] for i in range(0, len(rest), size)]
    return out


def plan_error(log: str) -> list[str]:
    """The part of a failed plan's output that says why (pre-flight message, without tracebacks)."""
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "pre-flight failed" in ln), max(0, len(lines) - 12))
    out = []
    for ln in lines[start:]:
        if ln.startswith("Traceback"):
            break
        out.append(ln)
    return out[:20]
