"""The health gate: Triton answers live, ready, every model ready, and serves metrics.

Runs on the control machine with requests, either straight to the host's ports or through a
tunnel over the host's own SSH connection (for firewalls that open 8000-8002 only to the load
balancer and Prometheus): tritonfleet.serving.triton_http, the one client. While it waits, the
unit and its container are watched (tritonfleet.serving.unit_watch): a definitive cause ends the
wait early, and a failed gate's report says what the host runs now and how to roll back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from pyinfra import host, logger

from ..core.report import HOST_RECORD, Failure, HostFailure, in_rollout
from ..settings.access import Settings
from . import per_gpu, triton_http
from .per_gpu import host_instance_gets as instance_gets
from .unit_watch import UnitWatch, Verdict, error_words, serving_now, watch_instance


class HealthError(HostFailure):
    pass


@dataclass
class Check:
    endpoint: str
    ok: bool
    detail: str


@dataclass
class HealthResult:
    ok: bool
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    verdict: Verdict | None = None

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)


def _get(session: requests.Session, url: str, timeout: float) -> tuple[bool, str]:
    try:
        r = session.get(url, timeout=timeout)
    except requests.RequestException as e:
        return False, f"no answer ({type(e).__name__}: {e})"
    body = r.text.strip().replace("\n", " ")[:200]
    return r.status_code == 200, f"HTTP {r.status_code} {body}".strip()


def check_once(
    http_url: str, metrics_url: str, models: list[str], timeout: float = 5, session: requests.Session | None = None
) -> HealthResult:
    """One pass over every endpoint; on ``session`` (its kept-alive connections) when given."""
    if session is not None:
        return _check(session, http_url, metrics_url, models, timeout)
    with triton_http.session() as s:
        return _check(s, http_url, metrics_url, models, timeout)


def _check(s: requests.Session, http_url: str, metrics_url: str, models: list[str], timeout: float) -> HealthResult:
    checks = []
    for path in ("/v2/health/live", "/v2/health/ready"):
        ok, detail = _get(s, http_url + path, timeout)
        checks.append(Check(http_url + path, ok, detail))
        if not ok:
            return HealthResult(False, checks)
    for m in models:
        url = f"{http_url}/v2/models/{m}/ready"
        ok, detail = _get(s, url, timeout)
        checks.append(Check(url, ok, detail))
    url = metrics_url + "/metrics"
    try:
        r = s.get(url, timeout=timeout)
        ok = r.status_code == 200 and "nv_inference_request_success" in r.text
        detail = f"HTTP {r.status_code}" + ("" if ok else ", no nv_inference_request_success")
    except requests.RequestException as e:
        ok, detail = False, f"no answer ({type(e).__name__})"
    checks.append(Check(url, ok, detail))
    return HealthResult(all(c.ok for c in checks), checks)


def wait_healthy(
    http_url: str,
    metrics_url: str,
    models: list[str],
    timeout: float = 180,
    request_timeout: float = 5,
    interval: float = 1.0,
    watch=None,
    watch_every: float = 2.0,
    session: requests.Session | None = None,
) -> HealthResult:
    """Retry until everything answers or ``timeout`` seconds pass. ``watch()`` (the unit and the
    container, see UnitWatch) is asked every ``watch_every`` seconds meanwhile; a Verdict from it
    ends the wait at once (a start that only takes long never gives one). Every attempt on one
    session (``session``, else one of its own): one kept-alive connection a port, so through an
    SSH tunnel one channel a port rather than one a request (a connection the server closed, as a
    restarting Triton does, is opened again by the session)."""
    if session is None:
        with triton_http.session() as s:
            return wait_healthy(
                http_url, metrics_url, models, timeout, request_timeout, interval, watch, watch_every, s
            )
    t0 = time.monotonic()
    last_watch = None
    while True:
        res = check_once(http_url, metrics_url, models, request_timeout, session)
        res.seconds = time.monotonic() - t0
        if res.ok or res.seconds >= timeout:
            return res
        if watch is not None and (last_watch is None or time.monotonic() - last_watch >= watch_every):
            last_watch = time.monotonic()
            verdict = watch()
            if verdict is not None:
                res.verdict, res.seconds = verdict, time.monotonic() - t0
                return res
        time.sleep(interval)


def gate(
    settings: Settings,
    address: str,
    models: list[str],
    transport=None,
    timeout: float | None = None,
    watch=None,
    warm=None,
) -> HealthResult:
    """Wait until the host whose tunables ``settings`` holds is healthy (or ``timeout`` passes, or
    ``watch`` finds a definitive cause). ``address``: its SSH address; ``transport``: its open
    paramiko transport (health_via ssh). ``warm(http_url, session)``: run once healthy (the warm inference
    gate, tritonfleet.serving.warmup); a Verdict it returns fails the gate. One HTTP session for
    the whole gate, the warm inferences included: a request a kept-alive connection (one SSH
    channel a port with health_via ssh)."""
    links = triton_http.endpoints(settings, address, (lambda: transport) if transport is not None else None)
    with links as at, triton_http.session() as s:
        http_url, metrics_url = at.http_url, at.metrics_url
        res = wait_healthy(
            http_url,
            metrics_url,
            models,
            settings.get("health_timeout") if timeout is None else timeout,
            settings.get("health_request_timeout"),
            watch=watch,
            session=s,
        )
        said = at.tunnel_error
        if not res.ok and said and res.first_failure is not None:  # why the tunnel's requests failed
            res.first_failure.detail += f" ({said})"
        if res.ok and warm is not None:
            verdict = warm(http_url, s)
            if verdict is not None:
                res.ok, res.verdict = False, verdict
                res.checks.append(Check(f"{http_url}/v2/models/.../infer", False, verdict.short))
        return res


def instance_failure(failure: Failure, settings: Settings) -> Failure:
    """A failed gate's report naming the per-GPU instance (tritonfleet.serving.per_gpu) it was of."""
    name = per_gpu.label(settings)
    if name:
        failure.expected = f"{name}: {failure.expected}"
        failure.found = f"{name}: {failure.found}"
        failure.cause = f"{name}: {failure.cause}"
    return failure


def failure_of(
    res: HealthResult, host_name: str, models: list[str], watch: UnitWatch, timeout: float, rollout: bool = False
) -> Failure:
    """The report of a failed gate."""
    service = watch.service
    snap = watch.last if res.verdict else (watch.read() or watch.last)
    bad = res.first_failure
    answer = f"{bad.endpoint} -> {bad.detail}" if bad else "no answer"
    if res.verdict:
        found = f"after {res.seconds:.0f}s, without waiting out health_timeout ({timeout:.0f}s): {res.verdict.cause}"
        cause, words = res.verdict.short or res.verdict.cause, res.verdict.words
    else:
        window = (snap.window(watch.since or 0) or snap.starts[-1:]) if snap else []
        start = window[-1] if window else None
        triton = start.cause if start else ""
        found = f"not healthy after {res.seconds:.0f}s (health_timeout): {answer}" + (
            f"; Triton's first error: {triton}" if triton else ""
        )
        cause = f"Triton: {triton}" if triton else answer
        words = error_words(start.lines) if start else []
    now, fix = serving_now(snap, service, host_name, rollout)
    if snap is None and watch.error:
        now = f"unknown (the host could not be read: {watch.error[:200]})"
    if not fix:
        fix = (
            "fix the cause above (the model: tritonfleet validate; the unit: journalctl -u "
            f"{service}), then run the deploy again"
        )
    else:
        fix += f"; then fix the cause above and run the deploy again (journalctl -u {service} shows the whole log)"
    return Failure(
        host_name,
        "health gate",
        f"Triton live and ready, models {', '.join(models) or '(none)'} ready, metrics served, "
        f"within health_timeout ({timeout:.0f}s)",
        found,
        words,
        f"Triton's own words (journal of {service}.service, its last start)",
        now,
        fix,
        cause=f"{cause}, after {res.seconds:.0f}s",
    )


# host name -> {model: milliseconds} of the first inferences its gate sent in this run (the deploy
# records them with the healthy deployment in the host's history)
WARM_LATENCY: dict[str, dict[str, float]] = {}


def warm_check(repo: str, models: list[str], timeout: float, say, keep=None):
    """The warm inference gate as gate()'s ``warm``: one inference per model (tritonfleet.serving.warmup);
    a Verdict with Triton's answer when one fails. ``keep(latencies)`` when all passed."""
    from .warmup import warm

    def run(http_url: str, session=None) -> Verdict | None:
        res = warm(http_url, Path(repo), models, timeout, session)
        if res.ok:
            done = ", ".join(f"{m} {ms:.0f} ms" for m, ms in res.latency_ms.items())
            skipped = "; ".join(f"{m} not warmed: {why}" for m, why in res.skipped.items())
            say(f"first inference: {done or 'none'}" + (f" ({skipped})" if skipped else ""))
            if keep is not None:
                keep(dict(res.latency_ms))
            return None
        cause = f"model {res.model} is ready but {res.cause}"
        return Verdict(cause, [res.answer], short=f"{cause}: {res.answer[:160]}")

    return run


def gate_current_host(
    settings: Settings, models: list[str], clear_failure: bool = False, repo: str | None = None
) -> HealthResult:
    """pyinfra callback: health-gate the host being deployed (its settings: ``settings``); fail it
    with the report. Once healthy, ``clear_failure`` removes the report an earlier failed run left
    on the host (for `tritonfleet status`): part of the check, so a healthy re-run still changes
    nothing. With
    ``repo`` (the rendered repository the deploy sent) and health_warm_inference, each model then
    answers one real inference (tritonfleet.serving.warmup)."""

    from ..settings.access import ConfigError

    transport = None
    if settings.get("health_via") == "ssh":
        transport = host.connector.client.get_transport()

    def run(command: str) -> str:
        _, out = host.run_shell_command(command, print_output=False, print_input=False)
        return "\n".join(out.stdout_lines)

    timeout = float(settings.get("health_timeout"))
    gets = instance_gets(settings)
    seconds = 0.0
    for i, g in enumerate(gets):
        watch = watch_instance(g, run)
        warm = None
        if repo and settings.get("health_warm_inference"):
            who = ": ".join(filter(None, (host.name, per_gpu.label(g))))
            warm = warm_check(
                repo,
                models,
                max(float(settings.get("health_request_timeout")), 30.0),
                lambda text, who=who: logger.info(f"{who}: {text}"),
                (lambda ms: WARM_LATENCY.__setitem__(host.name, ms)) if i == 0 else None,
            )
        try:
            res = gate(g, host.data.get("ssh_hostname") or host.name, models, transport, timeout, watch, warm)
        except ConfigError as e:
            raise ConfigError(f"{host.name}: {e}") from e
        if not res.ok:
            raise HealthError(
                instance_failure(failure_of(res, host.name, models, watch, timeout, rollout=in_rollout()), g)
            )
        seconds += res.seconds
    res.seconds = seconds
    logger.info(
        f"{host.name}: healthy in {res.seconds:.1f}s ({len(models)} models ready, metrics served"
        + (f", {len(gets)} Triton instances, one per GPU)" if per_gpu.enabled(settings) else ")")
    )
    if clear_failure:
        run(f"rm -f {HOST_RECORD}")
    return res
