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
from ...inventory.roster import FleetHost

QUARANTINE_LABEL = ("quarantine", "true")
BUDGET = re.compile(r"^\s*([0-9]+)\s*(%?)\s*$")
#: the longest ``by``/``reason`` text a request may leave in the logs and the state
MAX_TEXT = 200


class QuarantineError(TritonfleetError):
    """The receiver could not be asked, or refused a request."""


def now_iso(at: float | None = None) -> str:
    """``at`` (epoch seconds; now when None) as the receiver writes times."""
    t = datetime.now(timezone.utc) if at is None else datetime.fromtimestamp(at, timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def clean(value, limit: int = MAX_TEXT) -> str:
    """A caller's text fit for a log line: at most ``limit`` characters, every control or other
    unprintable character escaped (a newline cannot forge a second journal line)."""
    text = str(value)
    cut = len(text) > limit
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return text + ("..." if cut else "")


def _strings(value, what: str) -> str | None:
    if not isinstance(value, dict):
        return f"{what} is {type(value).__name__}, not an object"
    bad = [k for k, v in value.items() if not isinstance(v, str)]
    return f"{what} {clean(bad[0], 40)!r} is not a string" if bad else None


def alert_shape_error(a, api: bool = False) -> str | None:
    """Why ``a`` is not an alert as Alertmanager sends it (its webhook's, or with ``api`` its API
    v2's, where ``status`` is an object); None when it is one."""
    if not isinstance(a, dict):
        return f"an alert is {type(a).__name__}, not an object"
    why = _strings(a.get("labels"), "labels") or (
        _strings(a["annotations"], "annotations") if a.get("annotations") is not None else None
    )
    if why:
        return why
    for key in ("fingerprint", "startsAt") + (() if api else ("status",)):
        if a.get(key) is not None and not isinstance(a[key], str):
            return f"{key} is {type(a[key]).__name__}, not a string"
    if api and not (isinstance(a.get("status"), dict) and isinstance(a["status"].get("state"), str)):
        return "status is not an object with a state"
    return None


def webhook_alerts(payload) -> tuple[list[dict], list[str]]:
    """The alerts of an Alertmanager webhook payload and why any was skipped. ValueError (the
    request is refused, nothing is queued) when the payload itself is not of that shape."""
    if not isinstance(payload, dict):
        raise ValueError("the body is not a JSON object")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise ValueError(f"'alerts' is {type(alerts).__name__}, not a list (Alertmanager's webhook payload)")
    good, skipped = [], []
    for i, a in enumerate(alerts):
        why = alert_shape_error(a)
        if why:
            skipped.append(f"alert {i}: {why}")
        else:
            good.append(a)
    return good, skipped


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
                raise UsageError(
                    f'{h.name}: quarantine_budget {e} (group data: a number of hosts, or "P%" of the host\'s group)'
                ) from e
        out[g] = min(values)
    return out


@dataclass
class FiringAlert:
    """One firing quarantine alert, as Alertmanager reports it."""

    fingerprint: str
    name: str
    host: str
    starts_at: str
    summary: str = ""
    labels: dict = field(default_factory=dict)
    fault_seen: str = ""  # the collector's time of the fault (the rule's annotation), "" when none

    @property
    def reason(self) -> str:
        return f"{self.name}: {self.summary}" if self.summary else self.name

    @classmethod
    def from_alertmanager(cls, a: dict) -> FiringAlert | None:
        """An alert of a webhook payload or of Alertmanager's API (None: not a quarantine alert
        of a host)."""
        labels = a.get("labels") or {}
        if (
            not isinstance(labels, dict)
            or labels.get(QUARANTINE_LABEL[0]) != QUARANTINE_LABEL[1]
            or not labels.get("host")
        ):
            return None
        fp = str(a.get("fingerprint") or "") or json.dumps(labels, sort_keys=True)
        notes = a.get("annotations") if isinstance(a.get("annotations"), dict) else {}
        return cls(
            fp,
            clean(labels.get("alertname", "?")),
            clean(labels["host"]),
            str(a.get("startsAt") or ""),
            clean(notes.get("summary") or ""),
            dict(labels),
            clean(notes.get("fault_seen") or "", 40),
        )


def epoch(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time as Alertmanager writes it (nanoseconds, ``Z``
    or an offset), or of a number of seconds; None when ``text`` is neither."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    if "." in text:  # Python reads at most microseconds: the fraction is cut to six digits
        head, _, rest = text.partition(".")
        digits = "".join(c for c in rest if c.isdigit())
        text = f"{head}.{digits[:6].ljust(6, '0')}{rest[len(digits) :]}"
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def fault_time(a: FiringAlert) -> float | None:
    """When the fault behind ``a`` was seen: the collector's own timestamp (the rule's
    ``fault_seen`` annotation) when it has one, else when the alert started (``startsAt``:
    Prometheus's first evaluation that found it)."""
    seen = epoch(a.fault_seen)
    return seen if seen and seen > 0 else epoch(a.starts_at)


def acknowledged(a: FiringAlert, ack: str | None) -> bool:
    """Whether ``a`` is acknowledged by ``ack``: its ``startsAt`` (an operator's release: until
    it fires anew), or ``startsAt@T`` (a GPU reset at T, epoch seconds: until it fires anew or its
    fault is seen after T)."""
    if not ack:
        return False
    starts, _, until = ack.partition("@")
    if starts != a.starts_at:
        return False
    if not until:
        return True
    seen = fault_time(a)
    return seen is None or seen <= float(until)


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
    # the event's times, epoch seconds (0: not known): the fault seen on the host (the collector's
    # timestamp, else the alert's start), the alert received, the host drained, reset or rebooted
    fault_at: float = 0.0
    alert_at: float = 0.0
    drained_at: float = 0.0
    remedied_at: float = 0.0

    @property
    def state(self) -> str:
        return "held" if self.held else "quarantined"


@dataclass
class RoundPlan:
    quarantine: list[tuple[str, list[FiringAlert]]] = field(default_factory=list)
    over_budget: list[tuple[str, list[FiringAlert]]] = field(default_factory=list)
    unknown: list[FiringAlert] = field(default_factory=list)
    no_balancer: list[tuple[str, list[FiringAlert]]] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)
    breaker: list[tuple[str, list[FiringAlert]]] = field(default_factory=list)


def plan(
    alerts: dict[str, FiringAlert],
    acked: dict[str, str],
    records: dict[str, Record],
    hosts: dict[str, FleetHost],
    group_limits: dict[str, int],
    has_balancer: Callable[[FleetHost], bool],
    out_elsewhere: Callable[[str], int | None] = lambda g: 0,
    tripped: frozenset[str] | set[str] = frozenset(),
) -> RoundPlan:
    """What a round does (pure): hosts to take out (earliest alert first, while their group is
    within its budget), alerts beyond the budget, hosts to return (not held, no quarantine alert
    firing that was not acknowledged). ``out_elsewhere(group)``: the group's servers out of the
    balancer that are not the receiver's (an operator's drain, a deploy's); None when the balancer
    cannot be read, which spends the group's budget (no new drain on a guess). ``tripped``: the
    groups whose circuit breaker is open (tritonfleet.fleet.quarantine.breaker): none of their
    hosts is taken out (``breaker``: alert only), their hosts still return."""
    p = RoundPlan()
    live: dict[str, list[FiringAlert]] = {}
    for fp, a in alerts.items():
        if acknowledged(a, acked.get(fp)):
            continue
        if a.host not in hosts:
            p.unknown.append(a)
            continue
        live.setdefault(a.host, []).append(a)
    out = out_count(records, hosts)
    order = sorted((h for h in live if h not in records), key=lambda h: (min(a.starts_at for a in live[h]), h))
    seen: dict[str, int | None] = {}
    for name in order:
        fh = hosts[name]
        if not has_balancer(fh):
            p.no_balancer.append((name, live[name]))
            continue
        g = group_of(fh)
        if g in tripped:
            p.breaker.append((name, live[name]))
            continue
        if g not in seen:
            seen[g] = out_elsewhere(g)
        if seen[g] is not None and out.get(g, 0) + (seen[g] or 0) < group_limits.get(g, 0):
            p.quarantine.append((name, live[name]))
            out[g] = out.get(g, 0) + 1
        else:
            p.over_budget.append((name, live[name]))
    p.returns = sorted(name for name, r in records.items() if not r.held and name not in live)
    return p


def out_count(records: dict[str, Record], hosts: dict[str, FleetHost]) -> dict[str, int]:
    """{group: hosts the receiver holds out}."""
    out: dict[str, int] = {}
    for r in records.values():
        if r.host in hosts:
            g = group_of(hosts[r.host])
            out[g] = out.get(g, 0) + 1
    return out
