"""The traffic canary's decision statistics (tritonfleet.fleet.rollout.canary), without hosts.

The two tests are checked against independent exact computations: Fisher's one-sided p from the
hypergeometric tail in exact integer arithmetic, Mann-Whitney's exact p by enumerating every way of
splitting the pooled samples; the normal approximation against the exact p where both apply. The
decision is checked on generated figures: identical sides never roll back, a regression beyond
both the margin and the significance level always does, too little data extends and the last look
rolls back. The figures are read from a real Prometheus (Debian's) holding backfilled series of
known counters (promtool tsdb create-blocks-from openmetrics), a counter reset included."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import statistics
import subprocess
import time
from fractions import Fraction

import pytest
import requests
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tritonfleet.core.errors import UsageError
from tritonfleet.fleet.rollout import canary as cn

# ---- Fisher ----------------------------------------------------------------------------------------


def fisher_exact_reference(fc: int, nc: int, fb: int, nb: int) -> Fraction:
    """P(X >= fc), X hypergeometric, in exact rationals."""
    n, k = nc + nb, fc + fb
    total = math.comb(n, nc)
    return Fraction(sum(math.comb(k, x) * math.comb(n - k, nc - x) for x in range(fc, min(k, nc) + 1)), total)


@st.composite
def two_by_two(draw, most=60):
    nc = draw(st.integers(0, most))
    nb = draw(st.integers(0, most))
    return draw(st.integers(0, nc)), nc, draw(st.integers(0, nb)), nb


@settings(max_examples=400, deadline=None)
@given(two_by_two())
def test_fisher_matches_the_exact_hypergeometric_tail(t):
    assert cn.fisher_greater(*t) == pytest.approx(float(fisher_exact_reference(*t)), rel=1e-9, abs=1e-15)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.integers(500, 5000), st.integers(0, 40), st.integers(5000, 200000))
def test_fisher_at_fleet_sizes_matches_the_exact_tail(fc, nc, fb, nb):
    assume(fc <= nc and fb <= nb)
    exact = fisher_exact_reference(fc, nc, fb, nb)
    assert cn.fisher_greater(fc, nc, fb, nb) == pytest.approx(float(exact), rel=1e-7, abs=1e-300)


def test_fisher_figures_the_decision_relies_on():
    # 2% errors on 750 canary requests (15) against none in 2250 baseline requests: far below 0.01
    assert cn.fisher_greater(15, 750, 0, 2250) < 1e-8
    # one error on the canary, none on the baseline, a quarter of the traffic: p = 1/4
    assert cn.fisher_greater(1, 250, 0, 750) == pytest.approx(0.25)
    assert cn.fisher_greater(0, 100, 5, 100) == 1.0
    with pytest.raises(ValueError):
        cn.fisher_greater(5, 3, 0, 10)


# ---- Mann-Whitney ------------------------------------------------------------------------------------


def mwu_reference(x: list[float], y: list[float]) -> Fraction:
    """P(U >= U observed) over every split of the pooled values into len(x) and len(y)."""
    pooled = x + y
    m = len(x)

    def u(xs, ys):
        return sum((a > b) + Fraction(1, 2) * (a == b) for a in xs for b in ys)

    observed = u(x, y)
    hits = total = 0
    for idx in itertools.combinations(range(len(pooled)), m):
        chosen = set(idx)
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += u(xs, ys) >= observed
    return Fraction(hits, total)


distinct = st.lists(st.integers(0, 10_000), min_size=2, max_size=11, unique=True)


@settings(max_examples=200, deadline=None)
@given(distinct, st.data())
def test_mann_whitney_exact_matches_enumeration(values, data):
    m = data.draw(st.integers(1, len(values) - 1))
    x, y = values[:m], values[m:]
    assert cn.mann_whitney_greater([float(v) for v in x], [float(v) for v in y]) == pytest.approx(
        float(mwu_reference(x, y)), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1000, allow_nan=False), min_size=12, max_size=30, unique=True), st.data())
def test_mann_whitney_normal_approximation_is_close_to_exact(values, data):
    m = data.draw(st.integers(5, len(values) - 5))
    x, y = values[:m], values[m:]
    exact = cn.mann_whitney_greater(x, y)
    limit = cn.EXACT_MWU_LIMIT
    try:
        cn.EXACT_MWU_LIMIT = 0  # force the approximation
        approx = cn.mann_whitney_greater(x, y)
    finally:
        cn.EXACT_MWU_LIMIT = limit
    assert approx == pytest.approx(exact, abs=0.03)


def test_mann_whitney_with_ties_and_edges():
    assert cn.mann_whitney_greater([], [1.0]) == 1.0
    # all equal: every split gives the same U, so the tail holds everything (as the enumeration says)
    assert cn.mann_whitney_greater([5.0] * 6, [5.0] * 6) == 1.0 == float(mwu_reference([5] * 6, [5] * 6))
    # with ties, the approximation against the enumeration
    x, y = [1.0, 2.0, 2.0, 3.0, 5.0, 5.0], [0.0, 1.0, 2.0, 2.0, 2.0, 3.0]
    assert cn.mann_whitney_greater(x, y) == pytest.approx(float(mwu_reference(x, y)), abs=0.03)
    # every canary step slower than every baseline step: as small as 1 / C(m+n, m)
    assert cn.mann_whitney_greater([100.0 + i for i in range(6)], [float(i) for i in range(12)]) == \
        pytest.approx(1 / math.comb(18, 6))


# ---- the decision ------------------------------------------------------------------------------------

S = cn.CanaryPolicy("http://prometheus", min_requests=100, alpha=0.01, max_error_increase=0.005, max_latency_rise=0.2)


def figures(c_ok, c_fail, b_ok, b_fail, c_steps, b_steps) -> cn.Figures:
    c = cn.Side(["c"], c_ok, c_fail, sum(c_steps) / max(len(c_steps), 1) * c_ok, list(c_steps))
    b = cn.Side(["b1", "b2"], b_ok, b_fail, sum(b_steps) / max(len(b_steps), 1) * b_ok, list(b_steps))
    f = cn.Figures(0, 60, c, b)
    f.error_p = cn.fisher_greater(int(c_fail), c.requests, int(b_fail), b.requests)
    if c.steps and b.steps:
        f.latency_rise = statistics.median(c.steps) / statistics.median(b.steps) - 1
        f.latency_p = cn.mann_whitney_greater(c.steps, b.steps)
    return f


steps = st.lists(st.floats(2000, 8000), min_size=6, max_size=15)


@settings(max_examples=200, deadline=None)
@given(st.integers(100, 3000), st.integers(3, 10), steps, st.booleans())
def test_identical_sides_never_roll_back(c_ok, ratio, s, final):
    """The same error ratio and the same latency samples on both sides: promote (never a rollback)."""
    f = figures(c_ok, 0, c_ok * ratio, 0, s, s * 2)
    verdict, why = cn.decide(f, S, final)
    assert verdict == cn.PROMOTE, why


@settings(max_examples=200, deadline=None)
@given(st.integers(300, 3000), st.integers(3, 10), st.floats(0.03, 0.2), st.booleans())
def test_an_error_regression_rolls_back_at_once(c_ok, ratio, err, final):
    fails = math.ceil(c_ok * err)
    f = figures(c_ok, fails, c_ok * ratio, 0, [4000.0] * 8, [4000.0] * 16)
    verdict, why = cn.decide(f, S, final)
    assert verdict == cn.ROLL_BACK and "error ratio" in why, why


@settings(max_examples=200, deadline=None)
@given(st.floats(0.3, 3.0), steps, st.booleans())
def test_a_latency_regression_rolls_back_at_once(rise, base, final):
    slow = [v * (1 + rise) + 3 * max(base) for v in base]  # every canary step above every baseline step
    f = figures(1000, 0, 3000, 0, slow, base + base)
    verdict, why = cn.decide(f, S, final)
    assert verdict == cn.ROLL_BACK and "request time" in why, why


def test_too_little_data_extends_then_rolls_back():
    f = figures(50, 0, 900, 0, [4000.0] * 8, [4000.0] * 16)
    assert cn.decide(f, S, final=False)[0] == cn.EXTEND
    verdict, why = cn.decide(f, S, final=True)
    assert verdict == cn.ROLL_BACK and why.startswith("inconclusive") and "50 canary" in why


def test_marginal_extends_then_promotes_and_down_rolls_back():
    # 6 failures against 1 on as many requests: +0.8 points, past the margin, not significant:
    # more data first; at the last look, with enough requests, no significant regression
    f = figures(594, 6, 599, 1, [4000.0] * 8, [4000.0] * 16)
    assert f.error_p > S.alpha
    assert cn.decide(f, S, final=False)[0] == cn.EXTEND
    verdict, why = cn.decide(f, S, final=True)
    assert verdict == cn.PROMOTE and why.startswith("no significant regression") and "marginal" in why
    f.down = ["c"]
    assert cn.decide(f, S, final=False) == (cn.ROLL_BACK, "the canary's metrics stopped answering (c: up 0)")


@pytest.mark.parametrize("key,value,words", [
    ("canary_prometheus_url", None, "canary_prometheus_url"),
    ("canary_prometheus_url", "prometheus:9090", "canary_prometheus_url"),
    ("canary_alpha", 0.9, "canary_alpha"),
    ("canary_min_requests", 0, "canary_min_requests"),
    ("canary_max_extensions", 1.5, "canary_max_extensions"),
    ("canary_step_seconds", 120, "at least 5 steps"),
    ("canary_analysis_seconds", "300", "canary_analysis_seconds"),
])
def test_settings_are_checked(key, value, words):
    from tritonfleet.settings.defaults import DEFAULTS

    data = {**DEFAULTS, "canary_prometheus_url": "http://127.0.0.1:9090", key: value}
    with pytest.raises(UsageError, match=words):
        cn.CanaryPolicy.from_settings(data, "tb1's data")
    assert cn.CanaryPolicy.from_settings({**DEFAULTS, "canary_prometheus_url": "http://p:9090/"}, "x").prometheus_url == \
        "http://p:9090"


# ---- the figures from a real Prometheus ----------------------------------------------------------

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _values(host: str, model: str, t: int) -> tuple[int, int, int]:
    """(successes, failures, duration us) a host's Triton reports at second ``t``: canary c (10
    req/s, 1 failure every 5 s, 6 ms each, restarted at +32 s: its counters start again from 0),
    baselines b1 (two models, 20 and 10 req/s) and b2 (30 req/s), no failure, 4 ms each, and a host
    outside the comparison."""
    if host == "c":
        ct = t if t < 32 else t - 32
        return 10 * ct, ct // 5, 10 * ct * 6000
    if host == "other":
        return 1000 * t, 500 * t, 1
    rate = {("b1", "m"): 20, ("b1", "n"): 10, ("b2", "m"): 30}[(host, model)]
    return rate * t, 0, rate * t * 4000


SERIES = [("c", "m"), ("b1", "m"), ("b1", "n"), ("b2", "m"), ("other", "m")]


def _openmetrics(start: int, seconds: int) -> str:
    """The counters above scraped every second, as OpenMetrics (type unknown: the names stay as
    Triton exports them, without the _total suffix OpenMetrics gives counters)."""
    out = {}
    for t in range(seconds + 1):
        for host, model in SERIES:
            ok, fail, dur = _values(host, model, t)
            labels = f'job="triton",host="{host}",model="{model}",version="1"'
            out.setdefault("nv_inference_request_success", []).append(
                f"nv_inference_request_success{{{labels}}} {ok} {start + t}")
            out.setdefault("nv_inference_request_failure", []).append(
                f'nv_inference_request_failure{{{labels},reason="BACKEND"}} {fail} {start + t}')
            out.setdefault("nv_inference_request_duration_us", []).append(
                f"nv_inference_request_duration_us{{{labels}}} {dur} {start + t}")
        for host in ("c", "b1", "b2"):
            out.setdefault("up", []).append(f'up{{job="triton",host="{host}"}} 1 {start + t}')
    lines = []
    for metric, rows in out.items():
        lines += [f"# TYPE {metric} unknown", *rows]
    return "\n".join(lines + ["# EOF"]) + "\n"


def _expected(hosts: list[str], a: int, b: int, step: int, model: str | None = None) -> tuple[int, int, int]:
    """The increases over [a, b] read step by step, a decrease counting the new value."""
    total = [0, 0, 0]
    for t in range(a + step, b + 1, step):
        for host, m in SERIES:
            if host in hosts and (model is None or m == model):
                for i, (old, new) in enumerate(zip(_values(host, m, t - step), _values(host, m, t), strict=True)):
                    total[i] += new - old if new >= old else new
    return tuple(total)


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    work = tmp_path_factory.mktemp("prom")
    start = int(time.time()) - 3 * 3600
    start -= start % 60
    (work / "data.om").write_text(_openmetrics(start, 120))
    res = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(work / "data.om"),
                          str(work / "tsdb")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    (work / "prometheus.yml").write_text("global: {}\n")
    from tritonfleet_testbed.ports import free_port

    port = free_port()
    log = open(work / "log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=30d", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (work / "log").read_text()
            try:
                if requests.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "prometheus did not get ready"
            time.sleep(0.3)
        yield url, start
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_figures_from_prometheus(backfilled):
    url, start = backfilled
    s = cn.CanaryPolicy(url, step_seconds=5, min_requests=10)
    f = cn.collect(cn.Prometheus(url), s, ["c"], ["b1", "b2"], start + 10, start + 70)
    ok, fail, dur = _expected(["c"], 10, 70, 5)
    assert (f.canary.success, f.canary.failures, f.canary.duration_us) == (ok, fail, dur)
    assert f.canary.success < 600  # what the restart cut off between two steps is not made up
    ok, fail, dur = _expected(["b1", "b2"], 10, 70, 5)
    assert (f.baseline.success, f.baseline.failures, f.baseline.duration_us) == (ok, fail, dur) == (3600, 0, 3600 * 4000)
    assert f.canary.mean_ms == pytest.approx(6.0) and f.baseline.mean_ms == pytest.approx(4.0)
    # a sample per host and step with requests (the step across the restart: what the new process did)
    assert len(f.canary.steps) == 12 and len(f.baseline.steps) == 24
    assert f.latency_rise == pytest.approx(0.5)
    assert f.latency_p < 1e-6 and f.error_p < 1e-4
    assert f.down == []
    verdict, why = cn.decide(f, s, final=False)
    assert verdict == cn.ROLL_BACK and "error ratio" in why and "+50%" in why, why
    # one model only
    f2 = cn.collect(cn.Prometheus(url), cn.CanaryPolicy(url, step_seconds=5, model="n"), ["c"], ["b1", "b2"],
                    start + 10, start + 70)
    assert f2.canary.success == 0 and f2.baseline.success == _expected(["b1", "b2"], 10, 70, 5, "n")[0] == 600
    assert json.dumps(f.to_json())  # the report can hold it
    # latency against the matched baseline only (b2), errors against every baseline host
    f3 = cn.collect(cn.Prometheus(url), s, ["c"], ["b1", "b2"], start + 10, start + 70, matched=["b2"])
    assert f3.matched.success == _expected(["b2"], 10, 70, 5)[0] and len(f3.matched.steps) == 12
    assert f3.baseline.success == f.baseline.success and f3.error_p == f.error_p
    assert f3.latency_ref is f3.matched and f.latency_p < f3.latency_p < 1e-5  # 12 against 12 steps
    assert "on b2" in cn.decide(f3, s, final=False)[1]


def test_prometheus_errors_are_named(backfilled):
    url, start = backfilled
    with pytest.raises(cn.CanaryError, match="refused"):
        cn.Prometheus(url).query_range("sum(", start, start + 10, 1)
    with pytest.raises(cn.CanaryError, match="cannot query Prometheus at http://127.0.0.1:1"):
        cn.Prometheus("http://127.0.0.1:1").query_range("up", start, start + 10, 1)


def test_analyse_looks_until_a_verdict(backfilled):
    """analyse() on the backfilled window with a clock of its own: the first look rolls back."""
    url, start = backfilled
    clock = {"t": start + 10.0}
    said = []
    res = cn.analyse(cn.Prometheus(url), cn.CanaryPolicy(url, analysis_seconds=30, step_seconds=5, min_requests=10),
                     ["c"], ["b1", "b2"], start + 10, said.append, sleep=lambda s: clock.update(t=clock["t"] + s),
                     now=lambda: clock["t"])
    assert res.verdict == cn.ROLL_BACK and len(res.looks) == 1
    assert res.looks[0].seconds == 30 and "look 1" in said[0]
    # not enough requests in any look: two extensions, then inconclusive
    clock["t"] = start + 10.0
    res = cn.analyse(cn.Prometheus(url), cn.CanaryPolicy(url, analysis_seconds=25, step_seconds=5, min_requests=10 ** 6,
                                                     max_extensions=2, max_latency_rise=10, max_error_increase=1),
                     ["c"], ["b1", "b2"], start + 10, said.append, sleep=lambda s: clock.update(t=clock["t"] + s),
                     now=lambda: clock["t"])
    assert [f.verdict for f in res.looks] == [cn.EXTEND, cn.EXTEND, cn.ROLL_BACK]
    assert [f.seconds for f in res.looks] == [25, 50, 75]
    assert res.why.startswith("inconclusive")


# ---- the error signal: Triton counts a failed ONNX Runtime run -------------------------------------

def test_a_failed_run_is_counted_as_failed_by_triton(tmp_path):
    """What the canary reads: the real tritonserver with the testbed's onnxruntime stand-in counts
    a request whose ONNX Runtime run failed in nv_inference_request_failure (reason BACKEND), as
    the real backend does, and the request after it succeeds. The failing release is the one the
    testbed's canary tests deploy: a text classifier without its token hashing."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.support.canary_load import GOOD_IDS, MODEL, POISON_IDS, body, regression_repository
    from tests.support.tritonproc import cpu_config, local_server

    repo = regression_repository(tmp_path / "repo")
    for cfg in repo.glob("*/config.pbtxt"):
        cfg.write_text(cpu_config(cfg.read_text()))
    with local_server(repo, tmp_path) as server:
        codes = [requests.post(f"http://{server.url}/v2/models/{MODEL}/infer", json=body(ids), timeout=30).status_code
                 for ids in (GOOD_IDS, POISON_IDS, GOOD_IDS, POISON_IDS, POISON_IDS)]
        text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    assert codes == [200, 500, 200, 500, 500]
    counts = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("model") == MODEL and s.name.startswith("nv_inference_request_"):
                key = s.name.removesuffix("_total") + (f"/{s.labels['reason']}" if "reason" in s.labels else "")
                counts[key] = s.value
    assert counts["nv_inference_request_success"] == 2
    assert counts["nv_inference_request_failure/BACKEND"] == 3


# ---- answers the analysis cannot read ------------------------------------------------------------

class _Answer:
    def __init__(self, body):
        self.body, self.status_code = body, 200

    def json(self):
        return self.body


class _Http:
    def __init__(self, body):
        self.body = body

    def get(self, *a, **k):
        return _Answer(self.body)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=8)
_value = st.one_of(_json, st.sampled_from(["x", "", "Inf", "-Inf", "1e999"]))
_series = st.fixed_dictionaries({"metric": st.one_of(st.fixed_dictionaries({"host": st.one_of(st.just("c"), _json)}),
                                                     _json),
                                 "values": st.one_of(st.lists(st.one_of(st.tuples(_value, _value).map(list), _json),
                                                              min_size=1, max_size=3), _json)})
_near_miss = st.fixed_dictionaries({"status": st.just("success"), "data": st.one_of(
    st.fixed_dictionaries({"resultType": st.just("matrix"), "result": st.lists(_series, min_size=1, max_size=2)}),
    _json)})


def _readable(body) -> bool:
    """The generated body happens to be a well-formed answer (then any verdict may come)."""
    try:
        cn._per_host(body["data"]["result"])
        return body["data"].get("resultType", "matrix") == "matrix"
    except (KeyError, TypeError, AttributeError, ValueError, IndexError, cn.CanaryError):
        return False


@settings(max_examples=150, deadline=None)
@given(st.one_of(_json, _near_miss))
def test_an_answer_the_analysis_cannot_read_rolls_back(body):
    """Any 200 answer of another shape (the review's {"status":"success"}, [1, 2], a value "x")
    is a CanaryError, so analyse() rolls back: never an exception out of it, never a promotion."""
    prom = cn.Prometheus("http://127.0.0.1:1")
    prom.http = _Http(body)
    s = cn.CanaryPolicy("http://127.0.0.1:1", analysis_seconds=30, step_seconds=5, min_requests=1)
    res = cn.analyse(prom, s, ["c"], ["b"], 1000.0, lambda m: None, sleep=lambda t: None, now=lambda: 1031.0)
    if not _readable(body):
        assert res.verdict == cn.ROLL_BACK and "could not read" in res.why


@pytest.mark.parametrize("body", [{"status": "success"}, [1, 2],
                                  {"status": "success", "data": {"resultType": "matrix", "result": [
                                      {"metric": {"host": "c"}, "values": [[1000, "x"]]}]}}])
def test_the_reviews_answers_are_canary_errors(body):
    prom = cn.Prometheus("http://127.0.0.1:1")
    prom.http = _Http(body)
    with pytest.raises(cn.CanaryError):
        cn._per_host(prom.query_range("up", 1000, 1030, 5))


# ---- the blind spot: failures only HAProxy sees --------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["pxname", "svname", "stot", "hrsp_5xx", "eresp", "econ"]),
                                st.one_of(st.sampled_from(["triton", "s1", "BACKEND", "", "7", "-1", "x"]),
                                          st.text(max_size=3)), max_size=6), max_size=4))
def test_haproxy_counters_it_cannot_read_are_canary_errors(rows):
    try:
        out = cn.lb_counters(rows, "triton")
    except cn.CanaryError:
        return
    assert all(isinstance(n, int) and isinstance(f, int) and n >= 0 and f >= 0 for n, f in out.values())


def test_failures_only_haproxy_counts_roll_the_canary_back(tmp_path):
    """A canary whose server answers HAProxy's requests with 500 (its health check passes, as a
    container crash-looping between scrapes can look): the verdict from HAProxy's per-server
    counters rolls it back; the same traffic with a sound canary does not."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.support.haproxy import HAProxy, ok_server
    from tritonfleet.serving.drain import HAProxy as Runtime
    from tritonfleet.serving.drain import parse_stat

    class Failing(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            code = 200 if self.path.startswith("/v2/health") else 500
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    bad = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=bad.serve_forever, daemon=True).start()
    s = cn.CanaryPolicy("http://127.0.0.1:1")
    try:
        with ok_server() as good, HAProxy(tmp_path, [("c", f"127.0.0.1:{bad.server_address[1]}"), ("b1", good),
                                                     ("b2", good)], inter="200ms") as hap:
            for n in ("c", "b1", "b2"):
                Runtime([hap.socket], "triton", n).wait_serving(10)

            def counters():
                return cn.lb_counters(parse_stat(hap.command("show stat")), "triton")

            before = counters()
            with requests.Session() as http:
                for _ in range(90):
                    http.get(hap.url + "/v2/models/m/infer", timeout=5)
            after = counters()
            back, why = cn.lb_verdict(before, after, ["c"], ["b1", "b2"], s)
            assert back and "HAProxy counted 30 failure(s)" in why and "in 30 session(s)" in why
            assert cn.lb_verdict(before, after, ["b1"], ["b2"], s) == (False, "")
    finally:
        bad.shutdown()
        bad.server_close()
