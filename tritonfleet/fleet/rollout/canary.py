"""The traffic canary's analysis: canary hosts against baseline hosts, from Triton's own counters in
Prometheus, over an analysis window; a statistical test per signal, a minimum number of requests,
and a verdict: promote, extend (look again after another window) or roll back.

Signals (Triton's per-model counters, summed per ``host`` label over the models, or one model with
``canary_model``; metric names and meanings: Triton's metrics documentation,
https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md):

* **error ratio**: ``nv_inference_request_failure`` / (``nv_inference_request_success`` +
  ``nv_inference_request_failure``) over the window. Test: Fisher's exact test, one-sided (is the
  canary's failure proportion greater than the baseline's?), computed exactly from the
  hypergeometric distribution. A rollback needs p < ``canary_alpha`` AND a canary ratio above the
  baseline's by more than ``canary_max_error_increase``.
* **latency**: ``nv_inference_request_duration_us`` / ``nv_inference_request_success`` (Triton's
  end-to-end request time, queue included; the counters give means, not percentiles), against
  the *matched* baseline hosts when there are any: hosts of the old release that HAProxy gives the
  canaries' weight, so they work under the same load (through dynamic batching a request's queue
  time depends on the load: a lightly loaded canary compared with busy hosts looks slower; measured
  on the testbed, +42% for an identical release at 5% against hosts at 47.5% each). The window
  is cut into steps of ``canary_step_seconds``; each host's mean of each step is one sample.
  Test: Mann-Whitney U, one-sided (do the canary's step means tend to be greater than the
  baseline hosts'?), exact without ties, normal approximation with tie correction otherwise (the
  test Spinnaker's Kayenta judge uses on canary against baseline time series:
  https://spinnaker.io/guides/user/canary/judge). A rollback needs p < ``canary_alpha`` AND the
  canary's mean above the baseline's by more than ``canary_max_latency_rise``.
* **up**: a canary whose metrics endpoint stops answering (``up`` 0) in the window is rolled back.

Verdicts: fewer than ``canary_min_requests`` requests on either side, or fewer than
:data:`MIN_INTERVALS` steps, is not enough to judge: extend, and after ``canary_max_extensions``
extensions roll back (fail safe: a canary that could not be judged is not promoted). A signal past
its margin but not significant (p >= alpha) is marginal: extend; at the last look, with enough
requests, the test found no significant regression: promote (said in the verdict). A significant
regression rolls back at once; otherwise promote. Each look uses everything since the window
started. The latency's size is the ratio of the medians of the step means (robust to one slow
step on a loaded machine; the pooled means are reported beside it).

Prometheus's HTTP API: ``GET /api/v1/query_range`` with ``query``, ``start``, ``end`` (Unix
seconds) and ``step``; the answer ``{"status": "success", "data": {"resultType": "matrix",
"result": [{"metric": {...}, "values": [[<unix time>, "<value>"], ...]}]}}``, values as strings
(https://prometheus.io/docs/prometheus/latest/querying/api/#range-queries). A range query's value
at a step is the newest sample at or before it, so counters are read as the differences between
consecutive steps (a decrease is a counter reset: the new value counts from 0).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import requests

from ...core.errors import TritonfleetError, UsageError
from ...observability.rule_text import host_regex
from ...settings import access

MIN_INTERVALS = 5  # steps a side needs before the latency test counts
EXACT_MWU_LIMIT = 2500  # m * n up to which Mann-Whitney's p is exact (no ties)


class CanaryError(TritonfleetError):
    """The analysis could not run (Prometheus unreachable or answering an error)."""


# ---- statistics ----------------------------------------------------------------------------------


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_greater(fc: int, nc: int, fb: int, nb: int) -> float:
    """One-sided Fisher exact test: the probability, with no difference between the two, of the
    canary having ``fc`` or more of all ``fc + fb`` failures among its ``nc`` of ``nc + nb``
    requests (hypergeometric upper tail). Small: the canary fails more often than the baseline."""
    if min(fc, nc, fb, nb) < 0 or fc > nc or fb > nb:
        raise ValueError(f"counts out of range: {fc}/{nc} against {fb}/{nb}")
    total, failures = nc + nb, fc + fb
    if failures == 0 or nc == 0:
        return 1.0
    lo, hi = max(0, failures - nb), min(failures, nc)
    if fc <= lo:
        return 1.0
    denom = _log_comb(total, nc)

    def pmf(k: int) -> float:
        return math.exp(_log_comb(failures, k) + _log_comb(total - failures, nc - k) - denom)

    mode = int((nc + 1) * (failures + 1) / (total + 2))
    if fc > mode:  # the upper tail is the short side: sum it, terms fall from the first
        p, k = 0.0, fc
        while k <= hi:
            term = pmf(k)
            p += term
            if term < p * 1e-17:
                break
            k += 1
        return min(1.0, p)
    q, k = 0.0, fc - 1  # the lower tail below fc, from its top down; p = 1 - it
    while k >= lo:
        term = pmf(k)
        q += term
        if term < q * 1e-17:
            break
        k -= 1
    return max(0.0, min(1.0, 1.0 - q))


def _u_statistic(x: list[float], y: list[float]) -> tuple[float, bool]:
    """(U of ``x``: pairs where x > y, ties half, whether there were ties)."""
    merged = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    ranks = [0.0] * len(merged)
    ties = False
    i = 0
    while i < len(merged):
        j = i
        while j + 1 < len(merged) and merged[j + 1][0] == merged[i][0]:
            j += 1
        if j > i:
            ties = True
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    rx = sum(r for r, (_, side) in zip(ranks, merged, strict=True) if side == 0)
    return rx - len(x) * (len(x) + 1) / 2, ties


def _u_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) orderings give U = 0..m*n (the Gaussian binomial's
    coefficients: prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i))."""
    poly = [1]
    for i in range(1, m + 1):
        # multiply by (1 - q^(n+i))
        grown = poly + [0] * (n + i)
        for k in range(len(poly)):
            grown[k + n + i] -= poly[k]
        # divide by (1 - q^i): running sum with stride i
        for k in range(i, len(grown)):
            grown[k] += grown[k - i]
        poly = grown[: m * n + 1] if len(grown) > m * n + 1 else grown
    return (poly + [0] * (m * n + 1))[: m * n + 1]


def mann_whitney_greater(x: list[float], y: list[float]) -> float:
    """One-sided Mann-Whitney U test: the probability, with ``x`` and ``y`` from one distribution,
    of a U of ``x`` at least the one observed. Small: ``x`` tends to be greater than ``y``. Exact
    for m * n <= EXACT_MWU_LIMIT without ties; else the normal approximation with the tie
    correction and a continuity correction."""
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        return 1.0
    u, ties = _u_statistic(x, y)
    if not ties and m * n <= EXACT_MWU_LIMIT:
        counts = _u_counts(m, n)
        at_least = sum(counts[math.ceil(u - 1e-9) :])
        return at_least / math.comb(m + n, m)
    total = m + n
    values = sorted(x + y)
    tie_sum, i = 0, 0
    while i < total:
        j = i
        while j + 1 < total and values[j + 1] == values[i]:
            j += 1
        t = j - i + 1
        tie_sum += t**3 - t
        i = j + 1
    var = m * n / 12 * ((total + 1) - tie_sum / (total * (total - 1)))
    if var <= 0:
        return 1.0
    z = (u - m * n / 2 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


# ---- settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanaryPolicy:
    prometheus_url: str
    job: str = "triton"
    model: str | None = None
    analysis_seconds: float = 300
    step_seconds: float = 30
    max_extensions: int = 2
    min_requests: int = 500
    alpha: float = 0.01
    max_error_increase: float = 0.005
    max_latency_rise: float = 0.2
    watchdog_ttl: float = 60.0

    @classmethod
    def from_settings(cls, settings: access.Settings, where: str) -> CanaryPolicy:
        """The canary_* tunables of ``settings`` (a host's), checked together; UsageError naming the
        tunable otherwise (each one alone is checked when the inventory is loaded:
        tritonfleet.settings.check)."""
        get = settings.get
        url = get("canary_prometheus_url")
        if not url or not str(url).startswith(("http://", "https://")):
            raise UsageError(
                f"a traffic canary reads Prometheus: set canary_prometheus_url (http://host:9090), "
                f"not {url!r} ({where})"
            )

        def num(key: str, low: float, high: float | None = None, whole: bool = False):
            v = get(key)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= low
            ok = ok and (high is None or v <= high) and (not whole or float(v).is_integer())
            if not ok:
                rng = f">= {low}" + (f" and <= {high}" if high is not None else "")
                raise UsageError(f"{key} must be a {'whole ' if whole else ''}number {rng}, not {v!r} ({where})")
            return int(v) if whole else float(v)

        s = cls(
            str(url).rstrip("/"),
            str(get("canary_prometheus_job")),
            get("canary_model") or None,
            num("canary_analysis_seconds", 1),
            num("canary_step_seconds", 0.1),
            num("canary_max_extensions", 0, whole=True),
            num("canary_min_requests", 1, whole=True),
            num("canary_alpha", 1e-9, 0.5),
            num("canary_max_error_increase", 0, 1),
            num("canary_max_latency_rise", 0),
            num("canary_watchdog_ttl", 1),
        )
        if s.analysis_seconds / s.step_seconds < MIN_INTERVALS:
            raise UsageError(
                f"canary_analysis_seconds ({s.analysis_seconds:g}) must hold at least {MIN_INTERVALS} "
                f"steps of canary_step_seconds ({s.step_seconds:g}) for the latency test ({where})"
            )
        return s


# ---- figures and the decision --------------------------------------------------------------------


@dataclass
class Side:
    hosts: list[str]
    success: float = 0
    failures: float = 0
    duration_us: float = 0
    steps: list[float] = field(default_factory=list)  # mean request time (us) of each host's step

    @property
    def requests(self) -> int:
        return int(round(self.success + self.failures))

    @property
    def error_ratio(self) -> float:
        return self.failures / (self.success + self.failures) if self.success + self.failures else 0.0

    @property
    def mean_ms(self) -> float | None:
        return self.duration_us / self.success / 1000 if self.success else None

    @property
    def median_step_ms(self) -> float | None:
        """The median of the steps' mean request times (what the latency's size is taken from)."""
        return statistics.median(self.steps) / 1000 if self.steps else None


@dataclass
class Figures:
    """What one look at the window gave, and the tests on it. ``baseline``: every baseline host
    (errors); ``matched``: those at the canaries' weight (latency), None when there are none."""

    start: float
    end: float
    canary: Side
    baseline: Side
    matched: Side | None = None
    error_p: float = 1.0
    latency_p: float = 1.0
    latency_rise: float | None = None
    down: list[str] = field(default_factory=list)  # canary hosts whose metrics stopped answering
    verdict: str = ""
    why: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def latency_ref(self) -> Side:
        """The side the canary's latency is compared with."""
        return self.matched if self.matched is not None else self.baseline

    def summary(self) -> str:
        c, b, r = self.canary, self.baseline, self.latency_ref
        lat = (
            f"step median {c.median_step_ms:.2f} ms vs {r.median_step_ms:.2f} ms on {', '.join(r.hosts)} "
            f"({self.latency_rise * 100:+.0f}%, p={self.latency_p:.2g}, {len(c.steps)}/{len(r.steps)} steps; "
            f"means {c.mean_ms:.2f} and {r.mean_ms:.2f} ms)"
            if self.latency_rise is not None
            else "latency: no successful request on a side"
        )
        return (
            f"{self.seconds:.0f}s: {c.requests} canary / {b.requests} baseline requests; errors "
            f"{c.error_ratio * 100:.2f}% vs {b.error_ratio * 100:.2f}% (p={self.error_p:.2g}); {lat}"
        )

    def to_json(self) -> dict:
        d = asdict(self)
        for side in ("canary", "baseline", "matched"):
            s = getattr(self, side)
            if s is not None:
                d[side].update(
                    requests=s.requests, error_ratio=s.error_ratio, mean_ms=s.mean_ms, median_step_ms=s.median_step_ms
                )
        d["seconds"] = self.seconds
        return d


PROMOTE, EXTEND, ROLL_BACK = "promote", "extend", "roll back"


def decide(f: Figures, s: CanaryPolicy, final: bool) -> tuple[str, str]:
    """(verdict, why) for one look; ``final``: no extension left."""
    c, b, r = f.canary, f.baseline, f.latency_ref
    if f.down:
        return ROLL_BACK, f"the canary's metrics stopped answering ({', '.join(f.down)}: up 0)"
    regress: list[str] = []
    marginal: list[str] = []
    diff = c.error_ratio - b.error_ratio
    if diff > s.max_error_increase:
        what = (
            f"error ratio {c.error_ratio * 100:.2f}% vs baseline {b.error_ratio * 100:.2f}% "
            f"(+{diff * 100:.2f} points, canary_max_error_increase {s.max_error_increase * 100:.2f}; "
            f"Fisher p={f.error_p:.2g}, canary_alpha {s.alpha:g})"
        )
        (regress if f.error_p < s.alpha else marginal).append(what)
    if f.latency_rise is not None and f.latency_rise > s.max_latency_rise:
        what = (
            f"request time (median of the step means) {c.median_step_ms:.2f} ms vs {r.median_step_ms:.2f} ms on "
            f"{', '.join(r.hosts)} "
            f"(+{f.latency_rise * 100:.0f}%, canary_max_latency_rise {s.max_latency_rise * 100:.0f}%; "
            f"Mann-Whitney p={f.latency_p:.2g} over {len(c.steps)} and {len(r.steps)} steps)"
        )
        enough_steps = len(c.steps) >= MIN_INTERVALS and len(r.steps) >= MIN_INTERVALS
        (regress if f.latency_p < s.alpha and enough_steps else marginal).append(what)
    if regress:
        return ROLL_BACK, "regression: " + "; ".join(regress)
    short = []
    if c.requests < s.min_requests or b.requests < s.min_requests:
        short.append(
            f"{c.requests} canary and {b.requests} baseline requests (canary_min_requests {s.min_requests} each)"
        )
    if len(c.steps) < MIN_INTERVALS or len(r.steps) < MIN_INTERVALS:
        short.append(
            f"{len(c.steps)} canary and {len(r.steps)} baseline steps with requests (at least {MIN_INTERVALS} each)"
        )
    if short or marginal:
        why = "; ".join(
            ([f"not enough to judge: {', '.join(short)}"] if short else [])
            + [f"marginal, not significant: {m}" for m in marginal]
        )
        if not final:
            return EXTEND, why
        if short:
            return ROLL_BACK, f"inconclusive after the last extension: {why}"
        return PROMOTE, f"no significant regression after the last extension ({why})"
    return PROMOTE, (
        f"no regression: errors +{max(diff, 0) * 100:.2f} points (p={f.error_p:.2g}), latency "
        + (f"{f.latency_rise * 100:+.0f}% (p={f.latency_p:.2g})" if f.latency_rise is not None else "-")
    )


# ---- Prometheus ----------------------------------------------------------------------------------


class Prometheus:
    """The few calls of Prometheus's HTTP API the analysis makes."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.http = requests.Session()
        self.http.trust_env = False

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        try:
            r = self.http.get(
                f"{self.url}/api/v1/query_range",
                timeout=self.timeout,
                params={"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
            )
            body = r.json()
        except (requests.RequestException, ValueError) as e:
            raise CanaryError(f"cannot query Prometheus at {self.url} (canary_prometheus_url): {e}") from e
        if not isinstance(body, dict) or body.get("status") != "success":
            what = (
                f"{body.get('errorType', '')} {body.get('error', r.status_code)}"
                if isinstance(body, dict)
                else f"an answer of type {type(body).__name__}"
            )
            raise CanaryError(f"Prometheus at {self.url} refused {expr!r}: {what}")
        data = body.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or (data.get("resultType", "matrix") != "matrix"):
            raise CanaryError(
                f"Prometheus at {self.url} answered {expr!r} without a range result "
                "(data.resultType matrix, data.result a list): not a Prometheus query_range answer"
            )
        return result


def _selector(s: CanaryPolicy, hosts: list[str]) -> str:
    model = f', model="{s.model}"' if s.model else ""
    return f'{{job="{s.job}", host=~`{host_regex(sorted(hosts))}`{model}}}'


def _per_host(result: list) -> dict[str, dict[float, float]]:
    """{host: {time: value}} of a query_range result; CanaryError for anything else than series
    of a host label and [time, finite number] pairs (an answer the analysis cannot read is never
    read as "no errors")."""
    out: dict[str, dict[float, float]] = {}
    for series in result:
        metric = series.get("metric") if isinstance(series, dict) else None
        values = series.get("values") if isinstance(series, dict) else None
        host = metric.get("host", "") if isinstance(metric, dict) else None
        if not isinstance(host, str) or not isinstance(values, list):
            raise CanaryError(f"Prometheus answered a series the analysis cannot read: {str(series)[:120]}")
        points = out.setdefault(host, {})
        for pair in values:
            try:
                t, v = pair
                t, v = float(t), float(v)
            except (TypeError, ValueError) as e:
                raise CanaryError(
                    f"Prometheus answered a value the analysis cannot read for host {host!r}: {str(pair)[:80]} ({e})"
                ) from None
            if math.isinf(v) or not math.isfinite(t):
                raise CanaryError(
                    f"Prometheus answered a value the analysis cannot read for host {host!r}: {str(pair)[:80]}"
                )
            points[t] = v
    return out


def _deltas(points: dict[float, float], times: list[float]) -> dict[float, float]:
    """{step end: increase over the step} for consecutive steps that both have a value."""
    out = {}
    for a, b in zip(times, times[1:], strict=False):
        if a in points and b in points and not (math.isnan(points[a]) or math.isnan(points[b])):
            d = points[b] - points[a]
            out[b] = d if d >= 0 else points[b]  # a decrease: the counter restarted from 0
    return out


def collect(
    prom: Prometheus,
    s: CanaryPolicy,
    canaries: list[str],
    baseline: list[str],
    start: float,
    end: float,
    matched: list[str] | None = None,
) -> Figures:
    """Both sides' counters over [start, end] (whole steps of canary_step_seconds) and the tests;
    ``matched``: the baseline hosts the latency is compared with (None: every baseline host)."""
    steps = max(1, int((end - start) / s.step_seconds))
    end = start + steps * s.step_seconds
    times = [round(start + i * s.step_seconds, 3) for i in range(steps + 1)]
    hosts = canaries + baseline
    sel = _selector(s, hosts)
    data = {}
    for key, metric in (
        ("success", "nv_inference_request_success"),
        ("failures", "nv_inference_request_failure"),
        ("duration_us", "nv_inference_request_duration_us"),
    ):
        data[key] = _per_host(prom.query_range(f"sum by (host) ({metric}{sel})", start, end, s.step_seconds))
    up = _per_host(
        prom.query_range(
            f'min by (host) (up{{job="{s.job}", host=~`{host_regex(sorted(canaries))}`}})', start, end, s.step_seconds
        )
    )
    fig = Figures(start, end, Side(list(canaries)), Side(list(baseline)), Side(list(matched)) if matched else None)
    sides = [(fig.canary, canaries), (fig.baseline, baseline)] + ([(fig.matched, matched)] if matched else [])
    for side, names in sides:
        for h in names:
            d = {k: _deltas(data[k].get(h, {}), times) for k in data}
            side.success += sum(d["success"].values())
            side.failures += sum(d["failures"].values())
            side.duration_us += sum(d["duration_us"].values())
            for t, n in d["success"].items():
                if n > 0 and t in d["duration_us"]:
                    side.steps.append(d["duration_us"][t] / n)
    fig.down = sorted(h for h in canaries if any(v == 0 for v in up.get(h, {}).values()))
    fig.error_p = fisher_greater(
        int(round(fig.canary.failures)), fig.canary.requests, int(round(fig.baseline.failures)), fig.baseline.requests
    )
    ref = fig.latency_ref
    if fig.canary.steps and ref.steps and statistics.median(ref.steps) > 0:
        fig.latency_rise = statistics.median(fig.canary.steps) / statistics.median(ref.steps) - 1
        fig.latency_p = mann_whitney_greater(fig.canary.steps, ref.steps)
    return fig


@dataclass
class Result:
    verdict: str
    why: str
    looks: list[Figures]
    started: float
    decided: float

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "why": self.why,
            "looks": [f.to_json() for f in self.looks],
            "started": self.started,
            "decided": self.decided,
        }


def analyse(
    prom: Prometheus,
    s: CanaryPolicy,
    canaries: list[str],
    baseline: list[str],
    start: float,
    echo: Callable[[str], None],
    hold: Callable[[], None] = lambda: None,
    matched: list[str] | None = None,
    sleep: Callable[[float], None] | None = None,
    now: Callable[[], float] = time.time,
) -> Result:
    """Look after each window (canary_analysis_seconds from ``start``, then once more per
    extension, each look over everything since ``start``) until a verdict other than extend.
    ``hold`` is called before each verdict is acted on (the rollout's pause). ``sleep`` defaults to
    time.sleep as it is at the call (gevent, which pyinfra's command line installs, replaces it by
    a cooperative one after this module may have been imported: the rollout's metrics endpoint and
    capacity readings must go on while the analysis waits)."""
    sleep = sleep or time.sleep
    looks: list[Figures] = []
    for look in range(s.max_extensions + 1):
        due = start + (look + 1) * s.analysis_seconds
        if due > now():
            sleep(due - now())
        hold()
        try:
            fig = collect(prom, s, canaries, baseline, start, max(due, now() - 1), matched)
        except CanaryError as e:
            return Result(ROLL_BACK, f"the analysis could not read its figures: {e}", looks, start, now())
        fig.verdict, fig.why = decide(fig, s, final=look == s.max_extensions)
        looks.append(fig)
        echo(f"[canary analysis] look {look + 1}: {fig.summary()}: {fig.verdict} ({fig.why})")
        if fig.verdict != EXTEND:
            return Result(fig.verdict, fig.why, looks, start, now())
    # decide() never extends at the last look; were it to, an undecided canary is not promoted
    return Result(ROLL_BACK, "undecided after the last look", looks, start, now())


# ---- what HAProxy saw ----------------------------------------------------------------------------

#: HAProxy's per-server counters of failures Triton never counts: 5xx answers (HAProxy's own 502/503
#: for a server that crashed or reset included), response errors, connection errors
LB_ERROR_FIELDS = ("hrsp_5xx", "eresp", "econ")


def lb_counters(rows: list[dict], backend: str) -> dict[str, tuple[int, int]]:
    """{server: (sessions, failures)} from ``show stat`` rows of ``backend``: ``stot``, and
    LB_ERROR_FIELDS summed. CanaryError for a server row whose counters are not numbers (never
    read as "no failures"); an empty field (not counted in this mode) is 0."""
    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        if r.get("pxname") != backend or r.get("svname") in ("FRONTEND", "BACKEND", None):
            continue
        vals = [r.get(k) for k in ("stot", *LB_ERROR_FIELDS)]
        if vals[0] in (None, "") or not all(v is None or v == "" or str(v).isdigit() for v in vals):
            raise CanaryError(
                f"HAProxy's counters of {backend}/{r.get('svname')} cannot be read: "
                f"{dict(zip(('stot', *LB_ERROR_FIELDS), vals, strict=True))}"
            )
        n, *errs = (int(v) if v else 0 for v in vals)
        out[r["svname"]] = (n, sum(errs))
    return out


def lb_verdict(
    before: dict[str, tuple[int, int]],
    after: dict[str, tuple[int, int]],
    canaries: list[str],
    baseline: list[str],
    s: CanaryPolicy,
) -> tuple[bool, str]:
    """(roll back?, why) from HAProxy's counters over the analysis: the canary servers' failure
    ratio (5xx, response and connection errors per session) against the baseline servers', with
    the same limits as Triton's errors (canary_max_error_increase, Fisher's test at canary_alpha)."""

    def side(servers: list[str]) -> tuple[int, int]:
        n = f = 0
        for sv in servers:
            if sv not in before or sv not in after:
                raise CanaryError(f"HAProxy has no counters for server {sv}")
            dn, df = after[sv][0] - before[sv][0], after[sv][1] - before[sv][1]
            if dn < 0 or df < 0:  # counters reset (HAProxy reloaded): nothing to compare
                raise CanaryError(f"HAProxy's counters of {sv} went back (a reload?): cannot compare")
            n, f = n + dn, f + df
        return n, f

    (cn, cf), (bn, bf) = side(canaries), side(baseline)
    if cn == 0:
        return False, ""
    cr, br = cf / cn, (bf / bn if bn else 0.0)
    p = fisher_greater(cf, cn, bf, bn)
    if cr - br > s.max_error_increase and p < s.alpha:
        return True, (
            f"HAProxy counted {cf} failure(s) (5xx, response or connection errors) in {cn} session(s) of "
            f"the canary, {cr * 100:.2f}% vs {br * 100:.2f}% on the baseline (Fisher p={p:.2g}, "
            f"canary_alpha {s.alpha:g}): failures Triton's own counters do not see"
        )
    return False, ""
