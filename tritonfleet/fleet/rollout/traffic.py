"""What a rollout does about traffic, as the few calls the rollout engine (tritonfleet.fleet.rollout.engine) makes:
capacity rules against HAProxy's real state (tritonfleet.fleet.rollout.capacity), the traffic-weighted
canary (HAProxy weights: tritonfleet.serving.haproxy_weights; analysis: tritonfleet.fleet.rollout.canary)
and each host's state as metrics (tritonfleet.fleet.rollout.state).

The engine calls, per rollout: :func:`prepare` (settings checked before anything is written),
:meth:`Traffic.start` (states served; capacity checked for every batch with every server serving:
a batch that could never pass is refused before any host is touched); per batch:
:meth:`Traffic.before_batch` (pause point, capacity wait, the canary's share), :meth:`Traffic.running`
around the deploy (the backend read every second: draining, the largest number of servers out),
:meth:`Traffic.gating`, :meth:`Traffic.analyse` (the canary's verdict: hosts to roll back),
:meth:`Traffic.held` (hosts deployed but held out of rotation by the quarantine or an operator),
:meth:`Traffic.after_batch` (states, weights put back); at the end :meth:`Traffic.finish`, or
:meth:`Traffic.abort` when the rollout stops on a signal or an error (the weights put back; a
watchdog process, tritonfleet.fleet.rollout.canary_watchdog, does it when the rollout dies unseen).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import UsageError
from ...serving import haproxy_weights
from ...serving.drain import ADMIN_DRAIN, ADMIN_MAINT, DrainError, RuntimeAPI, parse_stat
from .. import probe
from . import canary, canary_watchdog, capacity
from .state import HostStates

CanarySettings = canary.CanaryPolicy  # (``canary`` is also the number of canary hosts in a batch plan)


@dataclass
class _Watching:
    traffic: Traffic
    batch: int
    label: str
    samplers: list

    def stop(self) -> None:
        for s in self.samplers:
            s.stop()
            self.traffic._record(self.batch, self.label, s.watch.pool)["watched"] = s.watch.to_json()


@dataclass
class _PoolInfo:
    pool: capacity.Pool
    rules: capacity.Rules
    hosts: list[str] = field(default_factory=list)  # rollout hosts whose server is in it


def _pool_key(fh) -> tuple | None:
    if fh.get("lb") != "haproxy":
        return None
    sockets = fh.get("lb_haproxy_sockets") or []
    if isinstance(sockets, str):
        sockets = [sockets]
    return (tuple(sockets), str(fh.get("lb_haproxy_backend")))


def server_name(fh) -> str:
    return str(fh.get("lb_haproxy_server") or fh.name)


def _same(hosts, key: str, where: str):
    values = {repr(h.get(key)): h.get(key) for h in hosts}
    if len(values) > 1:
        raise UsageError(
            f"the hosts of {where} differ on {key} ({', '.join(sorted(values))}): one value per "
            "HAProxy backend (group data)"
        )
    return next(iter(values.values()))


class Traffic:
    def __init__(
        self,
        hosts: list,
        batches: list[list[str]],
        canary: int,
        canary_share: float | None,
        models_of: Callable[[], dict[str, list[str]]] | None = None,
    ):
        """``hosts``: the rollout's inventory hosts; ``canary_share`` (0-1): the canary batch's part
        of its backend's traffic, None for a whole-host canary. Raises UsageError for settings
        that cannot work (nothing is written yet)."""
        self.by_name = {h.name: h for h in hosts}
        self.batches = batches
        self.canary = canary
        self.pools: dict[tuple, _PoolInfo] = {}
        for fh in hosts:
            key = _pool_key(fh)
            if key is None:
                rules = capacity.Rules(
                    capacity.parse_limit(fh.get("rollout_max_unavailable"), "rollout_max_unavailable", fh.name),
                    capacity.parse_limit(fh.get("rollout_min_available"), "rollout_min_available", fh.name),
                    self._model_limits(fh),
                )
                if rules.active:
                    raise UsageError(
                        f"{fh.name}: capacity rules (rollout_max_unavailable, rollout_min_available) "
                        "are checked against HAProxy's state: they need lb = 'haproxy' and "
                        "lb_haproxy_sockets (group data)"
                    )
                continue
            if key not in self.pools:
                self.pools[key] = _PoolInfo(capacity.Pool(list(key[0]), key[1]), capacity.Rules())
            self.pools[key].hosts.append(fh.name)
        for key, info in self.pools.items():
            members = [self.by_name[n] for n in info.hosts]
            where = f"backend {key[1]}"
            info.rules = capacity.Rules(
                capacity.parse_limit(
                    _same(members, "rollout_max_unavailable", where), "rollout_max_unavailable", where
                ),
                capacity.parse_limit(_same(members, "rollout_min_available", where), "rollout_min_available", where),
                {
                    m: capacity.parse_limit(v, f"rollout_min_available_models[{m!r}]", where)
                    for m, v in (_same(members, "rollout_min_available_models", where) or {}).items()
                },
            )
        self.wait = float(hosts[0].get("rollout_capacity_wait")) if hosts else 0.0
        self._models_of = models_of
        self.models: dict[str, list[str]] = {}
        # the traffic canary
        self.share = canary_share
        self.settings: CanarySettings | None = None
        self.canary_pool: _PoolInfo | None = None
        if canary_share is not None:
            self._check_canary()
        self.states: HostStates | None = None
        self.echo: Callable[[str], None] = print
        self.journal = None
        self.halt = ""
        self.capacity: list[dict] = []
        self.result: dict = {}
        self._originals: dict | None = None
        self._weights: haproxy_weights.Weights | None = None
        self._watchdog: canary_watchdog.Watchdog | None = None
        self.logs: Path | None = None
        self.matched: list[str] = []

    @staticmethod
    def _model_limits(fh) -> dict:
        return {
            m: capacity.parse_limit(v, f"rollout_min_available_models[{m!r}]", fh.name)
            for m, v in (fh.get("rollout_min_available_models") or {}).items()
        }

    def _check_canary(self) -> None:
        if not 0 < self.share < 1:
            raise UsageError(
                f"--canary-weight / canary_weight is a percentage of the traffic between 0 and 100 "
                f"(exclusive), not {self.share * 100:g}"
            )
        if not self.canary or not self.batches:
            raise UsageError("a traffic canary needs a canary host: give --canary 1 or more")
        canaries = self.batches[0]
        keys = {_pool_key(self.by_name[n]) for n in canaries}
        if None in keys or len(keys) != 1:
            raise UsageError(
                f"a traffic canary's share is set through HAProxy's weights: the canary host(s) "
                f"{', '.join(canaries)} need lb = 'haproxy' and one backend (lb_haproxy_sockets, "
                "lb_haproxy_backend)"
            )
        self.canary_pool = self.pools[keys.pop()]
        if not [n for n in self.canary_pool.hosts if n not in canaries]:
            raise UsageError(
                "a traffic canary is compared with baseline hosts of the rollout in the same "
                f"backend ({self.canary_pool.pool.backend}): the rollout has none beside the canary"
            )
        fh = self.by_name[canaries[0]]
        self.settings = canary.CanaryPolicy.from_settings(fh, f"{fh.name}'s data")

    @property
    def active(self) -> bool:
        return bool(self.share is not None or any(p.rules.active for p in self.pools.values()))

    # ---- start ------------------------------------------------------------------------------
    def start(self, logs: Path, journal, echo: Callable[[str], None], targets: list[str]) -> str:
        """Serve the states; check every batch against the capacity rules with every server
        serving (and that the rollout's servers are in their backends). Returns why the rollout
        is refused ("" when it may go)."""
        self.echo, self.journal, self.logs = echo, journal, logs
        self.states = HostStates(logs, list(self.by_name), echo)
        first = next(iter(self.by_name.values()), None)
        said = self.states.serve(first.get("rollout_metrics_listen") if first else None)
        if said:
            echo(said)
        if not self.active:
            return ""
        if any(p.rules.models for p in self.pools.values()) and self._models_of:
            self.models = self._models_of()
        for key, info in self.pools.items():
            try:
                now = info.pool.read()
            except DrainError as e:
                return f"capacity: cannot read {info.pool.describe()}: {e}"
            missing = [n for n in info.hosts if server_name(self.by_name[n]) not in now]
            if missing:
                return (
                    f"capacity: HAProxy's {info.pool.describe()} has no server for {', '.join(missing)} "
                    f"(servers: {', '.join(sorted(now))}; lb_haproxy_server names a host's server)"
                )
            if not info.rules.active:
                continue
            every = {s: True for s in now}
            for i, b in enumerate(self.batches, 1):
                servers = [server_name(self.by_name[n]) for n in b if n in info.hosts and n in targets]
                v = capacity.judge(every, servers, info.rules, self._server_models(key))
                if not v.ok:
                    return (
                        f"capacity: batch {i} ({', '.join(b)}) can never go out, even with every server of "
                        f"{info.pool.describe()} serving: {v.why}; use a smaller --batch or --canary, or "
                        "other rollout_* limits; no host was changed"
                    )
        return ""

    def _server_models(self, key: tuple) -> dict[str, list[str]]:
        return self.models

    # ---- per batch --------------------------------------------------------------------------
    def before_batch(self, i: int, todo: list[str], label: str) -> str:
        """Pause point, capacity, the canary's share. Returns why the rollout halts ("": go on)."""
        st = self.states
        st.hold(f"before {label}")
        st.update(batch=i)
        for key, info in self.pools.items():
            servers = [server_name(self.by_name[n]) for n in todo if n in info.hosts]
            if not servers or not info.rules.active:
                continue
            try:
                v, waited = capacity.wait_for(
                    info.pool, servers, info.rules, self._server_models(key), self.wait, self.echo, label
                )
            except DrainError as e:
                return f"capacity: cannot read {info.pool.describe()} before {label}: {e}"
            rec = self._record(i, label, info.pool.describe())
            rec.update(
                {
                    "waited_s": round(waited, 1),
                    "ok": v.ok,
                    "summary": v.summary(),
                    "why": v.why,
                    "total": v.total,
                    "out_before": len(v.out),
                    "batch_size": len(v.batch),
                    "max_unavailable": v.max_unavailable,
                    "min_available": v.min_available,
                    "models": v.models,
                }
            )
            if self.journal:
                self.journal.write("capacity", **rec)
            if not v.ok:
                return (
                    f"capacity: {label} waited {waited:.0f}s (rollout_capacity_wait) and would still break a "
                    f"rule in {info.pool.describe()}: {v.why} ({v.summary()})"
                )
            self.echo(
                f"[{label}] capacity of {info.pool.describe()}: {v.summary()}"
                + (f" (after waiting {waited:.0f}s)" if waited >= 1 else "")
            )
        if i == 1 and self.share is not None:
            why = self._set_share(todo)
            if why:
                return why
        st.set(todo, "updating")
        return ""

    def _set_share(self, canaries: list[str]) -> str:
        info = self.canary_pool
        w = haproxy_weights.Weights(info.pool.sockets, info.pool.backend)
        try:
            state = w.read()
            first = next(iter(state.values()))
            originals = {s: v["weight"] for s, v in first.items()}
            servers = [server_name(self.by_name[n]) for n in canaries]
            others = {s: v["weight"] for s, v in first.items() if s not in servers and v["serving"]}
            # as many baseline hosts of the rollout as canaries, under the canaries' load (latency)
            serving = [n for n in info.hosts if n not in canaries and others.get(server_name(self.by_name[n]))]
            matched = serving[: len(canaries)] if len(others) > len(canaries) else []
            if self.share * (len(canaries) + len(matched)) / len(canaries) >= 1:
                matched = []
            plan = haproxy_weights.plan(self.share, servers, others, [server_name(self.by_name[n]) for n in matched])
            self.matched = matched
            self._originals, self._weights = originals, w
            if self.journal:
                self.journal.write(
                    "weights",
                    backend=info.pool.backend,
                    sockets=info.pool.sockets,
                    original=originals,
                    canary=servers,
                    share=self.share,
                    set=plan.weights,
                )
            # the dead-man first: from the first weight set on, a rollout that dies is covered
            self._watchdog = canary_watchdog.start(
                self.logs or Path("."),
                list(info.pool.sockets),
                info.pool.backend,
                originals,
                self.settings.watchdog_ttl if self.settings else 60.0,
            )
            w.set(plan.weights)
        except OSError as e:
            self._originals = None
            return f"canary: cannot start the weights' watchdog (the canary's share is not set): {e}"
        except (DrainError, ValueError, StopIteration) as e:
            self._restore()
            return f"canary: cannot give the canary {self.share * 100:g}% of {info.pool.describe()}: {e}"
        self.states.update(canary_share=plan.share)
        self.result.update(
            share_asked=self.share,
            share=plan.share,
            weights=plan.weights,
            original=originals,
            share_set=time.time(),
            matched=self.matched,
        )
        self.echo(
            f"[canary] {', '.join(canaries)}: {plan.share * 100:.2f}% of {info.pool.describe()}'s traffic "
            f"(weight {plan.canary} each"
            + (f", as {', '.join(self.matched)} of the old release" if self.matched else "")
            + f"; the other servers' weights x{plan.factor})"
        )
        return ""

    def watch(self, i: int, todo: list[str], label: str) -> _Watching:
        """Started before a batch's deploy, stopped after it: each backend with hosts of the batch
        read every second (its hosts' draining state; the most servers seen out, in the report)."""
        samplers = []
        for info in self.pools.values():
            names = {server_name(self.by_name[n]): n for n in todo if n in info.hosts}
            if not names:
                continue

            def follow(state: dict, names=names) -> None:
                for server, host in names.items():
                    v = state.get(server)
                    if v is None:
                        continue
                    cur = self.states.get(host)
                    if v["admin"] & ADMIN_DRAIN and cur == "updating":
                        self.states.set([host], "draining")
                    elif not v["admin"] & ADMIN_DRAIN and cur == "draining":
                        self.states.set([host], "updating")

            samplers.append(capacity.Sampler(info.pool, follow).start())
        return _Watching(self, i, label, samplers)

    def _record(self, i: int, label: str, pool: str) -> dict:
        """The report's record of batch ``i`` in ``pool`` (made when missing)."""
        for rec in self.capacity:
            if rec["batch"] == i and rec["pool"] == pool:
                return rec
        rec = {"batch": i, "label": label, "pool": pool}
        self.capacity.append(rec)
        return rec

    def held(self, names: list[str]) -> dict[str, str]:
        """{host: why} for hosts of ``names`` whose server HAProxy holds in maintenance (the
        quarantine receiver's or an operator's): deployed, but left out of rotation by the
        deploy's ready. A backend that cannot be read says nothing here."""
        out = {}
        for info in self.pools.values():
            servers = {server_name(self.by_name[n]): n for n in names if n in info.hosts}
            if not servers:
                continue
            try:
                now = info.pool.read()
            except DrainError:
                continue
            for server, name in servers.items():
                v = now.get(server)
                if v is not None and v["admin"] & ADMIN_MAINT:
                    out[name] = (
                        f"deployed; held out of rotation by the quarantine or an operator "
                        f"({info.pool.backend}/{server} in MAINT): not readied"
                    )
        return out

    def _lb_counters(self) -> dict[str, tuple[int, int]] | str:
        """The canary backend's per-server counters summed over its HAProxy instances (why not,
        as a string, when they cannot be read)."""
        info = self.canary_pool
        total: dict[str, tuple[int, int]] = {}
        try:
            for sock in info.pool.sockets:
                rows = parse_stat(RuntimeAPI(sock).command("show stat"))
                for sv, (n, f) in canary.lb_counters(rows, info.pool.backend).items():
                    have = total.get(sv, (0, 0))
                    total[sv] = (have[0] + n, have[1] + f)
        except (DrainError, canary.CanaryError) as e:
            return f"{info.pool.describe()}: {e}"
        return total

    def gating(self, names: list[str]) -> None:
        self.states.set(names, "gating")

    def analyse(self, i: int, names: list[str]) -> dict[str, str]:
        """The canary batch's analysis (only with a share): {host: why} for canaries to roll back,
        out of the traffic already (weight 0)."""
        if i != 1 or self.share is None or not names or self._weights is None:
            return {}
        info = self.canary_pool
        canaries = list(names)
        baseline = [n for n in info.hosts if n not in self.batches[0]]
        self.states.set(canaries, "analysing")
        s = self.settings
        start = time.time()
        self.echo(
            f"[canary analysis] {', '.join(canaries)} against {', '.join(baseline)} from "
            f"{s.prometheus_url}: {s.analysis_seconds:g}s windows, up to {s.max_extensions} extension(s)"
        )
        lb_before = self._lb_counters()
        res = canary.analyse(
            canary.Prometheus(s.prometheus_url),
            s,
            canaries,
            baseline,
            start,
            self.echo,
            hold=lambda: self.states.hold("before the canary's verdict"),
            matched=self.matched,
        )
        if res.verdict == canary.PROMOTE:  # what Triton never counts: HAProxy's failures per server
            try:
                if isinstance(lb_before, str):
                    raise canary.CanaryError(lb_before)
                after = self._lb_counters()
                if isinstance(after, str):
                    raise canary.CanaryError(after)
                back, why = canary.lb_verdict(
                    lb_before,
                    after,
                    [server_name(self.by_name[n]) for n in canaries],
                    [server_name(self.by_name[n]) for n in baseline],
                    s,
                )
            except canary.CanaryError as e:
                back, why = True, f"the analysis could not read HAProxy's counters: {e}"
            if back:
                res = canary.Result(canary.ROLL_BACK, why, res.looks, res.started, time.time())
        self.result.update(
            res.to_json(),
            canaries=canaries,
            baseline=baseline,
            analysis_start=start,
            settings={k: v for k, v in vars(s).items()},
        )
        if self.journal:
            self.journal.write("canary", verdict=res.verdict, why=res.why, looks=[f.to_json() for f in res.looks])
        if res.verdict == canary.PROMOTE:
            self.echo(f"[canary] promote: {res.why}")
            return {}
        try:
            self._weights.set({server_name(self.by_name[n]): 0 for n in canaries})
            self.result["out_of_traffic"] = time.time()
        except DrainError as e:
            self.echo(f"[canary] could not take the canary out of the traffic before its rollback: {e}")
        self.halt = f"canary analysis: {res.why}"
        self.states.set(canaries, "failed", "rolling back")
        return {n: f"canary analysis: {res.why}" for n in canaries}

    def rolled_back(self, i: int, results: dict) -> None:
        """Right after the batch's rollback: when the canary serves the old release again (its
        rollback deploy gated it and put it back in HAProxy)."""
        for name, r in results.items():
            if r.result == "rolled back":
                self.states.set([name], "rolled back")
                if i == 1 and self.share is not None:
                    self.result.setdefault("rolled_back", time.time())

    def after_batch(self, i: int, results: dict) -> None:
        """States from the batch's results; the canary's weights put back."""
        for name, r in results.items():
            state = {"updated": "done", "unchanged": "done", "rolled back": "rolled back"}.get(r.result, "failed")
            self.states.set([name], state, "" if state != "failed" else r.detail[:120])
        if i == 1 and self._originals is not None:
            self._restore()

    def _restore(self) -> None:
        if self._weights is None or self._originals is None:
            return
        try:
            self._weights.restore(self._originals)
            if self.journal:
                self.journal.write("weights-restored", backend=self._weights.backend)
            self.result["weights_restored"] = time.time()
            if self._watchdog is not None:  # put back: the watchdog leaves without acting
                self._watchdog.stop()
                self._watchdog = None
        except DrainError as e:  # the watchdog stays: it tries again once this process is gone
            self.echo(
                f"[canary] could not put HAProxy's weights back ({self._originals}): {e}; set them by hand "
                "(`set weight <backend>/<server> <weight>`)"
            )
        self.states.update(canary_share=None)
        self._originals = None

    def abort(self) -> None:
        """The rollout stops on an exception or a signal: the weights go back, the states stop
        being served (a SIGTERM arriving during the restore does not cut it)."""
        with _signals_held():
            self._restore()
        if self.states is not None:
            self.states.close()

    def finish(self, report) -> None:
        self._restore()
        report.capacity = self.capacity
        report.canary = self.result
        if self.states is not None:
            self.states.close()


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM held (delivered after the block) in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def restore_from_journal(events: list[dict], echo: Callable[[str], None]) -> None:
    """A rollout that died with a canary share set: put the weights it recorded back."""
    pending = None
    for e in events:
        if e["event"] == "weights":
            pending = e
        elif e["event"] == "weights-restored":
            pending = None
    if pending is None:
        return
    w = haproxy_weights.Weights(pending["sockets"], pending["backend"])
    try:
        w.restore(pending["original"])
        echo(
            f"put back HAProxy's weights of backend {pending['backend']} the canary had changed: {pending['original']}"
        )
    except DrainError as e:
        echo(f"could not put back HAProxy's weights of backend {pending['backend']} ({pending['original']}): {e}")


def lines(report) -> list[str]:
    """The report's capacity and canary figures, a line each."""
    out = []
    for c in getattr(report, "capacity", None) or []:
        w = c.get("watched")
        watched = (
            f"while it ran, at most {w['max_out']} of {w['total']} out ({w['samples']} readings, 1 a second)"
            if w
            else ""
        )
        parts = [
            p for p in (c.get("summary", ""), f"waited {c['waited_s']}s" if c.get("waited_s") else "", watched) if p
        ]
        out.append(
            f"capacity  {c['label']} {c['pool']}: {'; '.join(parts)}"
            + ("" if c.get("ok", True) else f": REFUSED: {c.get('why', '')}")
        )
    cn = getattr(report, "canary", None) or {}
    if cn.get("verdict"):
        out.append(
            f"canary    {', '.join(cn.get('canaries', []))}: {cn.get('share', 0) * 100:.2f}% of the traffic "
            f"(asked {cn.get('share_asked', 0) * 100:g}%), against {', '.join(cn.get('baseline', []))}"
        )
        for n, look in enumerate(cn.get("looks", []), 1):
            c, b = look["canary"], look["baseline"]
            r = look.get("matched") or b
            lat = (
                f"step median {c['median_step_ms']:.2f} ms vs {r['median_step_ms']:.2f} ms on "
                f"{', '.join(r['hosts'])} ({look['latency_rise'] * 100:+.0f}%, Mann-Whitney "
                f"p={look['latency_p']:.2g})"
                if look.get("latency_rise") is not None
                else "no latency figures"
            )
            out.append(
                f"  look {n} ({look['seconds']:.0f}s): {c['requests']} vs {b['requests']} requests, errors "
                f"{c['error_ratio'] * 100:.2f}% vs {b['error_ratio'] * 100:.2f}% (Fisher p={look['error_p']:.2g}), "
                f"{lat}: {look['verdict']}"
            )
        out.append(f"  verdict: {cn['verdict']}: {cn.get('why', '')}")
    return out


def prepare(hosts: list, batches: list[list[str]], canary: int, canary_weight: float | None) -> Traffic:
    """The rollout's Traffic from its hosts' settings; ``canary_weight``: percent of the traffic for
    the canary batch (None: the first canary host's ``canary_weight`` tunable; None there too: a
    whole-host canary). UsageError before anything is written when a setting cannot work."""
    if canary_weight is None and canary and batches and batches[0]:
        first = next((h for h in hosts if h.name == batches[0][0]), None)
        canary_weight = first.get("canary_weight") if first is not None else None
    if canary_weight is not None and (isinstance(canary_weight, bool) or not isinstance(canary_weight, (int, float))):
        raise UsageError(f"canary_weight is a percentage of the traffic (0-100), not {canary_weight!r}")
    share = None if canary_weight is None else float(canary_weight) / 100

    def models_of() -> dict[str, list[str]]:
        """{server: models its host serves (its model repository)} for the rollout's hosts behind
        HAProxy; servers of hosts outside the rollout count for no model."""
        return {server_name(fh): probe.intent(fh).get("models", []) for fh in hosts if _pool_key(fh) is not None}

    return Traffic(hosts, batches, canary, share, models_of)
