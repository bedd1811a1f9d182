"""The quarantine's circuit breaker, decided without touching anything: when more than
``quarantine_breaker_fraction`` of an inventory group's hosts report a fault within
``quarantine_breaker_window`` seconds, the fault is most likely the fleet's (a driver, a model,
a rack's power), not each host's: the receiver stops taking hosts of that group out (the alerts
only alert) and says so loudly, while hosts that recover still return. Once the rate falls back
the breaker closes, and an alert whose fault is older than the window is not acted on then
(acknowledged, with an event): a stale event replayed would drain hosts the fault has long left
(NVSentinel's issue 450)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ...inventory.roster import FleetHost
from .planning import FiringAlert, epoch, fault_time, group_of

__all__ = ["Breaker", "epoch", "fault_time"]


@dataclass
class Breaker:
    """Each group's breaker: open (since when, epoch seconds) or closed."""

    fraction: float
    window: float
    open_since: dict[str, float] = field(default_factory=dict)

    def faulting(self, alerts: Iterable[FiringAlert], hosts: dict[str, FleetHost], now: float) -> dict[str, set[str]]:
        """{group: hosts with an alert whose fault was seen within the window}."""
        out: dict[str, set[str]] = {}
        for a in alerts:
            t = fault_time(a)
            if a.host in hosts and t is not None and now - t <= self.window:
                out.setdefault(group_of(hosts[a.host]), set()).add(a.host)
        return out

    def trips(self, faulting: int, size: int) -> bool:
        """More than ``fraction`` of a group of ``size`` hosts faulting (a group of one never trips:
        its one fault is its own)."""
        return size > 1 and faulting > self.fraction * size

    def step(
        self, alerts: Iterable[FiringAlert], hosts: dict[str, FleetHost], now: float
    ) -> tuple[list[str], list[str]]:
        """Open or close each group's breaker for the faults seen now: (groups opened, groups
        closed) by this step."""
        sizes: dict[str, int] = {}
        for h in hosts.values():
            sizes[group_of(h)] = sizes.get(group_of(h), 0) + 1
        faulting = self.faulting(alerts, hosts, now)
        opened, closed = [], []
        for g, size in sorted(sizes.items()):
            trip = self.trips(len(faulting.get(g, ())), size)
            if trip and g not in self.open_since:
                self.open_since[g] = now
                opened.append(g)
            elif not trip and g in self.open_since:
                del self.open_since[g]
                closed.append(g)
        return opened, closed

    def stale(
        self, alerts: Iterable[FiringAlert], hosts: dict[str, FleetHost], groups: Iterable[str], now: float
    ) -> list[FiringAlert]:
        """The alerts of ``groups`` (whose breaker just closed) whose fault is older than the window:
        not to be replayed."""
        groups = set(groups)
        out = []
        for a in alerts:
            t = fault_time(a)
            if a.host in hosts and group_of(hosts[a.host]) in groups and (t is None or now - t > self.window):
                out.append(a)
        return out
