"""The receiver's direct path: a host's GPU fault collector POSTs a critical Xid report to
``/v1/hosts/<host>/fault`` the moment it reads it (tritonfleet.gpu.fault_push), and the receiver
takes it as a quarantine alert of that host at once, instead of after the scrape, the rule's
evaluation and Alertmanager's notification. The budget and the circuit breaker decide as for any
alert (the same round); the Prometheus path stays the record: once its alert for the host arrives,
the pushed one gives way to it, and a push nothing confirms within ``quarantine_push_ttl`` seconds
is dropped (the host then returns through the warm gate like any other).

A burst is taken in one round: the HTTP handler only stores the report (bounded) and wakes the
worker once, so 200 hosts pushing at once cost one round, not 200.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ...settings.defaults import DEFAULTS
from .planning import QUARANTINE_LABEL, FiringAlert, acknowledged, clean, now_iso

#: reports stored for the worker at most (beyond it the API answers 503 and the collector retries)
PENDING_MAX = 4096
PUSHED = "pushed"  # the ``via`` label of a pushed alert


def fault_body_error(body: dict) -> str | None:
    """Why a pushed report is not one (None when it is): ``xid`` a whole number, ``pci`` and
    ``action`` strings, ``seen`` seconds since the epoch, ``text`` a string."""
    if not isinstance(body.get("xid"), int) or isinstance(body.get("xid"), bool) or not 0 <= body["xid"] < 1 << 16:
        return "xid is not a whole number of 0 to 65535"
    for key in ("pci", "action", "text"):
        if not isinstance(body.get(key, ""), str):
            return f"{key} is not a string"
    seen = body.get("seen")
    if isinstance(seen, bool) or not isinstance(seen, (int, float)) or seen <= 0:
        return "seen is not a number of seconds since the epoch"
    return None


def pushed_alert(host: str, body: dict) -> FiringAlert:
    """The alert a pushed report stands for: ``GpuXidCritical`` of the host, its fault time the
    collector's own (as the Prometheus rule's ``fault_seen`` annotation carries it)."""
    pci, xid, action = clean(body.get("pci", ""), 16), int(body["xid"]), clean(body.get("action", ""), 40)
    labels = {
        "alertname": "GpuXidCritical",
        "host": host,
        "pci": pci,
        "xid": str(xid),
        "action": action,
        "via": PUSHED,
        QUARANTINE_LABEL[0]: QUARANTINE_LABEL[1],
    }
    return FiringAlert(
        f"{PUSHED}:{host}:{pci}:{xid}",
        "GpuXidCritical",
        host,
        now_iso(float(body["seen"])),
        f"Xid {xid} on {pci} ({action}), pushed by the host's collector",
        labels,
        f"{float(body['seen']):.3f}",
    )


def is_pushed(a: FiringAlert) -> bool:
    return a.labels.get("via") == PUSHED


class Pushes:
    """The direct path's part of the receiver (a mixin of ``Receiver``: its state, events and worker)."""

    # the Receiver's own state and calls this part uses (tritonfleet.fleet.quarantine.receiver)
    lock: threading.Lock
    alerts: dict[str, FiringAlert]
    acked: dict[str, str]
    alert_at: dict[str, float]
    submit: Callable[..., Any]
    _arrived: Callable[[FiringAlert], None]
    event: Callable[..., None]

    def _init_pushes(self, first) -> None:
        self.push_ttl = float(first.get("quarantine_push_ttl", DEFAULTS["quarantine_push_ttl"]))
        self.pending: dict[str, tuple[str, dict, str]] = {}  # fingerprint -> (host, body, caller)
        self.pushed_at: dict[str, float] = {}  # a pushed alert's fingerprint -> when it came (monotonic)
        self.woken = False

    def push_fault(self, host: str, body: dict, caller: str) -> bool:
        """Store a host's report for the worker (called by the HTTP handler, any thread) and wake
        the worker once for all reports that wait; False when the store is full (503)."""
        a = pushed_alert(host, body)
        with self.lock:
            if a.fingerprint not in self.pending and len(self.pending) >= PENDING_MAX:
                return False
            self.pending[a.fingerprint] = (host, body, caller)
            wake, self.woken = not self.woken, True
        if wake:
            self.submit("faults")
        return True

    def apply_pushes(self) -> int:
        """The worker: every stored report as an alert (a fault already known: nothing new)."""
        with self.lock:
            taken, self.pending, self.woken = self.pending, {}, False
        n = 0
        for fp, (host, body, _caller) in taken.items():
            old = self.alerts.get(fp)
            if (old is not None and not acknowledged(old, self.acked.get(fp))) or self._standing(host):
                continue  # known already, or the Prometheus path's alert of the host stands
            a = pushed_alert(host, body)
            self.acked.pop(fp, None)  # a new fault of an acknowledged (released, reset) one counts
            self.pushed_at[fp] = time.monotonic()
            self.alerts[fp] = a
            self._arrived(a)
            n += 1
        return n

    def _standing(self, host: str) -> bool:
        """Whether the Prometheus path has an alert of ``host`` that is not acknowledged."""
        return any(
            b.host == host and not is_pushed(b) and not acknowledged(b, self.acked.get(f))
            for f, b in self.alerts.items()
        )

    def settle_pushes(self) -> None:
        """Each round: a pushed alert gives way to the Prometheus path's alert of its host, and one
        not confirmed within ``quarantine_push_ttl`` is dropped."""
        now = time.monotonic()
        for fp, a in list(self.alerts.items()):
            if not is_pushed(a):
                continue
            confirmed = self._standing(a.host)
            if not confirmed and now - self.pushed_at.setdefault(fp, now) < self.push_ttl:
                continue
            del self.alerts[fp]
            self.pushed_at.pop(fp, None)
            self.acked.pop(fp, None)
            self.alert_at.pop(fp, None)
            self.event(
                "push-confirmed" if confirmed else "push-expired",
                a.host,
                f"{a.reason}: "
                + (
                    "the Prometheus path's alert of the host takes over"
                    if confirmed
                    else f"no alert of the Prometheus path for it within {self.push_ttl:.0f} s: dropped"
                ),
            )
