"""Each host's state in a running rollout: written to the rollout's directory (``state.json``,
replaced atomically on every change; ``tritonfleet status`` reads it) and served as Prometheus
metrics while the rollout runs (``rollout_metrics_listen``); pause and continue by command.

States, in the order a host goes through them: ``pending`` (not reached yet), ``draining`` (its
HAProxy server is in drain while the deploy waits for requests in flight), ``updating`` (its batch's
deploy runs), ``gating`` (the rollout's health gate), ``analysing`` (a traffic canary under
analysis), then ``done``, ``failed`` or ``rolled back``.

Metrics (Prometheus text format, served by ``prometheus_client``), one series per state with 1 for
the host's current state and 0 for the others, the way an enumeration is exported as a gauge::

    tritonfleet_rollout_host_state{rollout="<id>", host="tb1-t4", state="analysing"} 1
    tritonfleet_rollout_paused{rollout="<id>"} 0
    tritonfleet_rollout_batch{rollout="<id>"} 1
    tritonfleet_rollout_canary_share{rollout="<id>"} 0.05

A pause (``tritonfleet rollout --pause``: a file ``paused`` in the rollout's directory) holds the
rollout at its next safe point: before a batch starts, and before a canary verdict is acted on.
``tritonfleet rollout --continue`` removes the file and the rollout goes on within a second.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...core.errors import TritonfleetError, UsageError
from ...core.procs import alive

STATES = ("pending", "draining", "updating", "gating", "analysing", "done", "failed", "rolled back")
STATE_FILE = "state.json"
PAUSE_FILE = "paused"
HOLD_POLL_SECONDS = 1.0


def base_dir() -> Path:
    """Where rollouts keep their directories (the journal's: tritonfleet.fleet.rollout.journal)."""
    return Path(os.environ.get("TRITONFLEET_LOG_DIR", ".tritonfleet/rollouts"))


class HostStates:
    """The states of one rollout's hosts; thread-safe (the capacity sampler updates them)."""

    def __init__(self, directory: Path, hosts: list[str], echo: Callable[[str], None] = print):
        self.dir = Path(directory)
        self.id = self.dir.name
        self.echo = echo
        self.states: dict[str, dict] = {h: {"state": "pending", "detail": "", "since": time.time()} for h in hosts}
        self.batch = 0
        self.paused = False
        self.canary_share: float | None = None
        self.ended = False
        self._lock = threading.Lock()
        self._server: Any = None  # prometheus_client's WSGI server while the metrics are served
        self.listen = ""
        self.write()

    # ---- changes ---------------------------------------------------------------------------
    def set(self, hosts, state: str, detail: str = "") -> None:
        if state not in STATES:
            raise ValueError(f"unknown rollout state {state!r}")
        with self._lock:
            changed = False
            for h in hosts:
                cur = self.states.get(h)
                if cur is not None and (cur["state"], cur["detail"]) != (state, detail):
                    self.states[h] = {"state": state, "detail": detail, "since": time.time()}
                    changed = True
        if changed:
            self.write()

    def get(self, host: str) -> str:
        return self.states[host]["state"]

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "rollout": self.id,
                "pid": os.getpid(),
                "batch": self.batch,
                "paused": self.paused,
                "canary_share": self.canary_share,
                "ended": self.ended,
                "listen": self.listen,
                "hosts": {h: dict(v) for h, v in self.states.items()},
                "time": time.time(),
            }

    def write(self) -> None:
        data = json.dumps(self.snapshot(), sort_keys=True)
        tmp = self.dir / f".{STATE_FILE}.{os.getpid()}.tmp"
        tmp.write_text(data)
        os.replace(tmp, self.dir / STATE_FILE)

    def update(self, **fields) -> None:
        with self._lock:
            for k, v in fields.items():
                setattr(self, k, v)
        self.write()

    # ---- pause -----------------------------------------------------------------------------
    def hold(self, where: str) -> None:
        """Wait here while the rollout is paused (its directory holds a ``paused`` file)."""
        if not (self.dir / PAUSE_FILE).exists():
            return
        self.update(paused=True)
        self.echo(f"paused {where}: `tritonfleet rollout --continue` goes on")
        t0 = time.monotonic()
        while (self.dir / PAUSE_FILE).exists():
            time.sleep(HOLD_POLL_SECONDS)
        self.update(paused=False)
        self.echo(f"continuing after {time.monotonic() - t0:.0f}s paused")

    # ---- metrics ---------------------------------------------------------------------------
    def collect(self):
        """prometheus_client's collector protocol: the families at the time of the scrape."""
        from prometheus_client.core import GaugeMetricFamily

        snap = self.snapshot()
        state = GaugeMetricFamily(
            "tritonfleet_rollout_host_state",
            "The host's state in the rollout: 1 for its current state, 0 for the others",
            labels=["rollout", "host", "state"],
        )
        for host, v in snap["hosts"].items():
            for s in STATES:
                state.add_metric([self.id, host, s], 1.0 if v["state"] == s else 0.0)
        paused = GaugeMetricFamily("tritonfleet_rollout_paused", "1 while the rollout is paused", labels=["rollout"])
        paused.add_metric([self.id], 1.0 if snap["paused"] else 0.0)
        batch = GaugeMetricFamily(
            "tritonfleet_rollout_batch", "The batch the rollout is in (1: the first)", labels=["rollout"]
        )
        batch.add_metric([self.id], float(snap["batch"]))
        out = [state, paused, batch]
        if snap["canary_share"] is not None:
            share = GaugeMetricFamily(
                "tritonfleet_rollout_canary_share",
                "The part of its backend's traffic HAProxy sends the canary hosts",
                labels=["rollout"],
            )
            share.add_metric([self.id], float(snap["canary_share"]))
            out.append(share)
        return out

    def serve(self, listen: str | None) -> str:
        """Serve the metrics on ``listen`` ("address:port"); what to tell the person."""
        if not listen:
            return ""
        from prometheus_client import CollectorRegistry, start_http_server

        addr, _, port = str(listen).rpartition(":")
        if not port.isdigit():
            raise UsageError(f"rollout_metrics_listen must be address:port, not {listen!r} (group data)")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        try:
            self._server, _ = start_http_server(int(port), addr.strip("[]") or "0.0.0.0", registry=registry)
        except OSError as e:
            return (
                f"rollout state metrics: cannot listen on {listen} ({e.strerror or e}); the states are in "
                f"{self.dir / STATE_FILE} and `tritonfleet status` shows them"
            )
        self.listen = f"{addr}:{self._server.server_port}"
        self.write()
        return f"rollout state metrics on http://{self.listen}/metrics"

    def close(self) -> None:
        self.update(ended=True)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# ---- the read side: status, pause and continue -----------------------------------------------------


def unfinished(base: Path | None = None) -> list[dict]:
    """The state of every rollout under ``base`` that has not ended, newest first, each with
    ``dir`` and ``alive`` (its process still runs on this machine)."""
    base = base or base_dir()
    out = []
    for f in sorted(base.glob(f"*/{STATE_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if data.get("ended"):
            continue
        data["dir"] = str(f.parent)
        data["alive"] = bool(data.get("pid")) and alive(int(data["pid"]))
        data["paused"] = data.get("paused") or (f.parent / PAUSE_FILE).exists()
        out.append(data)
    return out


def host_column(base: Path | None = None) -> dict[str, str]:
    """{host: its state in the newest unfinished rollout that has it} for ``tritonfleet status``."""
    out: dict[str, str] = {}
    for r in unfinished(base):
        for host, v in r.get("hosts", {}).items():
            if host in out:
                continue
            text = v.get("state", "?")
            if not r["alive"]:
                text += " (rollout died: --resume)"
            elif r["paused"]:
                text += " (paused)"
            out[host] = text
    return out


def _target(journal: str | None) -> Path:
    if journal:
        d = Path(journal)
        d = d.parent if d.is_file() else d
        if not (d / STATE_FILE).is_file():
            raise UsageError(f"{d}: no rollout state there ({STATE_FILE})")
        return d
    running = [r for r in unfinished() if r["alive"]]
    if not running:
        raise UsageError(f"no running rollout under {base_dir()}/ (give its directory with --journal)")
    return Path(running[0]["dir"])


def pause(journal: str | None = None) -> str:
    d = _target(journal)
    (d / PAUSE_FILE).write_text(f"{time.time()}\n")
    return f"pausing the rollout in {d}: it holds before its next batch or canary verdict"


def unpause(journal: str | None = None) -> str:
    d = _target(journal)
    try:
        (d / PAUSE_FILE).unlink()
    except FileNotFoundError:
        raise TritonfleetError(f"the rollout in {d} is not paused") from None
    return f"the rollout in {d} goes on"
