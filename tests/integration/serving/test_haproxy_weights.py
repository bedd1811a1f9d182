"""A canary's traffic share through HAProxy's weights (tritonfleet.serving.haproxy_weights): the
weight arithmetic on generated backends (hypothesis), and against Debian's real HAProxy 2.6 on
loopback in front of small local HTTP servers: the share of requests each server gets is the one
the weights promise, a drained server keeps its drain, the originals come back, and HAProxy's
refusals are named."""

from __future__ import annotations

import contextlib
from collections import Counter
from fractions import Fraction

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.haproxy import HAProxy, ok_server
from tritonfleet.serving import haproxy_weights as hw
from tritonfleet.serving.drain import DrainError
from tritonfleet.serving.drain import HAProxy as Runtime

# ---- the arithmetic ------------------------------------------------------------------------------

backends = st.dictionaries(st.sampled_from([f"s{i}" for i in range(12)]), st.integers(1, 256), min_size=1, max_size=11)


@settings(max_examples=300, deadline=None)
@given(others=backends, n_canary=st.integers(1, 3), share=st.floats(0.005, 0.95), data=st.data())
def test_plan_reaches_the_closest_share_the_weights_allow(others, n_canary, share, data):
    canaries = [f"c{i}" for i in range(n_canary)]
    matched = data.draw(st.lists(st.sampled_from(sorted(others)), max_size=n_canary, unique=True))
    rest = {s: w for s, w in others.items() if s not in matched}
    if not rest or share * (n_canary + len(matched)) / n_canary >= 1:
        with pytest.raises(ValueError):
            hw.plan(share, canaries, others, matched)
        return
    p = hw.plan(share, canaries, others, matched)
    # every weight is one HAProxy accepts; canaries and matched alike; the rest scaled by one factor
    assert all(1 <= w <= hw.MAX_WEIGHT for w in p.weights.values())
    assert {p.weights[c] for c in canaries + matched} == {p.canary}
    assert all(p.weights[s] == w * p.factor for s, w in rest.items())
    # the share it reports is the share those weights give (exact arithmetic); matched get as much
    n = n_canary + len(matched)
    got = Fraction(n_canary * p.canary, n * p.canary + p.factor * sum(rest.values()))
    assert abs(float(got) - p.share) < 1e-12
    assert hw.share_of(p.weights, canaries) == pytest.approx(p.share)
    if matched:
        assert hw.share_of(p.weights, matched) == pytest.approx(p.share * len(matched) / n_canary)
    # no other (factor, canary weight) pair HAProxy accepts comes closer (brute force)
    total = sum(rest.values())
    best = min(abs(n_canary * c / (n * c + f * total) - share)
               for f in range(1, hw.MAX_WEIGHT // max(rest.values()) + 1) for c in range(1, hw.MAX_WEIGHT + 1))
    assert abs(p.share - share) <= best + 1e-12


def test_plan_on_the_default_weights_of_three_hosts():
    # weight 1 each (HAProxy's default): 5% needs the other two raised
    p = hw.plan(0.05, ["tb1"], {"tb2": 1, "tb3": 1})
    assert (p.canary, p.factor, p.weights) == (2, 19, {"tb1": 2, "tb2": 19, "tb3": 19})
    assert p.share == pytest.approx(0.05)
    # with tb2 matched to the canary: 5% each, the rest on tb3
    p = hw.plan(0.05, ["tb1"], {"tb2": 1, "tb3": 1}, ["tb2"])
    assert (p.canary, p.factor, p.weights) == (1, 18, {"tb1": 1, "tb2": 1, "tb3": 18})


@pytest.mark.parametrize("share,canaries,others,words", [
    (0, ["a"], {"b": 1}, "between 0 and 1"),
    (1.0, ["a"], {"b": 1}, "between 0 and 1"),
    (0.1, [], {"b": 1}, "no canary"),
    (0.1, ["a"], {}, "baseline"),
    (0.1, ["a"], {"a": 3, "b": 0}, "baseline"),
    (0.5, ["a"], {"b": 1, "c": 1, "m": 1}, "leaves nothing"),
    (0.1, ["a"], {"m": 1}, "beside the matched"),
])
def test_plan_refuses_what_cannot_be_shared(share, canaries, others, words):
    with pytest.raises(ValueError, match=words):
        hw.plan(share, canaries, others, ["m"])


# ---- against a real HAProxy ----------------------------------------------------------------------

@pytest.fixture
def servers():
    """Four local HTTP servers that answer their own name (HAProxy's check included)."""
    with contextlib.ExitStack() as stack:
        yield [(name, stack.enter_context(ok_server(name.encode()))) for name in ("a", "b", "c", "d")]


def _count(url: str, n: int) -> Counter:
    with requests.Session() as http:
        http.trust_env = False
        return Counter(http.get(url, timeout=5).text for _ in range(n))


def test_weights_give_the_planned_share_of_requests(servers, tmp_path):
    with HAProxy(tmp_path, servers, inter="200ms") as hap:
        for name, _ in servers:
            Runtime([hap.socket], "triton", name).wait_serving(10)
        w = hw.Weights([hap.socket], "triton")
        before = w.current()
        assert before == {"a": 1, "b": 1, "c": 1, "d": 1}
        p = hw.plan(0.05, ["a"], before, ["b"])
        w.set(p.weights)
        assert w.current() == p.weights
        assert hap.command("get weight triton/a").split()[0] == str(p.canary)  # as HAProxy itself reports it
        # roundrobin: over whole cycles the share is exact; 2000 requests are many cycles
        counts = _count(hap.url, 2000)
        assert sum(counts.values()) == 2000
        assert counts["a"] / 2000 == pytest.approx(p.share, abs=0.01)
        assert counts["b"] / 2000 == pytest.approx(p.share, abs=0.01)  # matched: as much as the canary
        for other in "cd":
            assert counts[other] / 2000 == pytest.approx((1 - 2 * p.share) / 2, abs=0.01)
        # a drained server keeps its drain (and its weight) when weights change
        hap.command("set server triton/b state drain")
        w.set({"b": 50})
        assert Runtime([hap.socket], "triton", "b").state().drained
        assert w.read()[hap.socket]["b"] == {"weight": 50, "initial": 1, "serving": False}
        hap.command("set server triton/b state ready")
        # the originals come back
        w.restore(before)
        assert w.current() == before
        counts = _count(hap.url, 400)  # HAProxy needs some requests to take a change fully
        assert all(c / 400 == pytest.approx(0.25, abs=0.03) for c in counts.values()), counts


def test_weights_refusals_are_named(servers, tmp_path):
    with HAProxy(tmp_path, servers[:2]) as hap:
        w = hw.Weights([hap.socket], "triton")
        with pytest.raises(DrainError, match="outside HAProxy's 0-256"):
            w.set({"a": 300})
        with pytest.raises(DrainError, match="refused `set weight triton/zz 3`: No such server"):
            w.set({"zz": 3})
        with pytest.raises(DrainError, match="no backend 'nope'"):
            hw.Weights([hap.socket], "nope").read()
        with pytest.raises(DrainError, match="plain words"):
            w.set({"a/b": 3})


def test_static_rr_backend_is_refused_with_the_reason(servers, tmp_path):
    """A static-rr backend takes only 0 or the initial weight at run time: HAProxy refuses."""
    with HAProxy(tmp_path, servers[:2], balance="static-rr") as hap:
        w = hw.Weights([hap.socket], "triton")
        with pytest.raises(DrainError, match="refused `set weight triton/a 5`"):
            w.set({"a": 5})
        assert w.current() == {"a": 1, "b": 1}


class _Answers:
    """A runtime API whose `show servers state` line of server b has no weights (cut short)."""

    address = "fake"

    def command(self, line: str) -> str:
        if line == "show stat":
            return "# pxname,svname,status,weight\ntriton,a,UP,1\ntriton,b,UP,1\n"
        return ("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight\n"
                "3 triton 1 a 10.0.0.1 2 0 1 1\n3 triton 2 b 10.0.0.2 2 0\n")


def test_a_weight_not_reported_is_an_error_not_a_weight_of_0():
    """A weight read as 0 would be put back as 0 after the canary, taking the server out."""
    w = hw.Weights(["unused"], "triton")
    w.apis = [_Answers()]
    with pytest.raises(DrainError, match="server 'b'"):
        w.read()
