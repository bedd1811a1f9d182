"""Prometheus and Alertmanager for GPU health (written by ``tritonfleet prometheus`` next to the
Triton files, tritonfleet.observability.prometheus):

* the scrape job ``<job>-health``: every host's node exporter (hosts with ``gpu_telemetry``),
  only its textfile collector (``collect[]=textfile``: the GPU collector's and the inference
  probe's files), every ``--health-interval``; targets in ``targets/health/<job>-<group>.json``
  (a directory of their own, so the Triton job's ``targets/<job>-*.json`` never matches them);
* ``rules/<job>-health.rules.yml``: one group evaluated every ``--health-interval``. Alerts
  labelled ``quarantine="true"`` take the host out of its load balancer through the quarantine
  receiver (tritonfleet.fleet.quarantine), within the quarantine budget; the others only alert;
* ``alertmanager.yml`` (with ``--quarantine-url``): quarantine alerts go to the receiver's
  webhook at once (group_wait 0s), grouped by alert and host, resolved ones too (they return the
  host after its warm inference gate); everything else to a receiver named ``default`` that does
  nothing until the operator fills it in.

Thresholds are tunables, per host like the Triton rules: hosts with other values get rules of
their own, restricted by a ``host=~`` matcher.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import yaml

from ..gpu import signals as S
from ..gpu import xids as X
from ..inventory.roster import FleetHost, InventoryError
from .options import Options, duration_seconds
from .prometheus import Generated
from .rule_text import alert, host_regex, number, yaml_file

#: the labels the receiver acts on
QUARANTINE = {"quarantine": "true"}
#: the collector's and the probe's textfiles (node_textfile_mtime_seconds' file label ends so)
TEXTFILES = {"gpu": "tritonfleet-gpu.prom", "probe": "tritonfleet-inference-probe.prom"}
ON = "{{ $labels.host }}"


def enabled(h: FleetHost) -> bool:
    value = h.get("gpu_telemetry")
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def targets(hosts: list[FleetHost], job: str) -> dict[str, list[dict]]:
    """file name under targets/health/ -> file_sd content: every telemetry host's node exporter."""
    out: dict[str, list[dict]] = {}
    seen: dict[str, str] = {}
    for h in hosts:
        if not enabled(h):
            continue
        port = h.get("telemetry_node_exporter_port")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InventoryError(f"{h.name}: telemetry_node_exporter_port = {port!r} is not a port (group data)")
        target = f"{h.get('health_host') or h.address}:{port}"
        if target in seen:
            raise InventoryError(
                f"{h.name}: node exporter {target} is also {seen[target]}'s: set health_host or "
                "ssh_hostname so each host has its own address"
            )
        seen[target] = h.name
        labels = {"host": h.name}
        if h.gpu_class:
            labels["gpu_class"] = h.gpu_class
        if h.group:
            labels["group"] = h.group
        out.setdefault(f"{job}-{h.group or 'ungrouped'}.json", []).append({"targets": [target], "labels": labels})
    return out


def scrape_job(job: str, base: str, interval: str) -> dict:
    return {
        "job_name": f"{job}-health",
        "scrape_interval": interval,
        "scrape_timeout": interval if duration_seconds(interval) < 10 else "10s",
        "metrics_path": "/metrics",
        "params": {"collect[]": ["textfile"]},
        "file_sd_configs": [{"files": [f"{base}/targets/health/{job}-*.json"], "refresh_interval": "1m"}],
    }


def _partition(hosts: list[FleetHost], key: str, check: Callable[[FleetHost, Any], Any]) -> list[tuple[Any, str]]:
    """[(value of ``key``, extra matcher)]: one entry when every telemetry host has the same value,
    else one per value restricted to its hosts. ``check(host, value)`` returns the value to use
    or raises InventoryError."""
    groups: dict[str, tuple[Any, list[str]]] = {}
    for h in hosts:
        value = check(h, h.get(key))
        groups.setdefault(json.dumps(value, sort_keys=True), (value, []))[1].append(h.name)
    if len(groups) <= 1:
        return [(next(iter(groups.values()))[0], "")] if groups else []
    return [(value, f", host=~`{host_regex(names)}`") for value, names in groups.values()]


def _at_least(minimum: float = 0):
    def check(h: FleetHost, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < minimum:
            raise InventoryError(f"{h.name}: {v!r} must be a number >= {minimum:g} (group data)")
        return v

    return check


def _xids(h: FleetHost, v):
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
        raise InventoryError(f"{h.name}: quarantine_xids = {v!r} must be a list of Xid numbers (group data)")
    return sorted(set(v))


#: the quarantine receiver's ``fault_seen`` annotation: when the collector saw the Xid (its own
#: timestamp, seconds since the epoch), so each event's latency is measured from the fault on the
#: host, not from the alert (Prometheus's template ``query``:
#: https://prometheus.io/docs/prometheus/latest/configuration/template_reference/)
FAULT_SEEN = (
    '{{ with printf "max(' + S.XID_LAST + '{host=%q,pci=%q,xid=%q})" $labels.host $labels.pci $labels.xid'
    ' | query }}{{ . | first | value | printf "%.3f" }}{{ end }}'
)


def _alert(name: str, expr: str, summary: str, description: str) -> dict:
    """One alert of the spec (tritonfleet.gpu.signals.ALERTS): its severity, ``for`` and quarantine
    label from there."""
    spec = S.ALERT[name]
    return alert(name, expr, spec.for_, spec.severity, summary, description, QUARANTINE if spec.quarantine else None)


def _alternation(values) -> str:
    return "|".join(str(v) for v in values)


def xid_rules(hosts: list[FleetHost], j: str) -> list[dict]:
    """The Xid alerts, keyed on the ``action`` label the collector writes from NVIDIA's Xid catalog
    (tritonfleet.gpu.signals.XID_ACTIONS says which action raises which alert), the catalog's
    repeated-Xid correlations, and ``quarantine_xids``: Xid numbers that quarantine whatever their
    action (per host, like the other tunables)."""
    catalog = X.read_catalog()
    quarantine = _alternation(S.xid_actions(S.XID_QUARANTINE))
    warning = _alternation(S.xid_actions(S.XID_WARNING))
    support = _alternation(S.xid_actions(S.XID_SUPPORT))
    cancellable = _alternation(sorted({c["xid"] for c in catalog.get("cancels", [])}))
    out = []
    for extra, sel in _partition(hosts, "quarantine_xids", _xids):
        alt = _alternation(extra)
        expr = f'{S.XID_STANDING}{{{j}, action=~"{quarantine}"{sel}}} == 1'
        if extra:
            expr = f'({expr}) or ({S.XID_STANDING}{{{j}, xid=~"{alt}"{sel}}} == 1)'
        out.append(
            _alert(
                "GpuXidCritical",
                expr,
                f"Xid {{{{ $labels.xid }}}} on {ON} (GPU {{{{ $labels.pci }}}}, {{{{ $labels.action }}}}): quarantined",
                "The NVIDIA driver reported an Xid whose recommended immediate action in NVIDIA's Xid catalog takes "
                f"the GPU out of service until it is reset, the machine rebooted or its hardware seen to ({quarantine}; "
                "docs/operations.md). The count is since the kernel's message buffer began (this boot): reset the "
                "GPU or reboot the host, then `tritonfleet quarantine release`. `journalctl -k | grep 'NVRM: Xid'` on "
                "the host shows the driver's words.",
            )
        )
        out[-1]["annotations"]["fault_seen"] = FAULT_SEEN  # each event's clock starts at the fault on the host
        not_extra = f', xid!~"{alt}"' if extra else ""
        recent = f'(time() - {S.XID_LAST}{{{j}, action=~"{warning}"{not_extra}{sel}}}) < 600'
        if cancellable:
            recent = (
                f'({recent}) or ({S.XID_STANDING}{{{j}, action=~"{warning}", xid=~"{cancellable}"'
                f"{not_extra}{sel}}} == 1)"
            )
        out.append(
            _alert(
                "GpuXid",
                f"({recent}) unless on (instance, pci, xid) ({S.XID_STANDING}{{{j}}} == 0)",
                f"Xid {{{{ $labels.xid }}}} on {ON} (GPU {{{{ $labels.pci }}}}, {{{{ $labels.action }}}}) in the last "
                "10 minutes",
                "The NVIDIA driver reported an Xid that NVIDIA's Xid catalog does not take the GPU out of service for "
                "(mostly the application's: restart it; or advice to follow by hand). A model that fails with it is "
                "caught by the inference probe. An Xid the catalog pairs with a later one that cancels it (Power "
                "Smoothing disengaged, then re-engaged) warns until the later one comes.",
            )
        )
    out.append(
        _alert(
            "GpuXidSupport",
            f'{S.XID_STANDING}{{{j}, action=~"{support}"}} == 1',
            f"Xid {{{{ $labels.xid }}}} on {ON} (GPU {{{{ $labels.pci }}}}): NVIDIA's catalog says to contact support",
            "The driver reported an Xid that NVIDIA's Xid catalog lists as unused on current GPUs or whose "
            "recommended action is CONTACT_SUPPORT: collect `nvidia-bug-report.sh` on the host for NVIDIA.",
        )
    )
    for c in catalog.get("correlations", []):
        xid, n, window = c["xid"], c["at_least"], c["within_s"]
        events = f'{S.XID_EVENTS}{{{j}, xid="{xid}"}}'
        out.append(
            _alert(
                "GpuXidRepeated",
                f'({events} >= {n} and on (instance, pci, xid) (time() - {S.XID_LAST}{{{j}, xid="{xid}"}}) < '
                f"{window}) unless on (instance) (count by (instance) ({events}) > 1)",
                f"Xid {xid} repeated on GPU {{{{ $labels.pci }}}} of {ON} ({{{{ $value }}}} distinct reports): quarantined "
                "for diagnostics",
                f"{c['name']} of NVIDIA's Xid catalog: {c['rule']}. The GPU is taken out until `dcgmi diag` (then "
                "field diagnostics) clears it; `tritonfleet quarantine release` returns it.",
            )
        )
    return out


def rules(hosts: list[FleetHost], job: str, interval: str) -> dict:
    """The GPU health rule group (evaluated every ``interval``)."""
    hosts = [h for h in hosts if enabled(h)]
    j = f'job="{job}-health"'
    out: list[dict] = []
    out += xid_rules(hosts, j)
    out.append(
        _alert(
            "GpuEccUncorrectable",
            f'{S.ECC_ERRORS}{{{j}, type="uncorrected", period="volatile"}} > 0',
            f"GPU {{{{ $labels.gpu }}}} on {ON} had {{{{ $value }}}} uncorrectable ECC error(s) since the driver loaded: "
            "quarantined",
            "nvidia-smi's ecc.errors.uncorrected.volatile.total is above 0: double-bit errors are detected but "
            "not corrected (nvidia-smi --help-query-gpu). Reset the GPU or reboot, then release the host.",
        )
    )
    out.append(
        _alert(
            "GpuRowRemapFailure",
            f"{S.REMAPPED_ROWS_FAILURE}{{{j}}} == 1",
            f"GPU {{{{ $labels.gpu }}}} on {ON}: a memory row remapping failed: quarantined",
            "remapped_rows.failure is Yes: the GPU could not remap an unreliable memory row (NVIDIA's GPU memory "
            "error management: Xid 64). The GPU needs a reset and, if it repeats, replacement.",
        )
    )
    out.append(
        _alert(
            "GpuRowRemapPending",
            f"{S.REMAPPED_ROWS_PENDING}{{{j}}} == 1",
            f"GPU {{{{ $labels.gpu }}}} on {ON}: a memory row remapping waits for a GPU reset",
            "remapped_rows.pending is Yes: reset the GPU (or reboot) when convenient to complete it.",
        )
    )
    out.append(
        _alert(
            "GpuRetiredPagesPending",
            f"{S.RETIRED_PAGES_PENDING}{{{j}}} == 1",
            f"GPU {{{{ $labels.gpu }}}} on {ON}: memory pages are pending retirement",
            "retired_pages.pending is Yes: the pages are retired at the next reboot and can still be allocated "
            "until then.",
        )
    )
    out.append(
        _alert(
            "GpuHardwareSlowdown",
            f"max without (reason) ({S.CLOCKS_EVENT_REASON_ACTIVE}{{{j}, "
            f'reason=~"hw_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"}}) == 1',
            f"GPU {{{{ $labels.gpu }}}} on {ON}: hardware slowdown engaged",
            "A hardware slowdown (clocks cut by half or more: temperature too high, or an external power brake) "
            "has been active for 5 minutes (clocks_event_reasons.hw_*).",
        )
    )
    out.append(
        _alert(
            "GpuThermalSlowdown",
            f'{S.CLOCKS_EVENT_REASON_ACTIVE}{{{j}, reason="sw_thermal_slowdown"}} == 1',
            f"GPU {{{{ $labels.gpu }}}} on {ON}: clocks held down by temperature",
            "The software thermal slowdown has been active for 5 minutes: the GPU is hotter than its maximum "
            "operating temperature.",
        )
    )
    for temp, sel in _partition(hosts, "monitor_gpu_temperature_c", _at_least()):
        out.append(
            _alert(
                "GpuTemperatureHigh",
                f"{S.TEMPERATURE}{{{j}{sel}}} > {number(temp)}",
                f"GPU {{{{ $labels.gpu }}}} on {ON} is at {{{{ $value }}}} C",
                f"The GPU's temperature has been above {number(temp)} C (monitor_gpu_temperature_c) for 5 minutes.",
            )
        )
    out.append(
        _alert(
            "GpuPcieLinkDegraded",
            f"(({S.PCIE_WIDTH}{{{j}}} < {S.PCIE_WIDTH_MAX}) or "
            f"({S.PCIE_GENERATION}{{{j}}} < {S.PCIE_GENERATION_MAX})) "
            f'and on (job, instance, gpu) ({S.CLOCKS_EVENT_REASON_ACTIVE}{{{j}, reason="gpu_idle"}} == 0)',
            f"GPU {{{{ $labels.gpu }}}} on {ON}: PCIe link below its maximum while busy",
            "The PCIe link runs narrower or at a lower generation than the GPU and system allow, while the GPU is "
            "not idle (the driver lowers both when idle). Check the card's seating and the slot.",
        )
    )
    out.append(
        _alert(
            "GpuQueryFailing",
            f"{S.QUERY_SUCCESS}{{{j}}} == 0",
            f"nvidia-smi cannot read the GPUs on {ON}",
            "The collector's driver query fails (its journal on the host has nvidia-smi's words: a GPU lost, a "
            "driver/library mismatch after an upgrade, no driver).",
        )
    )
    out.append(
        _alert(
            "GpuKernelLogUnreadable",
            f"{S.KERNEL_LOG_READABLE}{{{j}}} == 0",
            f"The GPU collector on {ON} cannot read the kernel's messages: no Xid is seen",
            "telemetry_kmsg_path cannot be read by tritonfleet-gpu-telemetry (journalctl -u "
            "tritonfleet-gpu-telemetry).",
        )
    )
    out.append(
        _alert(
            "GpuTelemetryDown",
            f"{S.SCRAPE_UP}{{{j}}} == 0",
            f"The node exporter on {ON} does not answer: no GPU telemetry",
            "Prometheus cannot scrape the host's node exporter (telemetry_node_exporter_port).",
        )
    )
    for what, unit in (("gpu", "tritonfleet-gpu-telemetry"), ("probe", "tritonfleet-inference-probe")):
        name = "GpuTelemetryStale" if what == "gpu" else "TritonInferenceProbeStale"
        key = "telemetry_interval" if what == "gpu" else "probe_interval"
        file_re = f".*/{re.escape(TEXTFILES[what])}".replace("\\", "\\\\")
        for interval_s, sel in _partition(hosts, key, _at_least(0.001)):
            limit = max(60.0, 4 * float(interval_s) + 30)
            out.append(
                _alert(
                    name,
                    f'(time() - {S.TEXTFILE_MTIME}{{{j}, file=~"{file_re}"{sel}}} > {number(limit)}) or '
                    f'(({S.SCRAPE_UP}{{{j}{sel}}} == 1) unless on (instance) {S.TEXTFILE_MTIME}{{{j}, file=~"{file_re}"}})',
                    f"{unit} on {ON} has not written its metrics",
                    f"Its textfile ({TEXTFILES[what]}) is older than {number(limit)} s, or missing: the service is "
                    f"stopped or stuck (systemctl status {unit} on the host).",
                )
            )
    out.append(
        _alert(
            "TextfileUnreadable",
            f"{S.TEXTFILE_SCRAPE_ERROR}{{{j}}} == 1",
            f"The node exporter on {ON} cannot read a textfile",
            f"{S.TEXTFILE_SCRAPE_ERROR} is 1: a file in the textfile directory is not valid text format "
            "(the node exporter's log names it).",
        )
    )
    for failures, sel in _partition(hosts, "monitor_probe_failures", _at_least(1)):
        out.append(
            _alert(
                "TritonInferenceProbeFailing",
                f"{S.PROBE_FAILURES}{{{j}{sel}}} >= {number(failures)}",
                f"{{{{ $labels.model }}}} on {ON} (port {{{{ $labels.triton_port }}}}) is ready but its inferences "
                "fail: quarantined",
                f"The inference probe's last {number(failures)} inferences of the model failed in a row "
                "(monitor_probe_failures) while Triton reports it ready. `journalctl -u tritonfleet-inference-probe` "
                "on the host has Triton's answers.",
            )
        )
    for ms, sel in _partition(hosts, "monitor_latency_ms", _at_least()):
        out.append(
            _alert(
                "TritonInferenceProbeSlow",
                f"{S.PROBE_LATENCY}{{{j}{sel}}} > {number(ms / 1000)}",
                f"{{{{ $labels.model }}}} on {ON}: one probe inference takes {{{{ $value }}}} s",
                f"The probe's single inference has taken more than {number(ms)} ms (monitor_latency_ms) for 5 minutes.",
            )
        )
    out.append(
        _alert(
            "TritonInferenceProbeNoAnswer",
            f"{S.PROBE_UP}{{{j}}} == 0",
            f"Triton on {ON} (port {{{{ $labels.triton_port }}}}) does not answer the probe's repository index",
            "The probe cannot list the models (Triton down or restarting, or the API key refused).",
        )
    )
    return {"name": f"{job}.gpu-health", "interval": interval, "rules": out}


ALERTMANAGER_HEADER = (
    "Alertmanager: quarantine alerts to tritonfleet's receiver, with its bearer token\n"
    "(http_config: authorization: credentials_file, the file `tritonfleet quarantine token` wrote;\n"
    "Alertmanager's user must be able to read it). The receiver 'default' has no notifier: every\n"
    "alert that is not a quarantine alert goes nowhere until you give it one (email_configs,\n"
    "webhook_configs, ...) or merge the 'tritonfleet-quarantine' route and receiver into yours."
)


def alertmanager_config(quarantine_url: str, token_file: str, repeat: str = "5m", group_interval: str = "10s") -> dict:
    """An Alertmanager configuration that sends quarantine alerts to the receiver's webhook
    (``<quarantine_url>/alerts``) at once, resolved ones too, with the bearer token of
    ``token_file`` (Alertmanager reads the file on every notification)."""
    return {
        "route": {
            "receiver": "default",
            "group_by": ["alertname", "host"],
            "routes": [
                {
                    "receiver": "tritonfleet-quarantine",
                    "matchers": ['quarantine="true"'],
                    "group_wait": "0s",
                    "group_interval": group_interval,
                    "repeat_interval": repeat,
                    "continue": True,
                }
            ],
        },
        "receivers": [
            {"name": "default"},
            {
                "name": "tritonfleet-quarantine",
                "webhook_configs": [
                    {
                        "url": quarantine_url.rstrip("/") + "/alerts",
                        "send_resolved": True,
                        "http_config": {"authorization": {"type": "Bearer", "credentials_file": token_file}},
                    }
                ],
            },
        ],
    }


def extend(gen: Generated, hosts: list[FleetHost], opts: Options) -> Generated:
    """Add the GPU health files to what tritonfleet.observability.prometheus.generate made (nothing is written
    here): the health targets, scrape job and rules; prometheus.yml with the health job and, with
    ``opts.alertmanager``, its alerting section; with ``opts.quarantine_url``, alertmanager.yml."""
    base = opts.prometheus_dir.rstrip("/") or "."
    files = dict(gen.files)
    sd = targets(hosts if gen.only is None else [h for h in hosts if h.name in gen.only], opts.job)
    for name, entries in sd.items():
        files[f"targets/health/{name}"] = json.dumps(entries, indent=2) + "\n"
    job = scrape_job(opts.job, base, opts.health_interval)
    group = rules(hosts, opts.job, opts.health_interval)
    files[f"scrape-{opts.job}-health.yml"] = yaml_file(
        [job], "Scrape job for GPU health (node exporter textfiles): paste under scrape_configs: in prometheus.yml."
    )
    files[f"rules/{opts.job}-health.rules.yml"] = yaml_file(
        {"groups": [group]}, "GPU health alerts: fault telemetry and the inference probe (rule_files:)."
    )
    config = yaml.safe_load(files["prometheus.yml"])
    if sd:
        config["scrape_configs"].append(job)
    if opts.alertmanager:
        scheme, _, address = opts.alertmanager_url().partition("://")
        config["alerting"] = {
            "alertmanagers": [
                {**({"scheme": scheme} if scheme != "http" else {}), "static_configs": [{"targets": [address]}]}
            ]
        }
    files["prometheus.yml"] = yaml_file(
        config, "A complete Prometheus configuration for the Triton fleet (or merge its parts into yours)."
    )
    if opts.quarantine_url:
        files["alertmanager.yml"] = yaml_file(
            alertmanager_config(opts.quarantine_url, opts.quarantine_token_file), ALERTMANAGER_HEADER
        )
    return dataclasses.replace(gen, files=files, health_rules=group)
