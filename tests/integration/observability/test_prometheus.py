"""``tritonfleet prometheus``: the generated files pass Debian's promtool, and the alerting and
recording rules fire as intended on synthetic series (``promtool test rules``), GPU ones
included. The real Prometheus scraping the testbed is in testbed/test_observability.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.forked import forked
from tests.support.testbed import tritonfleet
from tritonfleet import ROOT
from tritonfleet.inventory import roster
from tritonfleet.inventory.roster import FleetError
from tritonfleet.observability import dashboard, prometheus
from tritonfleet.settings.table import read

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROD = ROOT / "inventories" / "prod.py"
T4_1, T4_2, L4_1 = "triton-t4-01", "triton-t4-02", "triton-l4-01"
INSTANCE = {T4_1: "192.0.2.11:8002", T4_2: "192.0.2.12:8002", L4_1: "192.0.2.21:8002"}
GROUP = {T4_1: ("T4", "t4"), T4_2: ("T4", "t4"), L4_1: ("L4", "l4")}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def inventory(tmp_path: Path, body: str, group_data: dict[str, str] | None = None) -> Path:
    """An inventory file in a directory of its own, with the project's group_data next to it
    (``group_data``: lines appended to some of its files)."""
    d = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "group_data", d / "group_data")
    for name, extra in (group_data or {}).items():
        f = d / "group_data" / name
        f.write_text(f.read_text() + extra)
    (d / "fleet.py").write_text(body)
    return d / "fleet.py"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("prom")
    res = tritonfleet("prometheus", str(PROD), "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out, res


def test_generated_files_pass_promtool(generated):
    out, res = generated
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        ".tritonfleet-prometheus.json", "grafana/triton-fleet.json", "prometheus.yml",
        "rules/triton-health.rules.yml", "rules/triton.rules.yml", "scrape-triton-health.yml", "scrape-triton.yml",
        "targets/health/triton-l4.json", "targets/health/triton-t4.json", "targets/triton-l4.json",
        "targets/triton-t4.json"]
    # check config reads the rule files and every file_sd file the job's glob matches
    check = promtool("check", "config", str(out / "prometheus.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 17 rules found" in check.stdout + check.stderr
    rules = promtool("check", "rules", str(out / "rules/triton.rules.yml"))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    # the snippet is the job of the complete configuration, with absolute paths to DIR
    job = yaml.safe_load((out / "scrape-triton.yml").read_text())
    assert job == yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"][:1]  # then GPU health's
    assert job[0]["file_sd_configs"][0]["files"] == [f"{out}/targets/triton-*.json"]
    assert "3 targets (t4 2, l4 1), 9 recording and 8 alerting rules" in res.stdout


def test_targets_carry_host_gpu_class_and_group(generated):
    out, _ = generated
    t4 = json.loads((out / "targets/triton-t4.json").read_text())
    assert t4 == [
        {"targets": ["192.0.2.11:8002"], "labels": {"host": T4_1, "gpu_class": "T4", "group": "t4"}},
        {"targets": ["192.0.2.12:8002"], "labels": {"host": T4_2, "gpu_class": "T4", "group": "t4"}},
    ]
    l4 = json.loads((out / "targets/triton-l4.json").read_text())
    assert l4 == [{"targets": ["192.0.2.21:8002"], "labels": {"host": L4_1, "gpu_class": "L4", "group": "l4"}}]


def test_promtool_refuses_a_broken_target_file(generated, tmp_path):
    """The promtool check above can fail: it reads the target files."""
    out = tmp_path / "copy"
    shutil.copytree(generated[0], out)
    text = (out / "prometheus.yml").read_text().replace(str(generated[0]), str(out))
    (out / "prometheus.yml").write_text(text)
    assert promtool("check", "config", str(out / "prometheus.yml")).returncode == 0
    (out / "targets/triton-l4.json").write_text('[{"targets": ["x:1"], "labels": {"0bad": "v"}}]')
    check = promtool("check", "config", str(out / "prometheus.yml"))
    assert check.returncode != 0 and "0bad" in check.stdout + check.stderr


# ---- the rules on synthetic series -------------------------------------------------------------

def _labels(host: str, **more: str) -> str:
    gpu_class, group = GROUP[host]
    labels = {"job": "triton", "instance": INSTANCE[host], "host": host, "gpu_class": gpu_class,
              "group": group, **more}
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _model(host: str, model: str, per_min: int, request_ms: float, queue_ms: float,
           compute_ms: tuple[float, float, float], batch: int, failures: int = 0) -> list[dict]:
    """Counter series of one model growing at a steady rate (per minute)."""
    lab = _labels(host, model=model, version="1")
    inp, inf, outp = compute_ms
    series = [
        ("nv_inference_request_success", per_min),
        ("nv_inference_request_duration_us", per_min * request_ms * 1000),
        ("nv_inference_queue_duration_us", per_min * queue_ms * 1000),
        ("nv_inference_compute_input_duration_us", per_min * inp * 1000),
        ("nv_inference_compute_infer_duration_us", per_min * inf * 1000),
        ("nv_inference_compute_output_duration_us", per_min * outp * 1000),
        ("nv_inference_count", per_min),
        ("nv_inference_exec_count", per_min // batch),
    ]
    out = [{"series": f"{name}{lab}", "values": f"0+{v:g}x40"} for name, v in series]
    for reason, n in (("BACKEND", failures), ("REJECTED", 0)):
        out.append({"series": f"nv_inference_request_failure{_labels(host, model=model, version='1', reason=reason)}",
                    "values": f"0+{n}x40"})
    return out


def _gpu(host: str, util: float, used: float, total: float = 16e9) -> list[dict]:
    lab = _labels(host, gpu_uuid=f"GPU-{host}")
    return [{"series": f"nv_gpu_utilization{lab}", "values": f"{util}x40"},
            {"series": f"nv_gpu_memory_used_bytes{lab}", "values": f"{used:g}x40"},
            {"series": f"nv_gpu_memory_total_bytes{lab}", "values": f"{total:g}x40"}]


def _alert(name: str, host: str, severity: str = "warning", **more: str) -> dict:
    gpu_class, group = GROUP[host]
    return {"exp_labels": {"alertname": name, "severity": severity, "job": "triton",
                           "instance": INSTANCE[host], "host": host, "gpu_class": gpu_class,
                           "group": group, **more}}


def _no_annotations(rules_path: Path, dest: Path) -> Path:
    data = yaml.safe_load(rules_path.read_text())
    for g in data["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


# Fleet of the prod inventory at t=20m:
#   t4-01: healthy resnet (GPU 90% busy, batches of 4); text_classifier fails 25% and is slow
#   t4-02: text_classifier not loaded; resnet queue 50 ms >> compute 10 ms on a GPU 20% busy;
#          GPU memory 97% full
#   l4-01: down
SERIES = (
    [{"series": f"up{_labels(T4_1)}", "values": "1x40"},
     {"series": f"up{_labels(T4_2)}", "values": "1x40"},
     {"series": f"up{_labels(L4_1)}", "values": "0x40"}]
    + _model(T4_1, "resnet50_onnx", 60, 20, 5, (1, 13, 1), batch=4)
    + _model(T4_1, "text_classifier_onnx", 30, 1500, 200, (1, 1298, 1), batch=1, failures=10)
    + _model(T4_2, "resnet50_onnx", 60, 60, 50, (1, 8, 1), batch=1)
    + _gpu(T4_1, 0.9, 14e9) + _gpu(T4_2, 0.2, 15.5e9)
)

EXPECTED_ALERTS = {
    "TritonDown": [_alert("TritonDown", L4_1, "critical")],
    "TritonModelNotReady": [_alert("TritonModelNotReady", T4_2, "critical", model="text_classifier_onnx")],
    "TritonModelFailures": [_alert("TritonModelFailures", T4_1, model="text_classifier_onnx", version="1")],
    "TritonModelSlow": [_alert("TritonModelSlow", T4_1, model="text_classifier_onnx", version="1")],
    "TritonQueueDominates": [_alert("TritonQueueDominates", T4_2, model="resnet50_onnx", version="1")],
    "TritonQueueWhileGpuIdle": [_alert("TritonQueueWhileGpuIdle", T4_2, model="resnet50_onnx", version="1")],
    "TritonGpuMemoryNearFull": [_alert("TritonGpuMemoryNearFull", T4_2, gpu_uuid=f"GPU-{T4_2}")],
}


def _run_rule_tests(tmp_path: Path, rules: Path, series: list, alerts: list, exprs: list) -> None:
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "alert_rule_test": alerts, "promql_expr_test": exprs}]}
    path = tmp_path / "rules.test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    res = promtool("test", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_alerts_fire_as_intended(generated, tmp_path):
    rules = _no_annotations(generated[0] / "rules/triton.rules.yml", tmp_path / "rules.yml")
    alert_names = {r["alert"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]
                   if "alert" in r}
    assert alert_names == set(EXPECTED_ALERTS)
    alerts = [{"eval_time": "20m", "alertname": name, "exp_alerts": exp}
              for name, exp in EXPECTED_ALERTS.items()]
    # before their `for:` has passed none fires
    alerts += [{"eval_time": "1m", "alertname": name, "exp_alerts": []} for name in EXPECTED_ALERTS]
    t41 = _labels(T4_1, model="resnet50_onnx", version="1")
    exprs = [
        {"expr": f"triton_model:batch_size:mean5m{t41}", "eval_time": "20m",
         "exp_samples": [{"labels": f"triton_model:batch_size:mean5m{t41}", "value": 4}]},
        {"expr": f"triton_model:compute_duration_us:mean5m{t41}", "eval_time": "20m",
         "exp_samples": [{"labels": f"triton_model:compute_duration_us:mean5m{t41}", "value": 15000}]},
        {"expr": f"triton_model:queue_duration_us:mean5m{t41}", "eval_time": "20m",
         "exp_samples": [{"labels": f"triton_model:queue_duration_us:mean5m{t41}", "value": 5000}]},
        {"expr": "triton_model:failure_ratio:rate5m{model='text_classifier_onnx'}", "eval_time": "20m",
         "exp_samples": [{"labels": "triton_model:failure_ratio:rate5m"
                          + _labels(T4_1, model="text_classifier_onnx", version="1"), "value": 0.25}]},
        {"expr": "triton_host:gpu_utilization:avg5m", "eval_time": "20m",
         "exp_samples": [{"labels": f"triton_host:gpu_utilization:avg5m{_labels(T4_1)}", "value": 0.9},
                         {"labels": f"triton_host:gpu_utilization:avg5m{_labels(T4_2)}", "value": 0.2}]},
    ]
    _run_rule_tests(tmp_path, rules, SERIES, alerts, exprs)


def test_a_wrong_expectation_fails(generated, tmp_path):
    """promtool test rules does fail when an alert does not fire as expected."""
    rules = _no_annotations(generated[0] / "rules/triton.rules.yml", tmp_path / "rules.yml")
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": SERIES, "alert_rule_test": [
            {"eval_time": "20m", "alertname": "TritonDown", "exp_alerts": [_alert("TritonDown", T4_1, "critical")]}]}]}
    path = tmp_path / "wrong.test.yml"
    path.write_text(yaml.safe_dump(spec))
    assert promtool("test", "rules", str(path)).returncode != 0


def test_annotations_render(generated, tmp_path):
    rules = generated[0] / "rules/triton.rules.yml"
    failing = _alert("TritonModelFailures", T4_1, model="text_classifier_onnx", version="1")
    failing["exp_annotations"] = {
        "summary": f"text_classifier_onnx fails 25% of requests on {T4_1} ({INSTANCE[T4_1]})",
        "description": "More than 5% of the model's requests failed over 5m "
                       "(nv_inference_request_failure by reason)."}
    _run_rule_tests(tmp_path, rules, SERIES, [
        {"eval_time": "20m", "alertname": "TritonModelFailures", "exp_alerts": [failing]}], [])


def test_per_group_thresholds_get_their_own_rules(tmp_path):
    """A tunable set per group (here a tighter latency bound on T4) gives each value its own
    rule restricted to its hosts; both fire only where their own threshold is crossed."""
    inv = inventory(tmp_path, PROD.read_text(), {"t4.py": "monitor_latency_ms = 50\n"})
    out = tmp_path / "out"
    res = tritonfleet("prometheus", str(inv), "--out", str(out))
    assert res.returncode == 0, res.stderr
    data = yaml.safe_load((out / "rules/triton.rules.yml").read_text())
    slow = [r["expr"] for g in data["groups"] for r in g["rules"] if r.get("alert") == "TritonModelSlow"]
    assert slow == [
        'triton_model:request_duration_us:mean5m{job="triton", host=~`triton-t4-01|triton-t4-02`} > 50000',
        'triton_model:request_duration_us:mean5m{job="triton", host=~`triton-l4-01`} > 1000000',
    ]
    # each of the two rules carries its threshold as a label: promtool's lint finds no duplicate
    # (two rules of one name with the same labels), which it reported before
    labels = [r["labels"] for g in data["groups"] for r in g["rules"] if r.get("alert") == "TritonModelSlow"]
    assert labels == [{"severity": "warning", "monitor_latency_ms": "50"},
                      {"severity": "warning", "monitor_latency_ms": "1000"}]
    lint = promtool("check", "rules", str(out / "rules/triton.rules.yml"))
    assert lint.returncode == 0 and "duplicate" not in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    series = (_model(T4_2, "resnet50_onnx", 60, 60, 5, (1, 53, 1), batch=1)
              + [{"series": f"up{_labels(L4_1)}", "values": "1x40"}]
              + _model(L4_1, "resnet50_onnx", 60, 60, 5, (1, 53, 1), batch=1))
    rules = _no_annotations(out / "rules/triton.rules.yml", tmp_path / "rules.yml")
    _run_rule_tests(tmp_path, rules, series, [{
        "eval_time": "20m", "alertname": "TritonModelSlow",
        "exp_alerts": [_alert("TritonModelSlow", T4_2, model="resnet50_onnx", version="1",
                                                  monitor_latency_ms="50")]}], [])


# ---- regeneration and errors -------------------------------------------------------------------

def test_regeneration_removes_groups_that_are_gone(tmp_path):
    out = tmp_path / "out"
    assert tritonfleet("prometheus", str(PROD), "--out", str(out)).returncode == 0
    t4_only = inventory(tmp_path, PROD.read_text().split("\nl4 = [")[0] + "\n")
    assert "triton-l4" not in t4_only.read_text() and "triton-t4-02" in t4_only.read_text()
    res = tritonfleet("prometheus", str(t4_only), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (out / "targets").iterdir() if p.is_file()) == ["triton-t4.json"]
    assert "removed" in res.stdout and "triton-l4.json" in res.stdout


def _entries(out: Path) -> dict[str, list[dict]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((out / "targets").glob("*.json"))}


def test_limit_updates_only_the_named_hosts_and_keeps_every_other_host_monitored(tmp_path):
    """--limit used to write the named group's file with only its hosts and delete the other
    groups' files, "no longer in the inventory": those hosts stopped being monitored."""
    out = tmp_path / "out"
    assert tritonfleet("prometheus", str(PROD), "--out", str(out)).returncode == 0
    before = _entries(out)
    res = tritonfleet("prometheus", str(PROD), "--out", str(out), "--limit", "t4")
    assert res.returncode == 0, res.stderr
    assert _entries(out) == before and "removed" not in res.stdout
    # one host of a group moves: its entry alone changes, its group's other host stays
    moved = inventory(tmp_path, PROD.read_text().replace('"192.0.2.12"', '"198.51.100.12"'))
    res = tritonfleet("prometheus", str(moved), "--out", str(out), "--limit", T4_2)
    assert res.returncode == 0, res.stderr
    after = _entries(out)
    assert after["triton-l4.json"] == before["triton-l4.json"]
    assert [e["targets"] for e in after["triton-t4.json"]] == [["192.0.2.11:8002"], ["198.51.100.12:8002"]]


def test_a_file_it_did_not_write_is_never_replaced_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    own = "# my own Prometheus configuration\nscrape_configs: []\n"
    (out / "prometheus.yml").write_text(own)
    res = tritonfleet("prometheus", str(PROD), "--out", str(out))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{out}/prometheus.yml" in res.stderr and "--force" in res.stderr and "nothing was written" in res.stderr
    assert (out / "prometheus.yml").read_text() == own and sorted(p.name for p in out.iterdir()) == ["prometheus.yml"]
    # a generated file edited since is the operator's now: kept the same way
    res = tritonfleet("prometheus", str(PROD), "--out", str(out), "--force")
    assert res.returncode == 0 and f"replaced {out}/prometheus.yml" in res.stdout, res.stderr
    (out / "rules/triton.rules.yml").write_text((out / "rules/triton.rules.yml").read_text() + "# tuned by hand\n")
    res = tritonfleet("prometheus", str(PROD), "--out", str(out))
    assert res.returncode == 2 and "rules/triton.rules.yml" in res.stderr
    assert (out / "rules/triton.rules.yml").read_text().endswith("# tuned by hand\n")


def test_a_target_file_it_did_not_write_is_never_removed(tmp_path):
    out = tmp_path / "out"
    assert tritonfleet("prometheus", str(PROD), "--out", str(out)).returncode == 0
    extra = [{"targets": ["203.0.113.9:8002"], "labels": {"host": "by-hand"}}]
    (out / "targets/triton-manual.json").write_text(json.dumps(extra))
    res = tritonfleet("prometheus", str(PROD), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "targets/triton-manual.json").read_text()) == extra
    assert "triton-manual.json: not written by tritonfleet prometheus" in res.stderr and "kept" in res.stderr


GROUPS = ["t4", "l4", "edge"]
inventories_ = st.lists(st.tuples(st.sampled_from(GROUPS), st.integers(1, 250)), min_size=1, max_size=6,
                        unique_by=lambda t: t[1])


def _write_inventory(path: Path, hosts: list[tuple[str, int]]) -> None:
    lines = [f"{g} = [" + ", ".join(f'("h{n}", {{"ssh_hostname": "192.0.2.{n}"}})' for gg, n in hosts if gg == g) + "]"
             for g in GROUPS if any(gg == g for gg, _ in hosts)]
    path.write_text("\n".join(lines) + "\n")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=inventories_, second=inventories_, data=st.data())
def test_generated_runs_keep_foreign_files_and_every_host_monitored(tmp_path_factory, first, second, data):
    """A full run, then a second run over a changed inventory, with or without --limit, beside
    foreign files: every foreign file keeps its bytes; after a full run every host of the
    inventory has exactly one entry; after a --limit run the named hosts have theirs as the
    inventory says and every other host keeps the entry the first run gave it."""
    tmp = tmp_path_factory.mktemp("gen")
    out, inv = tmp / "out", tmp / "fleet.py"
    (tmp / "models").mkdir()
    (tmp / "models" / "m").mkdir()
    foreign = {"notes.txt": b"mine\n", "targets/other-job.json": b"[]\n", "targets/triton-manual.json": b"[]\n"}
    for rel, content in foreign.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(content)

    def generate_and_write(limit):
        fhs = roster.load_inventory(inv, data={"model_repository": str(tmp / "models")})
        only = {h.name for h in roster.select(fhs, limit, str(inv))} if limit else None
        prometheus.write(prometheus.generate(fhs, prometheus.Options(prometheus_dir=str(out)), only), out)

    def run(hosts, limit=None):
        _write_inventory(inv, hosts)
        forked(generate_and_write, limit)  # tests/support/forked.py: loading an inventory patches for gevent

    def hosts_in_files() -> list[tuple[str, str, str]]:
        return sorted((p.name, e["labels"]["host"], e["targets"][0]) for p in (out / "targets").glob("triton-*.json")
                      if p.name != "triton-manual.json" for e in json.loads(p.read_text()))

    def expected(hosts) -> list[tuple[str, str, str]]:
        return sorted((f"triton-{g}.json", f"h{n}", f"192.0.2.{n}:8002") for g, n in hosts)

    run(first)
    assert hosts_in_files() == expected(first)
    limit = data.draw(st.none() | st.lists(st.sampled_from([f"h{n}" for _, n in second]), min_size=1, unique=True))
    run(second, limit)
    if limit is None:
        assert hosts_in_files() == expected(second)
    else:
        named = set(limit)
        want = sorted([e for e in expected(first) if e[1] not in named]
                      + [e for e in expected(second) if e[1] in named])
        assert hosts_in_files() == want
    for rel, content in foreign.items():
        assert (out / rel).read_bytes() == content, rel


def test_missing_model_repository_names_the_host_and_the_fix(tmp_path):
    inv = inventory(tmp_path, 'gpu = [("node-a", {"ssh_hostname": "192.0.2.5", '
                              '"model_repository": "/nonexistent/repo"})]\n')
    out = tmp_path / "out"
    res = tritonfleet("prometheus", str(inv), "--out", str(out))
    assert res.returncode == 2  # bad input, as every command's
    assert "node-a: model_repository /nonexistent/repo is not a directory" in res.stderr
    assert "set model_repository in group data" in res.stderr
    assert not out.exists()  # nothing written


def test_two_hosts_on_one_endpoint_are_refused(tmp_path):
    inv = inventory(tmp_path, 'gpu = [("a", {"ssh_hostname": "192.0.2.5"}), ("b", {"ssh_hostname": "192.0.2.5"})]\n')
    res = tritonfleet("prometheus", str(inv), "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and "b: metrics endpoint 192.0.2.5:8002 is also a's" in res.stderr


def test_address_and_port_come_from_the_tunables(tmp_path):
    inv = inventory(tmp_path, 'gpu = [("a", {"ssh_hostname": "192.0.2.5", "health_host": "198.51.100.7", '
                              '"triton_metrics_port": 9102, "triton_metrics_bind": "127.0.0.1"})]\n')
    out = tmp_path / "out"
    res = tritonfleet("prometheus", str(inv), "--out", str(out))
    assert res.returncode == 0, res.stderr
    # no gpu_class in this inventory: no such label
    assert json.loads((out / "targets/triton-gpu.json").read_text()) == [
        {"targets": ["198.51.100.7:9102"], "labels": {"host": "a", "group": "gpu"}}]
    assert "warning: a: triton_metrics_bind=127.0.0.1: the metrics port listens on loopback only" in res.stderr


@pytest.mark.parametrize(("opts", "message"), [
    (prometheus.Options(rate_window="30s"), "at least 4 scrape intervals"),
    (prometheus.Options(scrape_interval="15 s"), "not a Prometheus duration"),
    (prometheus.Options(job="tri ton"), "letters, digits"),
])
def test_bad_options_are_refused(opts, message):
    with pytest.raises(FleetError, match=message):
        opts.check()


# ---- the dashboard -----------------------------------------------------------------------------

def substitute(expr: str, window: str = "1m") -> str:
    for var in dashboard.VARIABLES:
        expr = expr.replace(var, window if var == "$__rate_interval" else ".*")
    assert "$" not in expr, expr
    return expr


def test_dashboard_queries_parse(generated, tmp_path):
    dash = json.loads((generated[0] / "grafana/triton-fleet.json").read_text())
    qs = dashboard.queries(dash)
    assert len(qs) >= 15
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": substitute(expr)} for i, (_, expr) in enumerate(qs)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    res = promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    # and promtool does refuse a query that does not parse
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"record": "x:y", "expr": substitute(qs[0][1]).replace(")", "", 1)}]}]}))
    assert promtool("check", "rules", str(path)).returncode != 0


def test_dashboard_structure(generated):
    dash = json.loads((generated[0] / "grafana/triton-fleet.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in dash["panels"]}
    assert {"Requests/s", "Queue vs compute time per request", "Batch efficiency",
            "GPU utilization", "GPU memory used"} <= titles
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']} overlaps another"
                cells.add((x, y))
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["targets"] and all(t["refId"] and t["expr"] for t in p["targets"])
    variables = [v["name"] for v in dash["templating"]["list"]]
    assert variables == ["datasource", "group", "host", "model"]
    by_title = {p["title"]: p for p in dash["panels"]}
    exprs = [t["expr"] for t in by_title["Batch efficiency"]["targets"]]
    assert "nv_inference_count" in exprs[0] and "nv_inference_exec_count" in exprs[0]
    queue = [t["legendFormat"] for t in by_title["Queue vs compute time per request"]["targets"]]
    assert queue == ["{{model}} queue", "{{model}} compute"]


def test_monitoring_tunables_are_documented():
    names = {n for n, _, _ in read()}
    used = set()
    for mod in ("metrics.py", "prometheus.py", "tune.py"):
        text = (ROOT / "tritonfleet" / "observability" / mod).read_text()
        used |= set(re.findall(r'\b(?:fh|h)\.get\(["\']([a-z0-9_]+)["\']\)', text))  # an inventory host's tunable
        used |= set(re.findall(r'"(monitor_[a-z0-9_]+)"', text))
    assert {"triton_metrics_port", "health_host", "monitor_latency_ms", "monitor_busy_utilization"} <= used
    assert used <= names, sorted(used - names)


# ---- the quarantine wiring: Alertmanager, its webhook's token ----------------------------------

AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"


def test_a_quarantine_url_without_alertmanager_is_refused(tmp_path):
    """Without --alertmanager prometheus.yml has no alerting section: nothing would ever be
    quarantined, so the command refuses (exit 2) and writes nothing."""
    out = tmp_path / "out"
    res = tritonfleet("prometheus", str(PROD), "--out", str(out), "--quarantine-url", "http://127.0.0.1:9095")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--quarantine-url without --alertmanager" in res.stderr and "add --alertmanager HOST:PORT" in res.stderr
    assert not out.exists()


@pytest.mark.parametrize(("given", "scheme", "target"), [
    ("127.0.0.1:9093", None, "127.0.0.1:9093"), ("http://127.0.0.1:9093", None, "127.0.0.1:9093"),
    ("https://am.internal:9443/", "https", "am.internal:9443")])
def test_alertmanager_takes_host_port_or_a_url_and_the_webhook_sends_the_token(tmp_path, given, scheme, target):
    out = tmp_path / "out"
    res = tritonfleet("prometheus", str(PROD), "--out", str(out), "--alertmanager", given,
                      "--quarantine-url", "http://127.0.0.1:9095", "--quarantine-token-file", "/etc/am/q.token")
    assert res.returncode == 0, res.stderr
    alerting = yaml.safe_load((out / "prometheus.yml").read_text())["alerting"]["alertmanagers"][0]
    assert alerting.get("scheme") == scheme and alerting["static_configs"] == [{"targets": [target]}]
    assert promtool("check", "config", str(out / "prometheus.yml")).returncode == 0
    text = (out / "alertmanager.yml").read_text()
    hook = yaml.safe_load(text)["receivers"][1]["webhook_configs"][0]
    assert hook["http_config"] == {"authorization": {"type": "Bearer", "credentials_file": "/etc/am/q.token"}}
    assert "The receiver 'default' has no notifier" in text
    am = subprocess.run([AMTOOL, "check-config", str(out / "alertmanager.yml")], capture_output=True, text=True)
    assert am.returncode == 0, am.stdout + am.stderr


def test_the_token_file_defaults_to_the_inventorys(tmp_path):
    out = tmp_path / "out"
    res = tritonfleet("prometheus", str(PROD), "--out", str(out), "--alertmanager", "127.0.0.1:9093",
                      "--quarantine-url", "http://127.0.0.1:9095")
    assert res.returncode == 0, res.stderr
    hook = yaml.safe_load((out / "alertmanager.yml").read_text())["receivers"][1]["webhook_configs"][0]
    assert hook["http_config"]["authorization"]["credentials_file"] == "/etc/tritonfleet/quarantine.token"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_one_function_reads_alertmanager_addresses(value):
    """Every --alertmanager (prometheus and quarantine serve) goes through alertmanager_url: an
    address it takes comes back as http(s)://HOST:PORT, and reading that again changes nothing."""
    from tritonfleet.core.errors import UsageError
    from tritonfleet.observability.options import alertmanager_url

    try:
        url = alertmanager_url(value)
    except UsageError as e:
        assert "expected HOST:PORT or http(s)://HOST:PORT" in str(e)
        return
    assert re.match(r"^https?://[^/\s]+:[0-9]+$", url) and alertmanager_url(url) == url
    assert alertmanager_url(url.split("://", 1)[1]) == url.replace("https://", "http://")
