"""The quarantine receiver's state and the worker that acts on it: Alertmanager's notifications
and the operators' requests in, one round every ``quarantine_check_interval``, every action an
event (stdout, ``events.jsonl``) and the state saved (``state.json``) atomically."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import threading
import time
import traceback
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path

from ...core.errors import TritonfleetError, UsageError
from ...inventory.roster import FleetHost
from ...serving import drain
from ...settings.defaults import DEFAULTS
from .actions import balancer, warm_gate
from .breaker import Breaker, fault_time
from .latency import Latency, since_fault
from .planning import (
    QUARANTINE_LABEL,
    FiringAlert,
    QuarantineError,
    Record,
    acknowledged,
    alert_shape_error,
    clean,
    group_of,
    limits,
    now_iso,
    out_count,
    plan,
    webhook_alerts,
)
from .push import Pushes, is_pushed
from .remediation import Rebooter, Remedies, Runner, ssh_runner

RETRY_MIN_SECONDS = 10.0
#: requests and notifications waiting for the worker; beyond it the API answers 503 (a flood
#: delays nothing for long and takes no memory without bound)
QUEUE_MAX = 64


#: what a bug in the receiver's own code raises (a payload or a state it did not expect): the
#: worker logs it as an error event and goes on; anything else (MemoryError, the interpreter ending) ends it
BUGS = (
    AttributeError,
    TypeError,
    LookupError,
    ValueError,
    ArithmeticError,
    RuntimeError,
    AssertionError,
    TritonfleetError,
)


class Busy(QuarantineError):
    """The worker's queue is full: the request was not taken (HTTP 503)."""


class UnknownHost(QuarantineError):
    """A request names a host the inventory does not have (HTTP 404)."""


def _who(caller: str, by: str) -> str:
    """The audit trail's name of a request's author: the credential's (``caller``), with what the
    body says (``by``, unverified, escaped) after it."""
    by = clean(by, 64) if by else ""
    return f"{caller or 'an operator'}" + (f" (says {by})" if by else "")


class Receiver(Remedies, Pushes):
    """State, the worker that acts on it (one thread: every change to the state happens there),
    and the HTTP API in front of it."""

    def __init__(
        self,
        hosts: list[FleetHost],
        state_dir: Path,
        alertmanager: str = "",
        interval: float | None = None,
        gate_timeout: float | None = None,
        resolve_grace: float | None = None,
        echo: Callable[[str], None] = print,
        balancer_of: Callable[[FleetHost], drain.Balancer | None] = balancer,
        gate: Callable[[FleetHost, float], tuple[bool, str]] = warm_gate,
        runner: Runner = ssh_runner,
        rebooter: Rebooter | None = None,
    ):
        if not hosts:
            raise UsageError("the inventory has no hosts")
        self.hosts = {h.name: h for h in hosts}
        self.limits = limits(hosts)
        first = hosts[0]
        self.interval = float(interval if interval is not None else first.get("quarantine_check_interval"))
        self.gate_timeout = float(gate_timeout if gate_timeout is not None else first.get("quarantine_gate_timeout"))
        self.resolve_grace = float(
            resolve_grace if resolve_grace is not None else first.get("quarantine_resolve_grace")
        )
        if self.interval <= 0 or self.gate_timeout <= 0 or self.resolve_grace < 0:
            raise UsageError(
                "quarantine_check_interval and quarantine_gate_timeout must be > 0, "
                "quarantine_resolve_grace >= 0 (group data)"
            )
        fraction = float(first.get("quarantine_breaker_fraction", DEFAULTS["quarantine_breaker_fraction"]))
        window = float(first.get("quarantine_breaker_window", DEFAULTS["quarantine_breaker_window"]))
        if not 0 < fraction <= 1 or window <= 0:
            raise UsageError(
                "quarantine_breaker_fraction must be in (0, 1], quarantine_breaker_window > 0 (group data)"
            )
        self.breaker = Breaker(fraction, window)
        self.remediate = bool(first.get("quarantine_remediate", DEFAULTS["quarantine_remediate"]))
        self.refault_window = float(first.get("quarantine_refault_window", DEFAULTS["quarantine_refault_window"]))
        self.runner, self.history, self.rebooter, self.rebooting = runner, {}, rebooter, {}
        self.latency = Latency()
        self._init_pushes(first)
        self.alert_at: dict[str, float] = {}  # when each alert reached the receiver (epoch seconds)
        self._states: dict[tuple, dict[str, drain.ServerState]] = {}  # a round's reads of HAProxy
        self.alertmanager = alertmanager.rstrip("/")
        self.echo, self.balancer_of, self.gate = echo, balancer_of, gate
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.alerts: dict[str, FiringAlert] = {}
        self.acked: dict[str, str] = {}
        self.records: dict[str, Record] = {}
        self.events: deque = deque(maxlen=200)
        self.noted: dict[str, str] = {}  # what was last said about a host or alert (said once, not each round)
        self.retry_at: dict[str, float] = {}
        self.absent: dict[str, tuple[float, int]] = {}  # alerts missing from Alertmanager: since, reads
        self._balancers: dict[str, drain.Balancer | None] = {}
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_MAX)
        self.lock = threading.Lock()
        self.snapshot_cache: dict = {}
        self.stop = threading.Event()
        self.worker: threading.Thread | None = None
        self.crashed: BaseException | None = None
        self._load()
        self._publish()

    # -- persistence ------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def events_file(self) -> Path:
        return self.state_dir / "events.jsonl"

    def _load(self) -> None:
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            raise UsageError(
                f"{self.state_file}: cannot read the receiver's state ({e}); move it away to start without it"
            ) from e
        self.records = {h: Record(**r) for h, r in (data.get("hosts") or {}).items()}
        self.alerts = {fp: FiringAlert(**a) for fp, a in (data.get("alerts") or {}).items()}
        self.acked = dict(data.get("acked") or {})
        for r in list(self.records.values()):
            if r.host not in self.hosts:
                self.event(
                    "forgotten",
                    r.host,
                    f"was {r.state} since {r.since}, but is not in the inventory any more: no longer tracked",
                )
                del self.records[r.host]

    def _save(self) -> None:
        data = {
            "hosts": {h: asdict(r) for h, r in self.records.items()},
            "alerts": {fp: asdict(a) for fp, a in self.alerts.items()},
            "acked": self.acked,
        }
        tmp = self.state_file.with_name(".state.json.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.state_file)

    def event(self, kind: str, host: str, text: str, **extra) -> None:
        ev = {"time": now_iso(), "host": host, "action": kind, "text": text, **extra}
        self.events.append(ev)
        with contextlib.suppress(OSError), open(self.events_file, "a") as f:
            f.write(json.dumps(ev, sort_keys=True) + "\n")
        self.echo(f"{ev['time']} {host} {kind}: {text}")

    def _once(self, key: str, kind: str, host: str, text: str) -> None:
        """An event said once for as long as it stays the same (not every round)."""
        if self.noted.get(key) != text:
            self.noted[key] = text
            self.event(kind, host, text)

    def _publish(self) -> None:
        snap = {
            "time": now_iso(),
            "hosts": {h: {**asdict(r), "state": r.state} for h, r in sorted(self.records.items())},
            "firing": sorted(
                (
                    {
                        "host": a.host,
                        "alert": a.name,
                        "summary": a.summary,
                        "since": a.starts_at,
                        "acknowledged": acknowledged(a, self.acked.get(fp)),
                    }
                    for fp, a in self.alerts.items()
                ),
                key=lambda x: (x["host"], x["alert"]),
            ),
            "budget": {
                g: {
                    "limit": n,
                    "out": sum(
                        1 for r in self.records.values() if r.host in self.hosts and group_of(self.hosts[r.host]) == g
                    ),
                }
                for g, n in sorted(self.limits.items())
            },
            "breaker": {
                g: {"open_since": now_iso(t), "fraction": self.breaker.fraction, "window": self.breaker.window}
                for g, t in sorted(self.breaker.open_since.items())
            },
            "events": list(self.events)[-50:],
        }
        with self.lock:
            self.snapshot_cache = snap

    def snapshot(self) -> dict:
        with self.lock:
            return self.snapshot_cache

    # -- inputs -----------------------------------------------------------------------------

    def apply_notification(self, payload: dict, caller: str = "alertmanager") -> int:
        """Alertmanager's webhook payload: firing quarantine alerts are kept, resolved ones
        dropped (with their acknowledgement). An alert not of Alertmanager's shape is skipped (an
        event says why); a payload not of that shape at all is a ValueError. Returns how many
        quarantine alerts it carried."""
        good, skipped = webhook_alerts(payload)
        for why in skipped:
            self.event("malformed", "-", f"a webhook alert from {caller} skipped: {why}", caller=caller)
        n = 0
        for raw in good:
            a = FiringAlert.from_alertmanager(raw)
            if a is None:
                continue
            n += 1
            self.absent.pop(a.fingerprint, None)
            if raw.get("status") == "resolved":
                if self.alerts.pop(a.fingerprint, None) is not None:
                    self.event("resolved", a.host, a.reason)
                self.acked.pop(a.fingerprint, None)
                self.alert_at.pop(a.fingerprint, None)
            else:
                if a.fingerprint not in self.alerts:
                    self._arrived(a)
                self.alerts[a.fingerprint] = a
        return n

    def sync_alertmanager(self) -> None:
        """Bring the firing alerts to what Alertmanager reports active now. Only a JSON list of
        well-formed alerts is an answer: anything else changes nothing (an error event). An alert
        missing from the answer is dropped only once it has been missing for
        ``quarantine_resolve_grace`` seconds and two reads (a restarted Alertmanager answers an
        empty list until the alerts are evaluated again)."""
        if not self.alertmanager:
            return
        query = urllib.parse.urlencode(
            {"active": "true", "silenced": "false", "inhibited": "false", "filter": '{}="{}"'.format(*QUARANTINE_LABEL)}
        )
        url = f"{self.alertmanager}/api/v2/alerts?{query}"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                data = json.loads(r.read(8 << 20))
            if not isinstance(data, list):
                raise ValueError(
                    f"the answer is a JSON {type(data).__name__}, not a list of alerts: {clean(json.dumps(data), 120)}"
                )
            for raw in data:
                why = alert_shape_error(raw, api=True)
                if why:
                    raise ValueError(f"the answer has an alert that is not one: {why}")
        except (OSError, ValueError, http.client.HTTPException) as e:
            self._once(
                "alertmanager",
                "error",
                "-",
                f"alertmanager: cannot read {url}: {e} (nothing changes: the alerts known stand meanwhile)",
            )
            return
        self.noted.pop("alertmanager", None)
        fresh = {}
        for raw in data:
            a = FiringAlert.from_alertmanager(raw)
            if a is not None and raw["status"]["state"] == "active":
                fresh[a.fingerprint] = a
        now = time.monotonic()
        for fp, a in list(self.alerts.items()):
            if fp in fresh or is_pushed(a):  # a pushed alert is not Alertmanager's: settle_pushes
                self.absent.pop(fp, None)
                continue
            since, reads = self.absent.get(fp, (now, 0))
            self.absent[fp] = (since, reads + 1)
            if reads + 1 >= 2 and now - since >= self.resolve_grace:
                self.event("resolved", a.host, f"{a.reason} (no longer active in Alertmanager for {now - since:.0f} s)")
                del self.alerts[fp]
                self.absent.pop(fp, None)
                self.acked.pop(fp, None)
                self.alert_at.pop(fp, None)
        for fp, a in fresh.items():
            if fp not in self.alerts:
                self._arrived(a)
            self.alerts[fp] = a

    def _arrived(self, a: FiringAlert) -> None:
        """A new alert: when it came, how long after its fault (the histogram's ``alert`` stage)."""
        now = time.time()
        self.alert_at[a.fingerprint] = now
        took = self.latency.observe("alert", fault_time(a) or 0, now)
        self.event("alert", a.host, a.reason + (f" (fault seen {took:.2f} s before)" if took is not None else ""))

    # -- the round --------------------------------------------------------------------------

    def _balancer(self, fh: FleetHost) -> drain.Balancer | None:
        if fh.name not in self._balancers:
            try:
                self._balancers[fh.name] = self.balancer_of(fh)
            except drain.DrainError as e:
                self._once(f"lb:{fh.name}", "no-balancer", fh.name, f"its load balancer settings are wrong: {e}")
                self._balancers[fh.name] = None
        return self._balancers[fh.name]

    def _breaker(self) -> None:
        """Open or close each group's circuit breaker for the faults of the alerts not
        acknowledged, at the end of a round (the hosts of a burst that the budget let out in it
        stay out; from the next round on, no more). As it closes, the group's waiting alerts older
        than the window are acknowledged (not replayed), each with an event; a quarantined host's
        own alert is not (it stays out until that alert resolves)."""
        live = [a for fp, a in self.alerts.items() if not acknowledged(a, self.acked.get(fp))]
        now = time.time()
        was_open = dict(self.breaker.open_since)
        opened, closed = self.breaker.step(live, self.hosts, now)
        faulting = self.breaker.faulting(live, self.hosts, now)
        for g in opened:
            size = sum(1 for h in self.hosts.values() if group_of(h) == g)
            self.latency.breaker_open.labels(g).set(1)
            self.latency.breaker_trips.labels(g).inc()
            self.event(
                "breaker-open",
                "-",
                f"CIRCUIT BREAKER OPEN for group {g}: {len(faulting.get(g, ()))} of its "
                f"{size} hosts report a quarantine fault within "
                f"{self.breaker.window:.0f} s (more than "
                f"{self.breaker.fraction:.0%}): no host of it is taken out until it "
                "closes (the alerts only alert; recovered hosts still return)",
                group=g,
            )
        for g in closed:
            self.latency.breaker_open.labels(g).set(0)
            self.event(
                "breaker-closed",
                "-",
                f"circuit breaker closed for group {g} (open since {now_iso(was_open[g])})",
                group=g,
            )
        waiting = [a for a in live if a.host not in self.records]  # a quarantined host's alert is acted on
        for a in self.breaker.stale(waiting, self.hosts, closed, now):
            self.acked[a.fingerprint] = a.starts_at
            self.latency.stale.labels(group_of(self.hosts[a.host])).inc()
            self.event(
                "stale",
                a.host,
                f"{a.reason}: its fault is older than the breaker's window "
                f"({self.breaker.window:.0f} s) as the breaker closes: not acted on "
                "(acknowledged; it counts again when it fires anew)",
            )

    def round(self) -> None:
        self.sync_alertmanager()
        self.settle_pushes()
        self._states.clear()
        p = plan(
            self.alerts,
            self.acked,
            self.records,
            self.hosts,
            self.limits,
            lambda fh: self._balancer(fh) is not None,
            self.out_elsewhere,
            set(self.breaker.open_since),
        )
        for a in p.unknown:
            self._once(f"unknown:{a.fingerprint}", "unknown-host", a.host, f"{a.reason}: not a host of the inventory")
        for name, alerts in p.no_balancer:
            self._once(
                f"nolb:{name}",
                "alert-only",
                name,
                f"{'; '.join(a.reason for a in alerts)}: no load balancer (lb) to take it out of",
            )
        for name, alerts in p.quarantine:
            self._quarantine(name, alerts)
        for name, alerts in p.over_budget:
            g = group_of(self.hosts[name])
            self._once(
                f"budget:{name}",
                "over-budget",
                name,
                f"{'; '.join(a.reason for a in alerts)}: not taken out, the quarantine budget of group {g} "
                f"({self.limits.get(g, 0)} host(s) at once) is spent: alert only",
            )
        for name, alerts in p.breaker:
            self._once(
                f"budget:{name}",
                "breaker",
                name,
                f"{'; '.join(a.reason for a in alerts)}: not taken out, the circuit breaker of group "
                f"{group_of(self.hosts[name])} is open: alert only",
            )
        self._remedy_all()
        for name in p.returns:  # not while it reboots: its alerts resolve as its collector restarts
            if time.monotonic() >= self.retry_at.get(name, 0) and name not in self.rebooting:
                self._return(name)
        self._reconcile()
        self._breaker()  # after the round's drains: the budget's first hosts of a burst go out
        self._save()
        self._publish()

    def out_elsewhere(self, group: str, besides: str = "") -> int | None:
        """Servers of ``group`` that HAProxy does not serve and that the receiver does not hold
        (drained or in maintenance by an operator or a deploy, or down): they count against the
        budget. None when one of them cannot be read (no new drain on a guess). Hosts on the
        hooks balancer cannot be read and count as in. ``besides``: a host not counted (the one
        about to be held: holding a server that is out already takes nothing more out)."""
        n = 0
        for name, fh in self.hosts.items():
            if name in self.records or name == besides or group_of(fh) != group:
                continue
            lb = self._balancer(fh)
            if not isinstance(lb, drain.HAProxy):
                continue
            try:
                serving = self._state(lb).serving
            except drain.DrainError as e:
                self._once(
                    f"state:{name}",
                    "balancer-unreadable",
                    name,
                    f"cannot read {lb.describe()}: {e} (no new drain in group {group} meanwhile)",
                )
                return None
            self.noted.pop(f"state:{name}", None)
            n += 0 if serving else 1
        return n

    def _state(self, lb: drain.HAProxy) -> drain.ServerState:
        """``lb``'s server as HAProxy reported it in this round: each backend's servers read once
        a round (two runtime API commands), not two commands a host."""
        key = (tuple(api.address for api in lb.apis), lb.backend)
        if key not in self._states:
            self._states[key] = drain.backend_states(lb.apis, lb.backend)
        got = self._states[key].get(lb.server)
        return got if got is not None else lb.state()  # not there: the single read says why

    def _quarantine(
        self, name: str, alerts: list[FiringAlert], held: bool = False, held_reason: str = "", caller: str = ""
    ) -> str:
        fh = self.hosts[name]
        lb = self._balancer(fh)
        if lb is None:
            return "no load balancer (lb) to take it out of"
        reasons = [a.reason for a in alerts] or ([f"held by an operator: {held_reason}"] if held else [])
        try:
            did = lb.drain()
        except drain.DrainError as e:
            self._once(f"drain:{name}", "drain-failed", name, f"{'; '.join(reasons)}: could not take it out: {e}")
            return f"could not take it out: {e}"
        self.noted.pop(f"drain:{name}", None)
        self.noted.pop(f"budget:{name}", None)
        self._states.clear()
        now = time.time()
        faults = [t for t in (fault_time(a) for a in alerts) if t]
        rec = self.records[name] = Record(
            name,
            now_iso(),
            reasons,
            held,
            held_reason,
            lb.describe(),
            fault_at=min(faults, default=0.0),
            drained_at=now,
            alert_at=min((self.alert_at.get(a.fingerprint, now) for a in alerts), default=0.0),
        )
        took = self.latency.observe("drained", rec.fault_at, now)
        self.event(
            "held" if held else "quarantined",
            name,
            f"{'; '.join(reasons)}: {did}" + (f" ({took:.2f} s after the fault)" if took is not None else ""),
            reasons=reasons,
            group=group_of(fh),
            **({"caller": caller} if caller else {}),
            **({"fault_to_drained": round(took, 3)} if took is not None else {}),
        )
        return did

    def _return(self, name: str, by: str = "") -> tuple[bool, str]:
        """Warm gate, then back in the balancer (True) or out still (False, why)."""
        fh, rec = self.hosts[name], self.records[name]
        self.event("gate", name, f"{by or 'its quarantine alerts resolved'}: warm inference gate")
        try:
            ok, found = self.gate(fh, self.gate_timeout)
        except (TritonfleetError, OSError, ValueError, RuntimeError) as e:
            ok, found = False, f"the gate could not run: {type(e).__name__}: {e}"
        if not ok:
            rec.last_gate = found
            self.retry_at[name] = time.monotonic() + max(self.interval, RETRY_MIN_SECONDS)
            self.event("stays-out", name, f"warm inference gate failed: {found}")
            return False, found
        lb = self._balancer(fh)
        try:
            did = lb.ready() if lb is not None else ""
            seen = lb.wait_serving(float(fh.get("lb_drain_timeout"))) if (lb is not None and did) else ""
        except drain.DrainError as e:
            rec.last_gate = f"gate passed, but putting it back failed: {e}"
            self.retry_at[name] = time.monotonic() + max(self.interval, RETRY_MIN_SECONDS)
            self.event("stays-out", name, rec.last_gate)
            return False, rec.last_gate
        del self.records[name]
        self.retry_at.pop(name, None)
        self._came_back(name)
        took = self.latency.observe("returned", rec.fault_at, time.time())
        self.event(
            "returned",
            name,
            f"warm gate passed ({found}); {did or 'it was not drained'}"
            + (f", serving ({seen})" if seen else "")
            + (f"; {took:.1f} s after the fault" if took is not None else ""),
            quarantined_since=rec.since,
            **({"fault_to_returned": round(took, 3)} if took is not None else {}),
            **{
                f"fault_to_{s}": v
                for s in ("alert", "drained", "remedied")
                if (v := since_fault(asdict(rec), s)) is not None
            },
        )
        return True, found

    def _reconcile(self) -> None:
        """A quarantined host the balancer serves again is drained again."""
        for name, rec in list(self.records.items()):
            lb = self._balancer(self.hosts[name])
            if not isinstance(lb, drain.HAProxy):
                continue
            try:
                st = self._state(lb)
                if st.serving:
                    lb.drain()
                    self.event(
                        "drained-again",
                        name,
                        f"{rec.state} since {rec.since}, but {lb.describe()} served it "
                        "again (a deploy's health gate puts drained servers back): "
                        "drained again; release it to return it",
                    )
                self.noted.pop(f"state:{name}", None)
            except drain.DrainError as e:
                self._once(f"state:{name}", "balancer-unreadable", name, f"cannot read {lb.describe()}: {e}")

    # -- operator requests ------------------------------------------------------------------

    def release(self, name: str, by: str = "", caller: str = "operator") -> dict:
        if name not in self.hosts:
            raise UnknownHost(f"{name} is not a host of the inventory")
        rec = self.records.get(name)
        if rec is None:
            return {"host": name, "ok": True, "result": "not quarantined: nothing to release"}
        for fp, a in self.alerts.items():
            if a.host == name:
                self.acked[fp] = a.starts_at
        rec.held = False
        who = _who(caller, by)
        self.event("release", name, f"released by {who} (its firing alerts acknowledged)", caller=caller)
        ok, found = self._return(name, by=f"released by {who}")
        self._save()
        self._publish()
        return {
            "host": name,
            "ok": ok,
            "result": ("returned: " if ok else "stays out: warm inference gate failed: ") + found,
        }

    def hold(self, name: str, reason: str = "", by: str = "", caller: str = "operator", force: bool = False) -> dict:
        """Keep ``name`` out until released: within its group's budget (its own holds and
        quarantines, and the servers already out in HAProxy), or beyond it with ``force`` and a
        reason (recorded)."""
        if name not in self.hosts:
            raise UnknownHost(f"{name} is not a host of the inventory")
        if force and not reason:
            raise QuarantineError("a forced hold needs a reason (--reason)")
        who = _who(caller, by)
        reason = reason or f"held by {who}"
        rec = self.records.get(name)
        if rec is not None:
            rec.held, rec.held_reason = True, reason
            self.event("held", name, f"{reason} (stays out until released; by {who})", caller=caller)
            result = f"held (was {', '.join(rec.reasons) or 'quarantined'} since {rec.since})"
            ok = True
        else:
            g = group_of(self.hosts[name])
            elsewhere = self.out_elsewhere(g, besides=name)
            out = out_count(self.records, self.hosts).get(g, 0)
            within = elsewhere is not None and out + elsewhere < self.limits.get(g, 0)
            if not within and not force:
                why = (
                    "its balancer cannot be read"
                    if elsewhere is None
                    else f"{out + elsewhere} of the {self.limits.get(g, 0)} host(s) it may have out at once are out"
                )
                self.event(
                    "over-budget",
                    name,
                    f"hold by {who} refused: the quarantine budget of group {g} is spent ({why})",
                    caller=caller,
                )
                self._publish()
                return {
                    "host": name,
                    "ok": False,
                    "result": f"not held: the quarantine budget of group {g} is spent ({why}); "
                    "--force --reason TEXT holds it all the same",
                }
            if not within:
                reason = f"{reason} (forced beyond the budget of group {g})"
            did = self._quarantine(name, [], held=True, held_reason=reason, caller=caller)
            ok = name in self.records
            result = f"held: {did}" if ok else f"could not hold it: {did}"
        self._save()
        self._publish()
        return {"host": name, "ok": ok, "result": result}

    # -- the worker -------------------------------------------------------------------------

    def submit(self, kind: str, *args) -> Future:
        """Queue a request for the worker; Busy when the queue is full."""
        fut: Future = Future()
        try:
            self.queue.put_nowait((kind, args, fut))
        except queue.Full:
            raise Busy(f"the receiver is busy ({QUEUE_MAX} requests waiting): try again") from None
        return fut

    def _work(self) -> None:
        """The worker: requests and notifications as they come, a round every interval. A failure
        of a known kind fails its request. An exception of a bug (``BUGS``) fails its request too,
        is an error event with its traceback on stdout, and the worker goes on (a receiver that
        ends leaves the fleet unprotected while systemd restarts it; one bad input must not do
        that). Anything else ends it, and ``serve`` with it."""
        while not self.stop.is_set():
            try:
                kind, args, fut = self.queue.get(timeout=self.interval)
            except queue.Empty:
                kind, args, fut = "round", (), None
            try:
                result: int | dict | None = None
                if kind == "alerts":
                    result = self.apply_notification(*args)
                elif kind == "faults":
                    result = self.apply_pushes()
                elif kind == "release":
                    result = self.release(*args)
                elif kind == "hold":
                    result = self.hold(*args)
                if kind in ("alerts", "faults", "round"):
                    self.round()
            except (QuarantineError, drain.DrainError, OSError) as e:
                self.event("error", "-", f"{kind} failed: {clean(e, 500)}")
                if fut is not None:
                    fut.set_exception(e if isinstance(e, QuarantineError) else QuarantineError(str(e)))
                continue
            except BUGS as e:  # a bug: logged, its request failed, the worker goes on
                self.echo(traceback.format_exc().rstrip())
                self.event("error", "-", f"{kind} failed (a bug: {type(e).__name__}: {clean(e)}); the receiver goes on")
                if fut is not None:
                    fut.set_exception(QuarantineError(f"the receiver failed: {type(e).__name__}: {e}"))
                continue
            except BaseException as e:
                self.crashed = e
                if fut is not None:
                    fut.set_exception(QuarantineError(f"the receiver failed: {type(e).__name__}: {e}"))
                raise
            if fut is not None:
                fut.set_result(result)

    def start(self) -> None:
        self.worker = threading.Thread(target=self._work, name="quarantine-worker", daemon=True)
        self.worker.start()
        self.submit("round")

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(("stop", (), None))
        if self.worker is not None:
            self.worker.join(timeout=self.gate_timeout + 30)
