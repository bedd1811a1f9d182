"""The quarantine receiver's circuit breaker and its event latencies, without servers: the real
Receiver driven round by round on a fake clock, with a balancer and a warm gate that only record,
over generated sequences of faults, recoveries and time (hypothesis): the budget and the breaker's
invariants hold in every round."""

from __future__ import annotations

import tempfile
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet.cli.quarantine import _table
from tritonfleet.fleet.quarantine import breaker as br
from tritonfleet.fleet.quarantine import receiver as receiver_mod
from tritonfleet.fleet.quarantine.client import latency_note
from tritonfleet.fleet.quarantine.planning import FiringAlert, acknowledged, group_of
from tritonfleet.inventory.roster import FleetHost

T0 = 1_800_000_000.0
WINDOW = 300.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class Lb:
    """A balancer that records: out or in."""

    kind = "fake"

    def __init__(self, name: str, out: set[str]):
        self.name, self.out = name, out

    def describe(self) -> str:
        return f"fake {self.name}"

    def drain(self) -> str:
        self.out.add(self.name)
        return "held"

    def ready(self) -> str:
        self.out.discard(self.name)
        return "ready"

    def wait_serving(self, timeout: float) -> str:
        return "UP"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f123Z")


def rig(groups: list[int], budget, fraction: float, tmp: Path):
    hosts = [FleetHost(f"g{g}-{i}", [f"g{g}"], {"quarantine_budget": budget, "quarantine_breaker_fraction": fraction,
                                                  "quarantine_breaker_window": WINDOW, "lb_drain_timeout": 20})
             for g, n in enumerate(groups) for i in range(n)]
    out: set[str] = set()
    lines: list[str] = []
    rec = receiver_mod.Receiver(hosts, tmp, interval=1, gate_timeout=1, resolve_grace=0, echo=lines.append,
                                balancer_of=lambda fh: Lb(fh.name, out), gate=lambda fh, t: (True, "fake gate"))
    return rec, out, lines


def notify(rec, status: str, host: str, fault_at: float, fp: str, annotate: bool) -> None:
    rec.apply_notification({"alerts": [{
        "status": status, "fingerprint": fp, "startsAt": iso(fault_at + 1.0),
        "labels": {"alertname": "GpuXidCritical", "host": host, "quarantine": "true"},
        "annotations": {"summary": "Xid 79", **({"fault_seen": f"{fault_at:.3f}"} if annotate else {})}}]})


steps = st.lists(st.tuples(
    st.sampled_from(["fault", "recover", "wait"]),
    st.integers(0, 5),                       # which host
    st.sampled_from([0.5, 5.0, 60.0, 200.0, 400.0]),  # seconds that pass after it
    st.booleans(),                           # the collector's timestamp in the alert, or not
), min_size=1, max_size=40)


@settings(max_examples=400, deadline=None)
@given(groups=st.lists(st.integers(1, 6), min_size=1, max_size=2),
       budget=st.sampled_from([0, 1, 2, "25%", "50%"]),
       fraction=st.sampled_from([0.25, 0.5, 1.0]), seq=steps)
def test_budget_and_breaker_hold_over_any_sequence_of_events(groups, budget, fraction, seq):
    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(receiver_mod, "time", clock):
        rec, out, _ = rig(groups, budget, fraction, Path(tmp))
        names = sorted(rec.hosts)
        fired: dict[str, tuple[str, float]] = {}
        closed_at: dict[str, float] = {}
        n = 0
        for what, i, dt, annotate in seq:
            host = names[i % len(names)]
            if what == "fault" and host not in fired:
                n += 1
                fired[host] = (f"fp{n}", clock.t)
                notify(rec, "firing", host, clock.t, f"fp{n}", annotate)
            elif what == "recover" and host in fired:
                fp, t = fired.pop(host)
                notify(rec, "resolved", host, t, fp, annotate)
            was_open = set(rec.breaker.open_since)
            before = set(rec.records)
            rec.round()
            now = clock.t
            taken = set(rec.records) - before
            sizes = {}
            for h in rec.hosts.values():
                sizes[group_of(h)] = sizes.get(group_of(h), 0) + 1
            live = [a for fp, a in rec.alerts.items() if not acknowledged(a, rec.acked.get(fp))]
            faulting = rec.breaker.faulting(live, rec.hosts, now)
            for g, limit in rec.limits.items():
                members = {h for h in rec.records if group_of(rec.hosts[h]) == g}
                # the budget: never more of a group out than it allows
                assert len(members) <= limit
                # the breaker is open exactly while more than the fraction of the group faults
                # (over the alerts still counted after this round)
                assert (g in rec.breaker.open_since) == (sizes[g] > 1 and len(faulting.get(g, ())) > fraction * sizes[g])
                # no host of a group is taken out in a round that began with its breaker open
                if g in was_open:
                    assert not {h for h in taken if group_of(rec.hosts[h]) == g}
                # closing replays nothing stale: a host taken out after its breaker closed has a
                # fault that was within the window when it closed
                if g in closed_at:
                    for h in taken:
                        if group_of(rec.hosts[h]) == g:
                            assert min(br.fault_time(a) for a in live if a.host == h) >= closed_at[g] - WINDOW
                if g in was_open and g not in rec.breaker.open_since:
                    closed_at[g] = now
            # a host returns only once it recovered (never because the breaker dropped its alert), and
            # a recovered host returns, breaker open or not; the balancer agrees with the records
            assert not [h for h in before - set(rec.records) if h in fired]
            assert not [h for h in before if h not in fired and h in rec.records]
            assert out == set(rec.records)
            clock.t += dt


def test_the_breaker_trips_stops_draining_lets_recovered_hosts_return_and_drops_stale_alerts(tmp_path):
    clock = Clock()
    with mock.patch.object(receiver_mod, "time", clock):
        rec, out, lines = rig([10], "20%", 0.5, tmp_path)
        names = sorted(rec.hosts)
        for i, h in enumerate(names[:2]):
            notify(rec, "firing", h, clock.t, f"fp{i}", True)
        rec.round()
        assert out == set(names[:2])
        clock.t += 1
        for i, h in enumerate(names[2:8], start=2):
            notify(rec, "firing", h, clock.t, f"fp{i}", True)
        rec.round()
        assert set(rec.breaker.open_since) == {"g0"}
        assert any("CIRCUIT BREAKER OPEN for group g0: 8 of its 10 hosts" in line for line in lines)
        assert "tritonfleet_quarantine_breaker_open{group=\"g0\"} 1.0" in rec.latency.text().decode()
        table = _table(rec.snapshot())
        assert table.startswith("CIRCUIT BREAKER OPEN for group g0 since ")
        # a recovered host returns while the breaker is open
        notify(rec, "resolved", names[0], T0, "fp0", True)
        rec.round()
        assert out == {names[1]}
        # within the budget again, but the breaker is open: alert only
        assert names[2] not in rec.records
        assert any(f"{names[2]} breaker:" in line for line in lines)
        # the window passes: the breaker closes and the alerts older than it are not replayed
        clock.t += WINDOW + 1
        rec.round()
        assert not rec.breaker.open_since and out == {names[1]}
        assert any("breaker-closed: circuit breaker closed for group g0 (open since 2027-" in line for line in lines)
        stale = [line for line in lines if " stale: " in line]
        assert len(stale) == 6
        assert "tritonfleet_quarantine_stale_alerts_total{group=\"g0\"} 6.0" in rec.latency.text().decode()
        # a fault that fires anew counts again
        notify(rec, "firing", names[3], clock.t, "fp-new", True)
        rec.round()
        assert names[3] in rec.records


def test_each_event_s_times_from_the_collector_s_timestamp(tmp_path):
    clock = Clock()
    with mock.patch.object(receiver_mod, "time", clock):
        rec, out, lines = rig([4], 1, 0.5, tmp_path)
        fault = clock.t - 0.8
        notify(rec, "firing", "g0-1", fault, "fp", True)
        clock.t += 0.4
        rec.round()
        r = rec.snapshot()["hosts"]["g0-1"]
        assert r["fault_at"] == pytest.approx(fault) and r["drained_at"] - r["fault_at"] == pytest.approx(1.2)
        assert latency_note(r) == " (fault -> alert 0.8 s, out 1.2 s)"
        assert "g0-1  quarantined since" in _table(rec.snapshot()) and "out 1.2 s" in _table(rec.snapshot())
        clock.t += 10
        notify(rec, "resolved", "g0-1", fault, "fp", True)
        rec.round()
        text = rec.latency.text().decode()
        assert 'tritonfleet_quarantine_event_seconds_bucket{le="1.5",stage="drained"} 1.0' in text
        assert 'tritonfleet_quarantine_event_seconds_bucket{le="1.0",stage="drained"} 0.0' in text
        assert 'tritonfleet_quarantine_event_seconds_count{stage="returned"} 1.0' in text
        assert any("11.2 s after the fault" in line for line in lines)


def test_without_the_collector_s_timestamp_the_alert_s_start_counts():
    a = FiringAlert("fp", "X", "h", "2027-01-15T08:00:00.123456789Z")
    assert br.fault_time(a) == pytest.approx(datetime(2027, 1, 15, 8, 0, 0, 123456, timezone.utc).timestamp())
    a.fault_seen = "1800000000.250"
    assert br.fault_time(a) == 1800000000.25
    assert br.epoch("not a time") is None and br.epoch("") is None
    assert br.epoch("2027-01-15T08:00:00+01:00") == datetime(2027, 1, 15, 7, 0, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(("faulting", "size", "trips"), [(5, 10, False), (6, 10, True), (1, 1, False), (2, 2, True),
                                                          (1, 3, False), (2, 3, True)])
def test_more_than_the_fraction_trips(faulting, size, trips):
    assert br.Breaker(0.5, WINDOW).trips(faulting, size) is trips
