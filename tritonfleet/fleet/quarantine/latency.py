"""Each quarantine event's times as Prometheus histograms (``GET /metrics`` of the receiver):
from the fault seen on the host (the collector's timestamp) to the alert received, to the host
out of its load balancer, to its GPU reset or reboot, and to the host back in service; with the
circuit breaker's state and the stale alerts it dropped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: the stages measured from the fault seen
STAGES = ("alert", "drained", "remedied", "returned")
#: seconds: around the goal figures (1.5 s, 3 s, 5 s) finely, then up to a bare-metal reboot (30 min)
BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class Latency:
    """The receiver's metrics, in a registry of its own (never the process's default one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.seconds = Histogram(
            "tritonfleet_quarantine_event_seconds",
            "Seconds from a fault seen on a host (the collector's timestamp, else the alert's start) to each "
            "stage of its quarantine: alert (received), drained (out of the load balancer), remedied (GPU reset "
            "or reboot done), returned (back in service)",
            ["stage"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.breaker_open = Gauge(
            "tritonfleet_quarantine_breaker_open",
            "1 while the group's circuit breaker is open (no host is taken out)",
            ["group"],
            registry=self.registry,
        )
        self.breaker_trips = Counter(
            "tritonfleet_quarantine_breaker_trips",
            "Times the group's circuit breaker opened",
            ["group"],
            registry=self.registry,
        )
        self.stale = Counter(
            "tritonfleet_quarantine_stale_alerts",
            "Alerts not acted on because their fault was older than the breaker's window when it closed",
            ["group"],
            registry=self.registry,
        )
        for stage in STAGES:
            self.seconds.labels(stage)

    def observe(self, stage: str, fault_at: float, at: float) -> float | None:
        """Record ``stage`` reached at ``at`` for a fault seen at ``fault_at`` (epoch seconds);
        the seconds, or None when the fault's time is not known (nothing recorded)."""
        if fault_at <= 0:
            return None
        took = max(0.0, at - fault_at)
        self.seconds.labels(stage).observe(took)
        return took

    def text(self) -> bytes:
        return generate_latest(self.registry)


def since_fault(record: dict, stage: str) -> float | None:
    """Seconds from a record's fault to ``stage`` (``alert``, ``drained``, ``remedied``), None when
    either time is not known."""
    fault, at = record.get("fault_at") or 0, record.get(f"{stage}_at") or 0
    return round(at - fault, 3) if fault > 0 and at > 0 else None
