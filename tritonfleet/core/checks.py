"""The one rule that tells a verification by its operation's name: every check's name starts
with ``check:`` (tritonfleet.pyinfra_ext.check makes them). The fact memo and the rollout's
reading of pyinfra's results use it; nothing here touches pyinfra."""

from __future__ import annotations

CHECK_PREFIX = "check:"


def is_check(name: str) -> bool:
    """Whether an operation named ``name`` (as pyinfra names it: its deploy's name, " | ", its own
    name) is a verification: its own name starts with ``check:``. A check changes nothing on the
    host, even where pyinfra counts it as a success ("Success", ``-y --json``'s ``success``)."""
    return any(part.startswith(CHECK_PREFIX) for part in name.split(" | "))
