"""What a round of the quarantine receiver does, decided without touching anything: the budget
(at most ``quarantine_budget`` hosts of a group out at once), the alerts it acts on, the hosts it
takes out, leaves in (over budget: alert only) and returns."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ...core.errors import TritonfleetError, UsageError
from ..inventory import FleetHost

QUARANTINE_LABEL = ("quarantine", "true")
BUDGET = re.compile(r"^\s*([0-9]+)\s*(%?)\s*$")


class QuarantineError(TritonfleetError):
    """The receiver could not be asked, or refused a request."""


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def budget_limit(value, size: int) -> int:
    """Hosts of a group of ``size`` that may be out at once: ``value`` is a number of hosts, or
    "P%" of the group (rounded down). ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is neither a number of hosts nor 'P%'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value!r} is below 0")
        return value
    m = BUDGET.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is neither a number of hosts nor 'P%'")
    n = int(m.group(1))
    if not m.group(2):
        return n
    if n > 100:
        raise ValueError(f"{value!r} is more than 100%")
    return math.floor(size * n / 100)


def group_of(fh: FleetHost) -> str:
    return fh.group or "ungrouped"


def limits(hosts: list[FleetHost]) -> dict[str, int]:
    """{group: hosts that may be out at once} from every host's quarantine_budget (the strictest
    of a group's hosts). UsageError naming the host for a value that is not a budget."""
    groups: dict[str, list[FleetHost]] = {}
    for h in hosts:
        groups.setdefault(group_of(h), []).append(h)
    out = {}
    for g, members in groups.items():
        values = []
        for h in members:
            try:
                values.append(budget_limit(h.get("quarantine_budget"), len(members)))
            except ValueError as e:
                raise UsageError(f"{h.name}: quarantine_budget {e} (group data: a number of hosts, or "
                                 "\"P%\" of the host's group)") from e
        out[g] = min(values)
    return out


@dataclass
class Alert:
    """One firing quarantine alert, as Alertmanager reports it."""

    fingerprint: str
    name: str
    host: str
    starts_at: str
    summary: str = ""
    labels: dict = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return f"{self.name}: {self.summary}" if self.summary else self.name

    @classmethod
    def from_alertmanager(cls, a: dict) -> Alert | None:
        """An alert of a webhook payload or of Alertmanager's API (None: not a quarantine alert
        of a host)."""
        labels = a.get("labels") or {}
        if labels.get(QUARANTINE_LABEL[0]) != QUARANTINE_LABEL[1] or not labels.get("host"):
            return None
        fp = str(a.get("fingerprint") or "") or json.dumps(labels, sort_keys=True)
        return cls(fp, str(labels.get("alertname", "?")), str(labels["host"]), str(a.get("startsAt") or ""),
                   str((a.get("annotations") or {}).get("summary") or ""), dict(labels))


@dataclass
class Record:
    """A host out of its load balancer: since when, why, held by an operator or not."""

    host: str
    since: str
    reasons: list[str] = field(default_factory=list)
    held: bool = False
    held_reason: str = ""
    balancer: str = ""
    last_gate: str = ""  # why the last warm gate failed ("" when none ran or it passed)

    @property
    def state(self) -> str:
        return "held" if self.held else "quarantined"


@dataclass
class Plan:
    quarantine: list[tuple[str, list[Alert]]] = field(default_factory=list)
    over_budget: list[tuple[str, list[Alert]]] = field(default_factory=list)
    unknown: list[Alert] = field(default_factory=list)
    no_balancer: list[tuple[str, list[Alert]]] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)


def plan(alerts: dict[str, Alert], acked: dict[str, str], records: dict[str, Record],
         hosts: dict[str, FleetHost], group_limits: dict[str, int], has_balancer: Callable[[FleetHost], bool]) -> Plan:
    """What a round does (pure): hosts to take out (earliest alert first, while their group is
    within its budget), alerts beyond the budget, hosts to return (not held, no quarantine alert
    firing that was not acknowledged)."""
    p = Plan()
    live: dict[str, list[Alert]] = {}
    for fp, a in alerts.items():
        if acked.get(fp) == a.starts_at:
            continue
        if a.host not in hosts:
            p.unknown.append(a)
            continue
        live.setdefault(a.host, []).append(a)
    out = {g: 0 for g in group_limits}
    for r in records.values():
        if r.host in hosts:
            g = group_of(hosts[r.host])
            out[g] = out.get(g, 0) + 1
    order = sorted((h for h in live if h not in records), key=lambda h: (min(a.starts_at for a in live[h]), h))
    for name in order:
        fh = hosts[name]
        if not has_balancer(fh):
            p.no_balancer.append((name, live[name]))
            continue
        g = group_of(fh)
        if out.get(g, 0) < group_limits.get(g, 0):
            p.quarantine.append((name, live[name]))
            out[g] = out.get(g, 0) + 1
        else:
            p.over_budget.append((name, live[name]))
    p.returns = sorted(name for name, r in records.items() if not r.held and name not in live)
    return p
