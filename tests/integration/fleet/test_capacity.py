"""A rollout's capacity rules (tritonfleet.fleet.rollout.capacity): the arithmetic on generated backends
(hypothesis), and the backend's state read from Debian's real HAProxy 2.6 on loopback (servers
up, down by their checks, drained, in maintenance, at weight 0); a batch that waits for a server
to come back, and one that gives up."""

from __future__ import annotations

import math
import threading
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.haproxy import HAProxy, ok_server
from tritonfleet.fleet.rollout import capacity as cap
from tritonfleet.serving.drain import DrainError
from tritonfleet.serving.drain import HAProxy as Runtime

# ---- the arithmetic -----------------------------------------------------------------------------

limits = st.one_of(st.none(), st.integers(0, 12).map(str), st.integers(1, 100).map(lambda p: f"{p}%"),
                   st.sampled_from(["12.5%", "33.3%", "0.5%"]))


@settings(max_examples=300)
@given(st.integers(1, 400), st.sampled_from(["25%", "12.5%", "33.3%", "50%", "100%", "0.5%", "99%"]))
def test_percentages_round_down_for_a_ceiling_and_up_for_a_floor(total, text):
    limit = cap.parse_limit(text, "k")
    exact = Fraction(text[:-1]) * total / 100
    assert limit.at_most(total) == math.floor(exact)
    assert limit.at_least(total) == math.ceil(exact)


@settings(max_examples=500)
@given(serving=st.dictionaries(st.sampled_from([f"s{i}" for i in range(10)]), st.booleans(), min_size=1),
       data=st.data(), mx=limits, mn=limits)
def test_a_batch_goes_only_when_every_rule_holds(serving, data, mx, mn):
    batch = data.draw(st.lists(st.sampled_from(sorted(serving)), unique=True))
    rules = cap.Rules(cap.parse_limit(mx, "max"), cap.parse_limit(mn, "min"))
    v = cap.judge(serving, batch, rules)
    total = len(serving)
    # what goes out: servers out now and the batch's servers that serve now, each once
    out_after = {s for s, ok in serving.items() if not ok} | set(batch)
    assert v.unavailable_after == len(out_after) and v.available_after == total - len(out_after)
    ok_max = mx is None or len(out_after) <= rules.max_unavailable.at_most(total)
    ok_min = mn is None or total - len(out_after) >= rules.min_available.at_least(total)
    assert v.ok == (ok_max and ok_min), v.why
    assert bool(v.why) == (not v.ok)
    # monotone: one more server down never lets a refused batch go
    up = [s for s, ok in serving.items() if ok and s not in batch]
    if up and not v.ok:
        worse = dict(serving, **{up[0]: False})
        assert not cap.judge(worse, batch, rules).ok


@settings(max_examples=300)
@given(serving=st.dictionaries(st.sampled_from([f"s{i}" for i in range(8)]), st.booleans(), min_size=1),
       data=st.data(), need=st.integers(0, 5))
def test_per_model_floors_count_only_the_servers_of_that_model(serving, data, need):
    models_of = {s: data.draw(st.lists(st.sampled_from(["a", "b"]), unique=True)) for s in serving}
    batch = data.draw(st.lists(st.sampled_from(sorted(serving)), unique=True))
    rules = cap.Rules(models={"a": cap.parse_limit(str(need), "m")})
    v = cap.judge(serving, batch, rules, models_of)
    left = [s for s, ok in serving.items() if ok and s not in batch and "a" in models_of[s]]
    assert v.models["a"]["after"] == len(left)
    assert v.ok == (len(left) >= need)


def test_the_numbers_a_refusal_names():
    v = cap.judge({"a": True, "b": True, "c": False, "d": True}, ["a"], cap.Rules(cap.parse_limit("25%", "m")))
    assert not v.ok
    assert v.why == "2 of 4 server(s) would be out of HAProxy, max_unavailable 25% allows 1"
    assert v.summary() == "4 server(s), out now 1 (c), batch 1, out with the batch 2, max_unavailable 1"
    # a quarter of three servers is none: nothing may go
    assert cap.judge({"a": True, "b": True, "c": True}, ["a"], cap.Rules(cap.parse_limit("25%", "m"))).max_unavailable == 0


@pytest.mark.parametrize("value", [-1, "1.5", "x", "0%", "101%", "nan%", True, "25 %x", "1e2"])
def test_bad_limits_are_refused_naming_the_setting(value):
    with pytest.raises(cap.CapacityError, match="rollout_max_unavailable must be a number of hosts"):
        cap.parse_limit(value, "rollout_max_unavailable", "group t4")


def test_empty_limits_are_no_rule():
    assert cap.parse_limit(None, "k") is None and cap.parse_limit("", "k") is None
    assert not cap.Rules().active
    assert cap.parse_limit(0, "k").at_most(10) == 0 and cap.parse_limit("100%", "k").at_least(7) == 7


# ---- the backend from a real HAProxy ------------------------------------------------------------

@pytest.fixture
def backend(tmp_path):
    # four servers on one answering address, and "dead" on a closed port (down by its checks)
    with ok_server() as addr, HAProxy(tmp_path, [("a", addr), ("b", addr), ("c", addr), ("d", addr),
                                                  ("dead", "127.0.0.1:1")], inter="200ms") as hap:
        for name in "abcd":
            Runtime([hap.socket], "triton", name).wait_serving(10)
        yield hap


def test_pool_reads_what_haproxy_sends_requests_to(backend):
    hap = backend
    pool = cap.Pool([hap.socket], "triton")
    deadline = time.monotonic() + 10
    while pool.read()["dead"]["status"].startswith("UP"):  # two failed checks take it down
        assert time.monotonic() < deadline
        time.sleep(0.2)
    hap.command("set server triton/b state drain")
    hap.command("set server triton/c state maint")
    hap.command("set weight triton/d 0")
    state = pool.read()
    assert {s: v["serving"] for s, v in state.items()} == {"a": True, "b": False, "c": False, "d": False,
                                                           "dead": False}
    assert state["b"]["admin"] & 0x08 and state["c"]["admin"] & 0x01 and state["d"]["weight"] == 0
    # two HAProxy instances: a server is out when either says so (the same socket twice, one view)
    assert cap.Pool([hap.socket, hap.socket], "triton").serving() == pool.serving()
    with pytest.raises(DrainError, match="no backend 'nope'"):
        cap.Pool([hap.socket], "nope").read()


def test_a_batch_waits_until_a_server_is_back(backend):
    hap = backend
    hap.command("disable health triton/dead")  # no check: HAProxy counts it up ("no check")
    pool = cap.Pool([hap.socket], "triton")
    assert all(pool.serving().values())
    rules = cap.Rules(cap.parse_limit("25%", "rollout_max_unavailable"))  # 5 servers: 1 out at most
    hap.command("set server triton/b state maint")
    said = []

    def back():
        time.sleep(2.5)
        hap.command("set server triton/b state ready")

    t = threading.Thread(target=back)
    t.start()
    v, waited = cap.wait_for(pool, ["a"], rules, {}, timeout=30, echo=said.append, label="batch 2/3")
    t.join()
    assert v.ok and 2 <= waited < 10, (v.why, waited)
    assert said == ["[batch 2/3] waiting for capacity in backend triton (up to 30s, rollout_capacity_wait): "
                    "2 of 5 server(s) would be out of HAProxy, max_unavailable 25% allows 1"]
    # a server that does not come back: the batch gives up after the wait, the numbers in its verdict
    hap.command("set server triton/c state maint")
    v, waited = cap.wait_for(pool, ["a"], rules, {}, timeout=2, echo=said.append, label="batch 3/3")
    assert not v.ok and waited >= 2 and v.out == ["c"] and v.unavailable_after == 2


def test_the_sampler_reads_every_second(backend):
    hap = backend
    seen = []
    with cap.Sampler(cap.Pool([hap.socket], "triton"), seen.append, interval=0.2) as s:
        time.sleep(0.5)
        hap.command("set server triton/a state drain")
        time.sleep(0.6)
    assert len(s.watch.samples) >= 4 and s.watch.total == 5
    assert s.watch.max_out >= 1 + s.watch.samples[0].out
    assert any(v["a"]["admin"] & 0x08 for v in seen)


class _Answers:
    """A runtime API that answers `show stat` with servers a and b, and `show servers state` with
    only a's line (as a server added between the two reads, or an answer cut short, would)."""

    address = "fake"

    def command(self, line: str) -> str:
        if line == "show stat":
            return ("# pxname,svname,status,weight\ntriton,a,UP,1\ntriton,b,UP,1\ntriton,BACKEND,UP,2\n")
        return ("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight\n"
                "3 triton 1 a 10.0.0.1 2 0 1 1\n")


def test_a_server_whose_state_is_not_reported_is_an_error_not_a_serving_one():
    """What HAProxy does not say about a server (its admin state, its weight) is never read as
    "serving": the capacity check stops with the server named instead of counting it in."""
    pool = cap.Pool([], "triton")
    pool.apis = [_Answers()]
    with pytest.raises(DrainError, match="triton/b"):
        pool.read()
