"""The direct path without servers: the real Receiver driven round by round on a fake clock with a
balancer that records (tests/unit/fleet/test_quarantine_breaker.py's rig): a pushed critical Xid
drains its host in the round it arrives, within the budget; the Prometheus path's alert takes
over from it; one nothing confirms expires and the host returns; Alertmanager's answers never
resolve it. The collector pushes the first report of each distinct critical event only."""

from __future__ import annotations

import json
import time
from pathlib import Path
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.fleet.test_quarantine_breaker import T0, Clock, iso, rig
from tritonfleet.fleet.quarantine import push as push_mod
from tritonfleet.fleet.quarantine import receiver as receiver_mod
from tritonfleet.gpu import fault_push, telemetry

BODY = {"xid": 79, "pci": "0000:3b:00", "action": "RESTART_BM", "seen": T0, "text": "GPU has fallen off the bus."}


def pushed(rec, host: str, **over) -> None:
    assert rec.push_fault(host, {**BODY, **over}, f"collector of {host}")
    kind, _, _ = rec.queue.get_nowait()  # what the worker would take: one wake-up for the burst
    assert kind == "faults"
    rec.apply_pushes()
    rec.round()


def prometheus_alert(rec, host: str, status: str = "firing") -> None:
    rec.apply_notification({"alerts": [{"status": status, "labels": {
        "alertname": "GpuXidCritical", "host": host, "quarantine": "true", "xid": "79"},
        "annotations": {"fault_seen": f"{T0:.3f}"}, "startsAt": iso(T0 + 8), "fingerprint": f"p-{host}"}]})
    rec.round()


def test_a_pushed_fault_drains_its_host_in_that_round_within_the_budget(tmp_path):
    clock = Clock()
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(push_mod, "time", clock):
        rec, out, lines = rig([4], 1, 1.0, tmp_path)
        clock.t = T0 + 0.4
        pushed(rec, "g0-0")
        assert out == {"g0-0"}
        assert rec.records["g0-0"].fault_at == T0 and rec.records["g0-0"].drained_at == T0 + 0.4
        pushed(rec, "g0-1")  # the budget (1) is spent: alert only, as for any alert
        assert out == {"g0-0"} and any("g0-1 over-budget" in line for line in lines)


def test_a_burst_wakes_the_worker_once(tmp_path):
    rec, _, _ = rig([10], 2, 1.0, tmp_path)
    for i in range(10):
        assert rec.push_fault(f"g0-{i}", BODY, "c")
    assert rec.queue.qsize() == 1
    assert rec.apply_pushes() == 10


def test_the_prometheus_alert_takes_over_and_an_unconfirmed_push_expires(tmp_path):
    clock = Clock()
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(push_mod, "time", clock):
        rec, out, lines = rig([4, 4], 1, 1.0, tmp_path)
        pushed(rec, "g0-0")
        pushed(rec, "g1-0")
        clock.t += 9
        prometheus_alert(rec, "g0-0")  # the record: the pushed alert gives way, the host stays out
        assert [fp for fp, a in rec.alerts.items() if a.host == "g0-0"] == ["p-g0-0"]
        assert "g0-0" in out and any("g0-0 push-confirmed" in line for line in lines)
        clock.t += rec.push_ttl
        rec.round()  # nothing confirmed g1-0's push: dropped, and the host returns through the gate
        assert "g1-0" not in out and any("g1-0 push-expired" in line for line in lines)
        assert "g0-0" in out


def test_alertmanagers_answers_never_resolve_a_pushed_alert(tmp_path):
    """resolve_grace 0: an alert missing from two reads of Alertmanager resolves; a pushed one is
    not Alertmanager's and stands until confirmed or expired."""
    rec, out, _ = rig([4], 1, 1.0, tmp_path)
    rec.alertmanager = "http://alertmanager.invalid"
    answer = mock.MagicMock()
    answer.__enter__.return_value.read.return_value = b"[]"
    with mock.patch.object(receiver_mod.urllib.request, "urlopen", return_value=answer):
        pushed(rec, "g0-0")
        for _ in range(3):
            rec.round()
    assert out == {"g0-0"} and any(a.host == "g0-0" for a in rec.alerts.values())


@given(st.dictionaries(st.sampled_from(["xid", "pci", "action", "seen", "text", "other"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=True),
                                 st.text(max_size=20), st.lists(st.integers(), max_size=2))))
def test_a_pushed_body_is_either_refused_with_a_reason_or_an_alert(body):
    why = push_mod.fault_body_error(body)
    if why is None:
        a = push_mod.pushed_alert("h", body)
        assert a.host == "h" and a.labels["quarantine"] == "true" and float(a.fault_seen) > 0
    else:
        assert isinstance(why, str) and why


def test_each_host_has_its_own_token():
    assert fault_push.host_token("s", "a") != fault_push.host_token("s", "b")
    assert fault_push.host_token("s\n", "a") == fault_push.host_token("s", "a")  # a file's newline
    assert fault_push.fault_url("http://r:9095/", "a b") == "http://r:9095/v1/hosts/a%20b/fault"


class Recorder(fault_push.Pusher):
    def __init__(self, **kw):
        super().__init__("http://r", "h", "t", {"RESTART_BM", "RESET_GPU"}, **kw)
        self.sent: list[dict] = []

    def send(self, data: bytes):
        self.sent.append(json.loads(data))
        return True, "HTTP 202"


def test_the_collector_pushes_the_first_report_of_each_critical_event_only(tmp_path: Path):
    kmsg = tmp_path / "kmsg"
    lines = ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=tritonserver, GPU has fallen off the bus.",
             "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=tritonserver, GPU has fallen off the bus.",  # a repeat
             "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=tritonserver, Graphics Exception",  # RESTART_APP
             "NVRM: Xid (PCI:0000:86:00): 63, pid=1, name=tritonserver, Row Remapper"]  # pushed by number
    kmsg.write_text("".join(f"3,{i},{1_000_000 * (i + 1)},-;{t}\n" for i, t in enumerate(lines)))
    rec = Recorder(xids={63})
    c = telemetry.Collector(str(tmp_path), "false", str(kmsg), 5, 5, pusher=rec)
    c.read_log()
    for t in rec.threads:
        t.join(5)
    assert sorted((b["xid"], b["pci"]) for b in rec.sent) == [(63, "0000:86:00"), (79, "0000:3b:00")]
    first = next(b for b in rec.sent if b["xid"] == 79)
    assert first["action"] == "RESTART_BM" and abs(first["seen"] - (c.btime + 1.0)) < 0.01


def test_a_push_refused_for_good_is_not_tried_again_and_a_busy_receiver_is():
    calls: list[str] = []

    def refuse(code):
        def opener(req, timeout):
            calls.append(req.full_url)
            raise fault_push.urllib.error.HTTPError(req.full_url, code, "no", {}, None)
        return opener

    p = fault_push.Pusher("http://r", "h", "t", {"RESTART_BM"}, pauses=(0.0, 0.0))
    with mock.patch.object(fault_push.urllib.request, "urlopen", refuse(401)):
        assert p.send(b"{}")[0] is False and len(calls) == 1
    calls.clear()
    with mock.patch.object(fault_push.urllib.request, "urlopen", refuse(503)):
        t0 = time.monotonic()
        assert p.send(b"{}")[0] is False and len(calls) == 3 and time.monotonic() - t0 < 5


def test_a_new_fault_after_a_release_is_pushed_again_past_the_acknowledged_alerts(tmp_path):
    """A released host's alerts are acknowledged (its Prometheus alert too, while it still fires):
    neither keeps a later fault's push from taking it out again."""
    clock = Clock()
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(push_mod, "time", clock):
        rec, out, _ = rig([4], 1, 1.0, tmp_path)
        pushed(rec, "g0-0")
        prometheus_alert(rec, "g0-0")
        assert rec.release("g0-0")["ok"] and out == set()
        clock.t += 30
        pushed(rec, "g0-0", seen=clock.t)
        assert out == {"g0-0"}
