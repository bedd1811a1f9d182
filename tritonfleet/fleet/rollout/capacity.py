"""Capacity rules of a rollout, checked against the load balancer's real state.

``rollout_max_unavailable`` (hosts, or a percentage of the servers of the host's HAProxy backend)
bounds how many servers of a backend may be out of HAProxy at once: out already (down by its
health checks, drained, in maintenance, weight 0) plus the batch about to be deployed.
``rollout_min_available`` (hosts or percent) is the number of servers that must keep serving,
and ``rollout_min_available_models`` ({model: hosts or percent}) the same for the servers whose
host serves the model (the models of its model repository; servers of the backend whose host is
not in the rollout are not counted for a model).

Percentages follow Kubernetes' rolling update: a ``max unavailable`` percentage is rounded down
("The absolute number is calculated from percentage by rounding down",
https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#max-unavailable), so a
quarter of 3 servers is 0 and such a rollout is refused rather than taking a third out; a
``min available`` percentage is rounded up, so the rule never allows fewer than the share asked.

Before each batch the backend's state is read from every HAProxy instance in front of it
(``show stat``: status; ``show servers state``: admin state and user weight; HAProxy 2.6
management guide 9.1 and 9.3, https://docs.haproxy.org/2.6/management.html); a server counts as
out when any instance does not send it requests. A batch that would break a rule waits (reading
again every second) up to ``rollout_capacity_wait`` seconds, then the rollout halts with the
numbers; a batch that could not pass even with every server serving is refused before any host
is touched.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...core.errors import UsageError
from ...serving.drain import (
    ADMIN_DRAIN,
    ADMIN_MAINT,
    DrainError,
    RuntimeAPI,
    parse_servers_state,
    parse_stat,
)

SAMPLE_SECONDS = 1.0  # how often the backend is read while a batch runs (and while a batch waits)


class CapacityError(UsageError):
    """A capacity rule that cannot be met or read (bad setting, backend or server unknown)."""


@dataclass(frozen=True)
class Limit:
    """A number of hosts, or a percentage of a group (``text`` as written in the settings)."""

    text: str
    hosts: int | None = None
    percent: float | None = None

    def at_most(self, total: int) -> int:
        """As a ceiling on ``total`` servers: a percentage rounded down."""
        if self.hosts is not None:
            return self.hosts
        return math.floor(total * self.percent / 100 + 1e-9)

    def at_least(self, total: int) -> int:
        """As a floor on ``total`` servers: a percentage rounded up."""
        if self.hosts is not None:
            return self.hosts
        return math.ceil(total * self.percent / 100 - 1e-9)


def parse_limit(value, key: str, where: str = "group data") -> Limit | None:
    """``None``/"" (no rule), a whole number of hosts >= 0, or "P%" with 0 < P <= 100."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    if isinstance(value, bool):
        raise CapacityError(f'{key} must be a number of hosts or a percentage like "25%", not {value!r} ({where})')
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100 or math.isnan(pct):
                raise ValueError
            return Limit(text, percent=pct)
        n = int(text)
        if n < 0 or str(n) != text:
            raise ValueError
        return Limit(text, hosts=n)
    except ValueError:
        raise CapacityError(
            f'{key} must be a number of hosts (>= 0) or a percentage like "25%", not {value!r} ({where})'
        ) from None


@dataclass(frozen=True)
class Rules:
    max_unavailable: Limit | None = None
    min_available: Limit | None = None
    models: dict[str, Limit] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.max_unavailable or self.min_available or self.models)


@dataclass
class CapacityVerdict:
    """Whether a batch may go out now, and the figures that say so."""

    ok: bool
    total: int
    out: list[str]  # servers out of HAProxy now
    batch: list[str]  # the batch's servers
    unavailable_after: int  # out now plus the batch's servers that serve now
    max_unavailable: int | None
    min_available: int | None
    available_after: int
    models: dict[str, dict] = field(default_factory=dict)  # model -> {"total", "required", "after"}
    why: str = ""

    def summary(self) -> str:
        parts = [
            f"{self.total} server(s), out now {len(self.out)}" + (f" ({', '.join(self.out)})" if self.out else ""),
            f"batch {len(self.batch)}",
            f"out with the batch {self.unavailable_after}",
        ]
        if self.max_unavailable is not None:
            parts.append(f"max_unavailable {self.max_unavailable}")
        if self.min_available is not None:
            parts.append(f"serving with the batch out {self.available_after}, min_available {self.min_available}")
        for m, f in self.models.items():
            parts.append(f"{m}: {f['after']}/{f['total']} serving, min {f['required']}")
        return ", ".join(parts)


def judge(
    serving: dict[str, bool], batch: list[str], rules: Rules, models_of: dict[str, list[str]] | None = None
) -> CapacityVerdict:
    """The rules against a backend's state (``serving``: {server: HAProxy sends it requests now})
    with ``batch`` (servers) about to go out. ``models_of``: {server: models its host serves}."""
    models_of = models_of or {}
    total = len(serving)
    out = sorted(s for s, ok in serving.items() if not ok)
    going = {s for s in batch if serving.get(s)}
    unavailable = len(out) + len(going)
    available = total - unavailable
    mx = rules.max_unavailable.at_most(total) if rules.max_unavailable else None
    mn = rules.min_available.at_least(total) if rules.min_available else None
    why = []
    if mx is not None and unavailable > mx:
        why.append(
            f"{unavailable} of {total} server(s) would be out of HAProxy, max_unavailable "
            f"{rules.max_unavailable.text} allows {mx}"
        )
    if mn is not None and available < mn:
        why.append(f"{available} of {total} server(s) would serve, min_available {rules.min_available.text} needs {mn}")
    per_model = {}
    for model, limit in sorted(rules.models.items()):
        having = [s for s in serving if model in models_of.get(s, [])]
        need = limit.at_least(len(having))
        after = sum(1 for s in having if serving[s] and s not in going)
        per_model[model] = {"total": len(having), "required": need, "after": after}
        if after < need:
            why.append(
                f"{after} of the {len(having)} server(s) serving {model} would serve, "
                f"rollout_min_available_models[{model!r}] = {limit.text} needs {need}"
            )
    return CapacityVerdict(
        not why, total, out, sorted(batch), unavailable, mx, mn, available, per_model, "; ".join(why)
    )


# ---- the backend as HAProxy reports it ---------------------------------------------------------


class Pool:
    """One HAProxy backend (on every instance in front of it) and the servers of the rollout in it."""

    def __init__(self, sockets: list[str], backend: str, timeout: float = 5.0):
        self.sockets = list(sockets)
        self.backend = backend
        self.apis = [RuntimeAPI(s, timeout) for s in sockets]

    @property
    def key(self) -> tuple:
        return (tuple(self.sockets), self.backend)

    def describe(self) -> str:
        return f"backend {self.backend}"

    def read(self) -> dict[str, dict]:
        """{server: {"serving", "status", "admin", "weight"}} merged over the instances: serving
        only when every instance sends it requests (UP or no check, no admin flag, weight > 0)."""
        merged: dict[str, dict] = {}
        for api in self.apis:
            stat = {
                r.get("svname"): r
                for r in parse_stat(api.command("show stat"))
                if r.get("pxname") == self.backend and r.get("svname") not in ("FRONTEND", "BACKEND")
            }
            if not stat:
                raise DrainError(
                    f"HAProxy at {api.address} has no backend {self.backend!r} with servers (lb_haproxy_backend)"
                )
            state = {
                r.get("srv_name"): r for r in parse_servers_state(api.command(f"show servers state {self.backend}"))
            }
            for name, row in stat.items():
                st = state.get(name, {})
                # what cannot be read is said, never taken for "not drained" or a weight
                if not (str(st.get("srv_admin_state", "")).isdigit() and str(st.get("srv_uweight", "")).isdigit()):
                    raise DrainError(
                        f"HAProxy at {api.address}: `show servers state {self.backend}` gives no "
                        f"admin state or weight for {self.backend}/{name}: {st or 'no such line'}"
                    )
                admin = int(st["srv_admin_state"])
                weight = int(st["srv_uweight"])
                status = row.get("status", "")
                up = status.startswith("UP") or status == "no check"
                serving = up and not (admin & (ADMIN_MAINT | ADMIN_DRAIN)) and weight > 0
                m = merged.setdefault(name, {"serving": True, "status": status, "admin": 0, "weight": weight})
                m["serving"] = m["serving"] and serving
                m["admin"] |= admin
                if not up:
                    m["status"] = status
                m["weight"] = min(m["weight"], weight)
        return merged

    def serving(self) -> dict[str, bool]:
        return {s: v["serving"] for s, v in self.read().items()}


@dataclass
class CapacitySample:
    time: float
    out: int


@dataclass
class Watch:
    """What one batch saw of its backend, read every second while it ran."""

    pool: str
    total: int = 0
    samples: list[CapacitySample] = field(default_factory=list)
    errors: int = 0

    @property
    def max_out(self) -> int:
        return max((s.out for s in self.samples), default=0)

    def to_json(self) -> dict:
        return {
            "pool": self.pool,
            "total": self.total,
            "samples": len(self.samples),
            "max_out": self.max_out,
            "read_errors": self.errors,
        }


class Sampler:
    """Reads a pool every ``interval`` seconds on a thread while a batch runs; ``on_read`` gets
    each reading ({server: state}) so the rollout can follow its hosts (draining)."""

    def __init__(
        self, pool: Pool, on_read: Callable[[dict[str, dict]], None] | None = None, interval: float = SAMPLE_SECONDS
    ):
        self.pool, self.on_read, self.interval = pool, on_read, interval
        self.watch = Watch(pool.describe())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"capacity {pool.backend}")

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                state = self.pool.read()
            except DrainError:
                self.watch.errors += 1
            else:
                self.watch.total = len(state)
                self.watch.samples.append(
                    CapacitySample(time.time(), sum(1 for v in state.values() if not v["serving"]))
                )
                if self.on_read:
                    self.on_read(state)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t)))

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for(
    pool: Pool,
    batch: list[str],
    rules: Rules,
    models_of: dict[str, list[str]],
    timeout: float,
    echo: Callable[[str], None],
    label: str,
    sleep: Callable[[float], None] | None = None,
    clock=time.monotonic,
) -> tuple[CapacityVerdict, float]:
    """Read the pool until the batch may go (returns its verdict and the seconds waited) or
    ``timeout`` passed (the last verdict, not ok). ``sleep``: time.sleep as it is at the call
    (gevent's cooperative one in a rollout, so the metrics endpoint answers meanwhile)."""
    sleep = sleep or time.sleep
    t0 = clock()
    said = False
    while True:
        v = judge(pool.serving(), batch, rules, models_of)
        if v.ok or clock() - t0 >= timeout:
            return v, clock() - t0
        if not said:
            echo(
                f"[{label}] waiting for capacity in {pool.describe()} (up to {timeout:.0f}s, "
                f"rollout_capacity_wait): {v.why}"
            )
            said = True
        sleep(SAMPLE_SECONDS)
