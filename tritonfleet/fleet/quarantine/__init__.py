"""Automatic quarantine: an Alertmanager webhook receiver that takes a failing host out of its load
balancer, within a budget, and returns it only after the warm inference gate passes again
(``tritonfleet quarantine serve``; docs/operations.md, "Quarantine").

* **In**: Alertmanager's webhook notifications (``POST /alerts``, payload version 4) of the alerts
  labelled ``quarantine="true"`` (tritonfleet.observability.gpu_health_rules: an Xid that takes the
  GPU out of service, uncorrectable ECC errors, a failed row remapping, a model that is ready but
  fails its inferences), each with the ``host`` label of its scrape target; with ``--alertmanager``
  the receiver also re-reads the firing ones from Alertmanager's API every round (a notification
  lost while it was down is not lost for good).
* **Out**: the host's balancer from its tunables (``lb``: HAProxy's runtime API or the hooks),
  exactly the drain the deploy uses (tritonfleet.serving.drain): ``drain`` sets the server to drain, so
  requests in flight finish and no new one comes. No Triton is restarted: the host is only out.
* **Budget**: at most ``quarantine_budget`` hosts of an inventory group out at once (a number, or
  "P%" of the group's hosts, rounded down; the strictest value among the group's hosts). An alert
  beyond it is logged as "over budget: alert only" and acted on once another host returns, so a
  fleet-wide alert (a bad driver rollout, a broken model everywhere) cannot drain the fleet.
* **Return**: once none of the host's quarantine alerts fires any more (or an operator releases
  it), the warm inference gate runs: live, ready, every model ready, metrics, one real inference
  per model with inputs from its config (tritonfleet.serving.health, tritonfleet.serving.warmup). Only when it
  passes is the server set ready, and the receiver waits until the balancer serves it again. A
  host whose gate fails stays out and is tried again after ``quarantine_check_interval``.
* **Hold and release** (``tritonfleet quarantine hold|release``): hold keeps a host out (draining
  it now if it serves, within the budget unless ``--force`` with a reason) and never returns it
  by itself; release acknowledges the host's firing alerts (they count again only once they fire
  anew) and returns the host through the same gate.
* **Circuit breaker** (``breaker``): when more than ``quarantine_breaker_fraction`` of a group's
  hosts report a fault within ``quarantine_breaker_window`` seconds, no host of the group is taken
  out (an event in capitals, ``tritonfleet_quarantine_breaker_open``, the first line of
  ``quarantine list``); recovered hosts still return; once it closes, alerts whose fault is older
  than the window are acknowledged, not acted on.
* **Latency** (``latency``): each event's times from the fault seen on the host (the collector's
  timestamp in the alert's ``fault_seen`` annotation, else its start) to the alert, the drain, a
  reset and the return, as histograms on ``GET /metrics`` and per host in ``quarantine list``.
* **Reconcile**: a quarantined host that the balancer serves again (a deploy's health gate puts a
  drained server back) is drained again, with a log line saying so.

Every action is one line on stdout (the journal) and one JSON line in ``events.jsonl``; the state
(quarantined hosts, since, reasons, the alerts seen) is ``state.json``, both in ``--state-dir``,
rewritten atomically, so a restarted receiver knows what it did. ``GET /v1/quarantine`` returns
it (``tritonfleet status`` and ``tritonfleet quarantine list`` read it from ``quarantine_url``).

HTTP: ``POST /alerts`` (Alertmanager), ``GET /v1/quarantine``, ``GET /metrics``, ``POST /v1/hosts/<host>/release``,
``POST /v1/hosts/<host>/hold`` (JSON ``{"reason": ..., "force": ...}``), ``POST /v1/hosts/<host>/fault``
(a host's collector pushing a critical Xid, with the host's own token: ``push``), ``GET /-/healthy``. Every
request but the last needs the bearer token of ``--token-file`` (tritonfleet.fleet.quarantine.server);
the budget also counts the servers HAProxy already has out, and an Alertmanager answer that is not
a list of alerts changes nothing.

The package: ``planning`` (the budget and what a round does, pure), ``breaker`` (the circuit
breaker, pure), ``latency`` (the histograms), ``remedy`` (a GPU reset, a reboot or a hold decided for a
quarantined host, and the reset's commands), ``remediation`` (the receiver running them over SSH
with ``quarantine_remediate``, the reboot as a pyinfra process of deploys/reboot.py), ``push`` (the
direct path: a host's pushed fault as an alert until the Prometheus path's takes over), ``actions`` (a host's balancer and
its warm gate), ``receiver`` (the state and the worker), ``server`` (the HTTP API and ``serve``),
``client`` (what ``status`` and ``tritonfleet quarantine`` ask the receiver).
"""

from __future__ import annotations

from .actions import balancer, warm_gate
from .client import ask, fetch_state, read_token, status_line, write_token
from .planning import (
    FiringAlert,
    QuarantineError,
    Record,
    RoundPlan,
    budget_limit,
    limits,
    plan,
    webhook_alerts,
)
from .receiver import Busy, Receiver
from .server import Caller, handler_for, parse_listen, serve

__all__ = [
    "Busy",
    "Caller",
    "FiringAlert",
    "QuarantineError",
    "Receiver",
    "Record",
    "RoundPlan",
    "ask",
    "balancer",
    "budget_limit",
    "fetch_state",
    "handler_for",
    "limits",
    "parse_listen",
    "plan",
    "read_token",
    "serve",
    "status_line",
    "warm_gate",
    "webhook_alerts",
    "write_token",
]
