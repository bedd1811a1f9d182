"""GPU health in `tritonfleet prometheus` (tritonfleet.observability.gpu_health_rules): the files
pass Debian's promtool and amtool, and every alerting rule fires exactly where intended on
synthetic series of the collector's and the probe's metrics (``promtool test rules``), quarantine
label included; thresholds differing per group get rules of their own."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.observability.test_prometheus import (
    GROUP,
    L4_1,
    PROD,
    T4_1,
    T4_2,
    inventory,
    promtool,
)
from tests.support.forked import forked
from tests.support.testbed import tritonfleet
from tritonfleet.inventory.roster import InventoryError, load_inventory
from tritonfleet.observability import gpu_health_rules as ghr
from tritonfleet.observability import prometheus
from tritonfleet.settings.check import SettingsError

AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
NODE = {T4_1: "192.0.2.11:9100", T4_2: "192.0.2.12:9100", L4_1: "192.0.2.21:9100"}
GPU = {T4_1: ("0", "GPU-t4-01", "00000000:00:1E.0"), T4_2: ("0", "GPU-t4-02", "00000000:00:1E.0"),
       L4_1: ("0", "GPU-l4-01", "00000000:31:00.0")}
TEXTFILES = "/var/lib/prometheus/node-exporter"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("prom-health")
    res = tritonfleet("prometheus", str(PROD), "--out", str(out), "--health-interval", "1m",
                      "--alertmanager", "127.0.0.1:9093", "--quarantine-url", "http://127.0.0.1:9095")
    assert res.returncode == 0, res.stderr
    return out, res


def test_generated_files_pass_promtool_and_amtool(generated):
    out, res = generated
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert {"alertmanager.yml", "rules/triton-health.rules.yml", "scrape-triton-health.yml",
            "targets/health/triton-l4.json", "targets/health/triton-t4.json"} <= set(files)
    check = promtool("check", "config", str(out / "prometheus.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    health = [j for j in config["scrape_configs"] if j["job_name"] == "triton-health"]
    assert health == yaml.safe_load((out / "scrape-triton-health.yml").read_text())
    assert health[0]["params"] == {"collect[]": ["textfile"]} and health[0]["scrape_interval"] == "1m"
    # the Triton job's glob never reaches the node exporters' targets
    triton = [j for j in config["scrape_configs"] if j["job_name"] == "triton"][0]
    assert not list(out.glob(triton["file_sd_configs"][0]["files"][0].removeprefix(str(out) + "/") + "/*"))
    assert not any(p.parent.name == "health" for p in out.glob("targets/triton-*.json"))
    assert config["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}
    am = subprocess.run([AMTOOL, "check-config", str(out / "alertmanager.yml")], capture_output=True, text=True)
    assert am.returncode == 0, am.stdout + am.stderr
    route = yaml.safe_load((out / "alertmanager.yml").read_text())["route"]["routes"][0]
    assert route["matchers"] == ['quarantine="true"'] and route["group_wait"] == "0s"
    t4 = json.loads((out / "targets/health/triton-t4.json").read_text())
    assert t4[0] == {"targets": [NODE[T4_1]], "labels": {"host": T4_1, "gpu_class": "T4", "group": "t4"}}
    assert (f"GPU health: job triton-health (2 target file(s) under targets/health/), {len(EXPECTED)} alerting "
            "rules every 1m, alertmanager.yml") in res.stdout


def _target(host: str, **more: str) -> dict:
    gpu_class, group = GROUP[host]
    return {"job": "triton-health", "instance": NODE[host], "host": host, "gpu_class": gpu_class, "group": group,
            **more}


def _gpu(host: str) -> dict:
    index, uuid, bus = GPU[host]
    return {"gpu": index, "uuid": uuid, "pci_bus_id": bus}


def _s(name: str, labels: dict, values: str) -> dict:
    return {"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def _g(host: str, name: str, values: str, **more: str) -> dict:
    return _s(name, _target(host, **_gpu(host), **more), values)


def _x(host: str, pci: str, xid: int, action: str, standing: str, events: str, last: str) -> list[dict]:
    """An Xid's four series as the collector writes them (every line, distinct events, standing,
    when last logged), with the action NVIDIA's catalog gives it."""
    labels = _target(host, pci=pci, xid=str(xid), action=action)
    return [_s("tritonfleet_gpu_xid_errors_total", labels, events), _s("tritonfleet_gpu_xid_events_total", labels, events),
            _s("tritonfleet_gpu_xid_standing", labels, standing),
            _s("tritonfleet_gpu_xid_last_timestamp_seconds", labels, last)]


def _a(name: str, host: str, severity: str, quarantine: bool = False, gpu: bool = True, **more: str) -> dict:
    labels = {"alertname": name, "severity": severity, **_target(host, **(_gpu(host) if gpu else {})), **more}
    if quarantine:
        labels["quarantine"] = "true"
    return {"exp_labels": labels}


# A fleet at minute 0..40 (1 sample a minute; time() = minutes since 0):
#   t4-01: Xid 79 on its GPU (RESTART_BM: quarantines), an Xid 13 logged at minute 10 (RESTART_APP:
#          warning), an Xid 43 at minute 0 (IGNORE: nothing)
#   t4-02: Xid 31 twice on each of two GPUs (the application's: no escalation), Xid 2 (unused on
#          these GPUs: CONTACT_SUPPORT), Xid 163 at minute 10, cancelled by a 162 at minute 15
#   l4-01: Xid 119 (RESET_GPU: quarantines; it only warned before the catalog), Xid 31 on its one
#          GPU, a second distinct one at minute 10 (WORKFLOW_XID_31: escalates, quarantines)
#   t4-02: an uncorrectable ECC error; its text_classifier fails probe after probe (1, 2, 3...);
#          its probe takes 2 s; hardware thermal slowdown; 90 C; PCIe x8 of x16 while busy
#   l4-01: a failed and a pending row remapping, pages pending retirement, software thermal
#          slowdown; nvidia-smi fails; the kernel log unreadable; a broken textfile; the GPU
#          collector's file stopped at minute 0, the probe's never written; Triton does not answer
#          the probe
PROBE_T4_2 = {"triton_port": "8000", "model": "text_classifier_onnx"}
SERIES = (
    [_s("up", _target(h), "1x40") for h in (T4_1, T4_2, L4_1)]
    + _x(T4_1, "0000:00:1e", 79, "RESTART_BM", "1x40", "1x40", "0x40")
    + _x(T4_1, "0000:00:1e", 13, "RESTART_APP", "1x40", "1x40", "_x10 600x29")
    + _x(T4_1, "0000:00:1e", 43, "IGNORE", "1x40", "1x40", "0x40")
    + _x(T4_2, "0000:00:1e", 31, "RESTART_APP", "1x40", "2x40", "-1000x40")
    + _x(T4_2, "0000:00:1f", 31, "RESTART_APP", "1x40", "2x40", "-1000x40")
    + _x(T4_2, "0000:00:1e", 2, "CONTACT_SUPPORT", "1x40", "1x40", "-1000x40")
    + _x(T4_2, "0000:00:1e", 163, "NONE_GIVEN", "_x10 1x5 0x25", "_x10 1x30", "_x10 600x30")
    + _x(L4_1, "0000:31:00", 119, "RESET_GPU", "1x40", "1x40", "-1000x40")
    + _x(L4_1, "0000:31:00", 31, "RESTART_APP", "1x40", "1x10 2x30", "-1000x10 -500x30")
    + [_g(h, "tritonfleet_gpu_ecc_errors_total", v, type="uncorrected", period="volatile")
       for h, v in ((T4_1, "0x40"), (T4_2, "2x40"), (L4_1, "0x40"))]
    + [_g(h, "tritonfleet_gpu_ecc_errors_total", "5x40", type="corrected", period="volatile") for h in (T4_1, T4_2)]
    + [_g(h, "tritonfleet_gpu_clocks_event_reason_active", "1x40" if (h, r) in {
        (T4_2, "hw_thermal_slowdown"), (L4_1, "sw_thermal_slowdown"), (T4_1, "gpu_idle")} else "0x40", reason=r)
       for h in (T4_1, T4_2, L4_1)
       for r in ("gpu_idle", "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown",
                 "sw_power_cap")]
    + [_g(h, "tritonfleet_gpu_temperature_celsius", v) for h, v in ((T4_1, "40x40"), (T4_2, "90x40"), (L4_1, "60x40"))]
    + [_g(h, "tritonfleet_gpu_pcie_link_width", v) for h, v in ((T4_1, "8x40"), (T4_2, "8x40"), (L4_1, "16x40"))]
    + [_g(h, "tritonfleet_gpu_pcie_link_width_max", "16x40") for h in (T4_1, T4_2, L4_1)]
    + [_g(h, "tritonfleet_gpu_pcie_link_generation", "3x40") for h in (T4_1, T4_2)]
    + [_g(h, "tritonfleet_gpu_pcie_link_generation_max", "3x40") for h in (T4_1, T4_2)]
    + [_g(L4_1, "tritonfleet_gpu_remapped_rows_failure", "1x40"), _g(L4_1, "tritonfleet_gpu_remapped_rows_pending", "1x40"),
       _g(L4_1, "tritonfleet_gpu_retired_pages_pending", "1x40"),
       _g(T4_1, "tritonfleet_gpu_remapped_rows_failure", "0x40")]
    + [_s("tritonfleet_gpu_query_success", _target(h), "0x40" if h == L4_1 else "1x40") for h in (T4_1, T4_2, L4_1)]
    + [_s("tritonfleet_gpu_kernel_log_readable", _target(h), "0x40" if h == L4_1 else "1x40")
       for h in (T4_1, T4_2, L4_1)]
    + [_s("node_textfile_scrape_error", _target(h), "1x40" if h == L4_1 else "0x40") for h in (T4_1, T4_2, L4_1)]
    + [_s("node_textfile_mtime_seconds", _target(h, file=f"{TEXTFILES}/tritonfleet-gpu.prom"),
          "0x40" if h == L4_1 else "0+60x40") for h in (T4_1, T4_2, L4_1)]
    + [_s("node_textfile_mtime_seconds", _target(h, file=f"{TEXTFILES}/tritonfleet-inference-probe.prom"), "0+60x40")
       for h in (T4_1, T4_2)]
    + [_s("tritonfleet_inference_probe_up", _target(h, triton_port="8000"), "0x40" if h == L4_1 else "1x40")
       for h in (T4_1, T4_2, L4_1)]
    + [_s("tritonfleet_inference_probe_consecutive_failures", _target(T4_2, **PROBE_T4_2), "0+1x40"),
       _s("tritonfleet_inference_probe_consecutive_failures",
          _target(T4_1, triton_port="8000", model="resnet50_onnx"), "0x40"),
       _s("tritonfleet_inference_probe_latency_seconds", _target(T4_2, **PROBE_T4_2), "2x40"),
       _s("tritonfleet_inference_probe_latency_seconds", _target(T4_1, triton_port="8000", model="resnet50_onnx"),
          "0.05x40")]
)

# alert -> [(eval time, expected alerts)]
EXPECTED = {
    "GpuXidCritical": [("1m", [
        _a("GpuXidCritical", T4_1, "critical", True, gpu=False, pci="0000:00:1e", xid="79", action="RESTART_BM"),
        _a("GpuXidCritical", L4_1, "critical", True, gpu=False, pci="0000:31:00", xid="119", action="RESET_GPU")])],
    "GpuXid": [("8m", []), ("15m", [
        _a("GpuXid", T4_1, "warning", gpu=False, pci="0000:00:1e", xid="13", action="RESTART_APP"),
        _a("GpuXid", T4_2, "warning", gpu=False, pci="0000:00:1e", xid="163", action="NONE_GIVEN")]),
        ("17m", [_a("GpuXid", T4_1, "warning", gpu=False, pci="0000:00:1e", xid="13", action="RESTART_APP")]),
        ("21m", [])],
    "GpuXidSupport": [("1m", [_a("GpuXidSupport", T4_2, "critical", gpu=False, pci="0000:00:1e", xid="2",
                                 action="CONTACT_SUPPORT")])],
    "GpuXidRepeated": [("5m", []), ("11m", [_a("GpuXidRepeated", L4_1, "critical", True, gpu=False, pci="0000:31:00",
                                               xid="31", action="RESTART_APP")])],
    "GpuEccUncorrectable": [("1m", [_a("GpuEccUncorrectable", T4_2, "critical", True, type="uncorrected",
                                       period="volatile")])],
    "GpuRowRemapFailure": [("1m", [_a("GpuRowRemapFailure", L4_1, "critical", True)])],
    "GpuRowRemapPending": [("1m", [_a("GpuRowRemapPending", L4_1, "warning")])],
    "GpuRetiredPagesPending": [("1m", [_a("GpuRetiredPagesPending", L4_1, "warning")])],
    "GpuHardwareSlowdown": [("4m", []), ("10m", [_a("GpuHardwareSlowdown", T4_2, "warning")])],
    "GpuThermalSlowdown": [("4m", []), ("10m", [_a("GpuThermalSlowdown", L4_1, "warning",
                                                   reason="sw_thermal_slowdown")])],
    "GpuTemperatureHigh": [("4m", []), ("10m", [_a("GpuTemperatureHigh", T4_2, "warning")])],
    # t4-01's link is narrow too, but it is idle (the driver lowers it then)
    "GpuPcieLinkDegraded": [("9m", []), ("15m", [_a("GpuPcieLinkDegraded", T4_2, "warning")])],
    "GpuQueryFailing": [("0m", []), ("2m", [_a("GpuQueryFailing", L4_1, "critical", gpu=False)])],
    "GpuKernelLogUnreadable": [("4m", []), ("10m", [_a("GpuKernelLogUnreadable", L4_1, "warning", gpu=False)])],
    "GpuTelemetryDown": [("10m", [])],
    "GpuTelemetryStale": [("1m", []), ("10m", [_a("GpuTelemetryStale", L4_1, "warning", gpu=False,
                                                  file=f"{TEXTFILES}/tritonfleet-gpu.prom")])],
    "TritonInferenceProbeStale": [("10m", [_a("TritonInferenceProbeStale", L4_1, "warning", gpu=False)])],
    "TextfileUnreadable": [("10m", [_a("TextfileUnreadable", L4_1, "warning", gpu=False)])],
    "TritonInferenceProbeFailing": [("1m", []), ("2m", [_a("TritonInferenceProbeFailing", T4_2, "critical", True,
                                                            gpu=False, **PROBE_T4_2)])],
    "TritonInferenceProbeSlow": [("4m", []), ("10m", [_a("TritonInferenceProbeSlow", T4_2, "warning", gpu=False,
                                                         **PROBE_T4_2)])],
    "TritonInferenceProbeNoAnswer": [("1m", []), ("10m", [_a("TritonInferenceProbeNoAnswer", L4_1, "warning",
                                                             gpu=False, triton_port="8000")])],
}


def _no_annotations(group: dict, dest: Path) -> Path:
    for r in group["rules"]:
        r.pop("annotations", None)
    dest.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False))
    return dest


def _test(tmp_path: Path, rules: Path, series: list, alerts: list, name: str = "health.test.yml") -> subprocess.CompletedProcess:
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}]}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return promtool("test", "rules", str(path))


def test_every_rule_fires_exactly_as_intended(generated, tmp_path):
    group = yaml.safe_load((generated[0] / "rules/triton-health.rules.yml").read_text())["groups"][0]
    assert group["interval"] == "1m"
    names = {r["alert"] for r in group["rules"]}
    assert names == set(EXPECTED), "every rule has a case here"
    quarantining = {r["alert"] for r in group["rules"] if r["labels"].get("quarantine") == "true"}
    assert quarantining == {"GpuXidCritical", "GpuXidRepeated", "GpuEccUncorrectable", "GpuRowRemapFailure",
                            "TritonInferenceProbeFailing"}
    rules = _no_annotations(group, tmp_path / "health.rules.yml")
    alerts = [{"eval_time": at, "alertname": name, "exp_alerts": exp}
              for name, cases in EXPECTED.items() for at, exp in cases]
    res = _test(tmp_path, rules, SERIES, alerts)
    assert res.returncode == 0, res.stdout + res.stderr


def test_telemetry_down_fires_for_a_silent_node_exporter(generated, tmp_path):
    group = yaml.safe_load((generated[0] / "rules/triton-health.rules.yml").read_text())["groups"][0]
    rules = _no_annotations(group, tmp_path / "health.rules.yml")
    series = [_s("up", _target(T4_1), "1 1 0x10"), _s("up", _target(T4_2), "1x12")]
    alerts = [{"eval_time": "3m", "alertname": "GpuTelemetryDown", "exp_alerts": []},
              {"eval_time": "6m", "alertname": "GpuTelemetryDown",
               "exp_alerts": [_a("GpuTelemetryDown", T4_1, "warning", gpu=False)]}]
    res = _test(tmp_path, rules, series, alerts)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_wrong_expectation_fails(generated, tmp_path):
    """The cases above can fail: promtool refuses an alert expected on the wrong host."""
    group = yaml.safe_load((generated[0] / "rules/triton-health.rules.yml").read_text())["groups"][0]
    rules = _no_annotations(group, tmp_path / "health.rules.yml")
    res = _test(tmp_path, rules, SERIES, [{"eval_time": "1m", "alertname": "GpuXidCritical", "exp_alerts": [
        _a("GpuXidCritical", T4_2, "critical", True, gpu=False, pci="0000:00:1e", xid="79", action="RESTART_BM")]}])
    assert res.returncode != 0


def test_annotations_render(generated, tmp_path):
    rules = generated[0] / "rules/triton-health.rules.yml"
    exp = _a("TritonInferenceProbeFailing", T4_2, "critical", True, gpu=False, **PROBE_T4_2)
    exp["exp_annotations"] = {
        "summary": f"text_classifier_onnx on {T4_2} (port 8000) is ready but its inferences fail: quarantined",
        "description": "The inference probe's last 2 inferences of the model failed in a row (monitor_probe_failures) "
                       "while Triton reports it ready. `journalctl -u tritonfleet-inference-probe` on the host has "
                       "Triton's answers."}
    res = _test(tmp_path, rules, SERIES, [{"eval_time": "2m", "alertname": "TritonInferenceProbeFailing",
                                           "exp_alerts": [exp]}])
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_critical_xid_carries_the_collector_s_time_of_the_fault(generated, tmp_path):
    """The quarantine receiver measures each event from the fault on the host: GpuXidCritical's
    ``fault_seen`` annotation is the collector's timestamp of that Xid (Prometheus's template
    ``query``), and nothing when the collector has none."""
    rules = generated[0] / "rules/triton-health.rules.yml"
    fault = _x(T4_1, "0000:00:1e", 79, "RESTART_BM", "1x40", "1x40", "1800000000.25x40")
    exp = _a("GpuXidCritical", T4_1, "critical", True, gpu=False, pci="0000:00:1e", xid="79", action="RESTART_BM")
    group = yaml.safe_load(rules.read_text())["groups"][0]
    notes = next(r for r in group["rules"] if r["alert"] == "GpuXidCritical")["annotations"]
    exp["exp_annotations"] = {**notes, "fault_seen": "1800000000.250"}
    exp["exp_annotations"]["summary"] = f"Xid 79 on {T4_1} (GPU 0000:00:1e, RESTART_BM): quarantined"
    res = _test(tmp_path, rules, fault, [{"eval_time": "1m", "alertname": "GpuXidCritical", "exp_alerts": [exp]}])
    assert res.returncode == 0, res.stdout + res.stderr
    exp["exp_annotations"]["fault_seen"] = ""
    res = _test(tmp_path, rules, fault[:3], [{"eval_time": "1m", "alertname": "GpuXidCritical", "exp_alerts": [exp]}],
                "no-time.test.yml")
    assert res.returncode == 0, res.stdout + res.stderr


def _rules_and_targets(inv: Path) -> tuple[dict, list[str]]:
    """The health rule group and target file names of an inventory (run in a forked child:
    loading an inventory patches the process for gevent, tests/support/forked.py)."""
    hosts = load_inventory(inv)
    return ghr.rules(hosts, "triton", "5s"), list(ghr.targets(hosts, "triton"))


def test_thresholds_per_group_and_telemetry_off(tmp_path):
    """quarantine_xids and monitor_probe_failures set for the L4 group only: a rule of their own,
    restricted to its hosts; a host with gpu_telemetry off is no target."""
    inv = inventory(tmp_path, (PROD.read_text()), {
        "l4.py": "\nquarantine_xids = [43]\nmonitor_probe_failures = 5\n",
        "t4.py": "\n"})
    group, _ = forked(_rules_and_targets, inv)
    xid = [r for r in group["rules"] if r["alert"] == "GpuXidCritical"]
    actions = "CHECK_MECHANICALS|RESET_GPU|RESTART_BM|RESTART_VM|WORKFLOW_NVLINK_ERR|WORKFLOW_XID_48"
    assert sorted(r["expr"] for r in xid) == sorted([
        f'tritonfleet_gpu_xid_standing{{job="triton-health", action=~"{actions}", host=~`{T4_1}|{T4_2}`}} == 1',
        f'(tritonfleet_gpu_xid_standing{{job="triton-health", action=~"{actions}", host=~`{L4_1}`}} == 1) or '
        f'(tritonfleet_gpu_xid_standing{{job="triton-health", xid=~"43", host=~`{L4_1}`}} == 1)'])
    probe = sorted(r["expr"] for r in group["rules"] if r["alert"] == "TritonInferenceProbeFailing")
    assert probe == sorted([
        f'tritonfleet_inference_probe_consecutive_failures{{job="triton-health", host=~`{T4_1}|{T4_2}`}} >= 2',
        f'tritonfleet_inference_probe_consecutive_failures{{job="triton-health", host=~`{L4_1}`}} >= 5'])
    off = inventory(tmp_path / "off", PROD.read_text(), {"l4.py": "\ngpu_telemetry = False\n"})
    group, targets = forked(_rules_and_targets, off)
    assert targets == ["triton-t4.json"]
    assert not [r for r in group["rules"] if L4_1 in r["expr"]]


def _refused(inv: Path) -> str:
    try:
        load_inventory(inv)
    except SettingsError as e:
        return str(e)
    return ""


@pytest.mark.parametrize(("key", "value", "message"), [
    ("quarantine_xids", "79", "quarantine_xids = '79': must be a list of Xid numbers"),
    ("monitor_probe_failures", 0, "monitor_probe_failures = 0: must be a whole number >= 1"),
    ("telemetry_node_exporter_port", 70000,
     "telemetry_node_exporter_port = 70000: must be a whole number from 1 to 65535"),
    ("quarantine_budget", "half", "quarantine_budget = 'half': must be a whole number"),
])
def test_bad_settings_name_the_host(tmp_path, key, value, message):
    """The settings check refuses them when the inventory is loaded (tritonfleet.settings.check),
    naming the host, the setting, where it was set and what it must be."""
    inv = inventory(tmp_path, PROD.read_text(), {"l4.py": f"\n{key} = {value!r}\n"})
    key_value, why = message.split(": ", 1)
    assert f"{L4_1}: {key_value} ({inv.parent}/group_data/l4.py): {why}" in forked(_refused, inv)


def _extend_with(inv: Path, out: Path, host: int, key: str, value: object) -> str:
    hosts = load_inventory(inv)
    hosts[host].data[key] = value
    opts = prometheus.Options(prometheus_dir=str(out))
    try:
        ghr.extend(prometheus.generate(hosts, opts), hosts, opts)
    except InventoryError as e:
        return str(e)
    return ""


def test_the_rules_refuse_what_the_settings_check_would(tmp_path):
    """Hosts built without the check (a program of its own) still get no rule of a bad value."""
    msg = forked(_extend_with, inventory(tmp_path, PROD.read_text()), tmp_path, -1, "quarantine_xids", "79")
    assert msg == f"{L4_1}: quarantine_xids = '79' must be a list of Xid numbers (group data)"


def test_regeneration_removes_health_targets_of_groups_that_are_gone(tmp_path):
    out = tmp_path / "out"
    assert tritonfleet("prometheus", str(PROD), "--out", str(out)).returncode == 0
    assert (out / "targets/health/triton-l4.json").exists()
    t4_only = inventory(tmp_path / "t4", PROD.read_text().split("\nl4 = [")[0] + "\n")
    res = tritonfleet("prometheus", str(t4_only), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert not (out / "targets/health/triton-l4.json").exists() and (out / "targets/health/triton-t4.json").exists()


def test_limit_changes_only_the_named_hosts_health_targets(tmp_path):
    """--limit: the named hosts' node exporter entries are rewritten, every other host's stays as
    it was (here: all hosts' port changed in the inventory, only t4's entries follow)."""
    out = tmp_path / "out"
    assert tritonfleet("prometheus", str(PROD), "--out", str(out)).returncode == 0
    moved = inventory(tmp_path / "moved", PROD.read_text(), {"all.py": "\ntelemetry_node_exporter_port = 9101\n"})
    res = tritonfleet("prometheus", str(moved), "--out", str(out), "--limit", "t4")
    assert res.returncode == 0, res.stderr
    ports = {name: sorted(e["targets"][0].rsplit(":", 1)[1] for e in json.loads((out / "targets/health" / name).read_text()))
             for name in ("triton-t4.json", "triton-l4.json")}
    assert ports == {"triton-t4.json": ["9101", "9101"], "triton-l4.json": ["9100"]}


