"""The performance gate's verdict (generative) and its refusals; the gate in a real rollout is
tests/testbed/test_perfgate.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tritonfleet.fleet.rollout import RolloutError, perfgate, rollout
from tritonfleet.fleet.rollout.perfgate import Limits, Measurement

rates = st.floats(1.0, 5000.0)
p95s = st.floats(0.5, 5000.0)
shares = st.floats(0.0, 3.0)


def m(throughput: float, p95: float | None, errors: int = 0, requests: int = 100) -> Measurement:
    return Measurement("m", 16, 5.0, requests, errors, throughput, p95)


@given(rates, rates, p95s, p95s, shares, shares)
def test_the_verdict_is_exactly_the_two_tolerances(t0, t1, p0, p1, drop, rise):
    why = perfgate.judge(m(t0, p0), m(t1, p1), Limits(drop, rise))
    too_slow = 1 - t1 / t0 > drop
    too_late = p1 / p0 - 1 > rise
    assert bool(why) == (too_slow or too_late)
    assert ("throughput" in why) == too_slow and ("p95" in why) == too_late
    if too_slow:
        assert f"throughput {t0:.1f} -> {t1:.1f} inf/s" in why and "perf_gate_max_throughput_drop" in why


def test_failed_requests_after_the_update_fail_the_gate():
    after = Measurement("m", 16, 5.0, 90, 10, 18.0, 20.0, "InferenceServerException: boom")
    why = perfgate.judge(m(20.0, 20.0), after, Limits(0.2, 0.5))
    assert why == "10 of 100 requests failed after the update (first: InferenceServerException: boom)"
    assert perfgate.judge(m(20.0, 20.0), m(0.0, None, requests=0), Limits(0.2, 0.5)).startswith(
        "0 of 0 requests failed after the update; throughput 20.0 -> 0.0 inf/s (-100%")


def test_report_lines_show_both_measurements():
    gate = perfgate.Gate(echo=lambda _: None)
    gate.before["h1"], gate.after["h1"], gate.verdict["h1"] = m(200.0, 30.0), m(50.0, 120.0), "failed: x"
    assert perfgate.lines(gate.report()) == [
        "perf gate  h1: m c=16: before 200.0 inf/s, p95 30.0 ms (100 requests); after 50.0 inf/s, "
        "p95 120.0 ms (100 requests): failed: x"]


def test_perf_gate_needs_a_canary():
    with pytest.raises(RolloutError, match="--perf-gate measures the canary"):
        rollout("inventories/testbed.py", "deploys/models.py", canary=0, perf_gate=True)
