"""Observability on the deployed testbed fleet: a real Prometheus (Debian's), started here on
loopback with the files `tritonfleet prometheus` generates, scrapes every testbed host, counts
inferences, evaluates the rules and answers every dashboard query; Triton stopped on a host
raises TritonDown; `tritonfleet tune` reads the fleet directly and through SSH tunnels.

The server scrapes only this testbed's hosts (10.77.N.x), keeps its data in a temporary
directory and is stopped by its process id.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.integration.observability.test_prometheus import promtool, substitute
from tests.support.testbed import INVENTORY, infer_resnet, ssh, success_count, tritonfleet
from tritonfleet import ROOT
from tritonfleet.observability import dashboard
from tritonfleet.serving import health
from tritonfleet_testbed.ports import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
MODELS = ["resnet50_onnx", "text_classifier_onnx"]
WINDOW = "10s"  # --rate-window: 10 scrapes at 1s


def until(fn, what: str, timeout: float = 90, interval: float = 0.5):
    """Poll ``fn`` until it returns something true; its last answer in the failure message."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            assert value, f"{what}: not so after {timeout}s (last answer: {value!r})"
            return value
        time.sleep(interval)


class Prometheus:
    def __init__(self, config: Path, data: Path, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.http = requests.Session()
        self.http.trust_env = False
        self.cfg = config.parent

    def get(self, path: str, **params) -> dict:
        r = self.http.get(self.url + path, params=params, timeout=10)
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query", query=expr)["result"]

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited: {self.log_path.read_text()[-3000:]}"
        try:
            return self.http.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # its own process id
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        self.http.close()


@pytest.fixture(scope="module")
def prom(deployed, tmp_path_factory):
    testbed, _, _ = deployed
    work = tmp_path_factory.mktemp("prometheus")
    cfg = work / "cfg"
    res = tritonfleet("prometheus", INVENTORY, "--out", str(cfg), "--scrape-interval", "1s",
                      "--rate-window", WINDOW)
    assert res.returncode == 0, res.stderr
    check = promtool("check", "config", str(cfg / "prometheus.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    # it scrapes this testbed's hosts and nothing else
    targets = [t for f in (cfg / "targets").glob("*.json") for e in json.loads(f.read_text())
               for t in e["targets"]]
    assert sorted(targets) == sorted(f"{h.address}:8002" for h in testbed.hosts)
    p = Prometheus(cfg / "prometheus.yml", work / "data", work / "prometheus.log")
    try:
        until(p.ready, "prometheus ready", timeout=60)
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def traffic(deployed):
    """Three resnet inferences on every host; the success counts read straight from each host."""
    testbed, _, _ = deployed
    counts = {}
    for h in testbed.hosts:
        for _ in range(3):
            assert infer_resnet(h.address).shape == (1, 1000)
        counts[h.name] = success_count(h.address, "resnet50_onnx")
    return counts


def test_prometheus_scrapes_every_testbed_host(deployed, prom):
    testbed, _, _ = deployed

    def up():
        active = [t for t in prom.get("/api/v1/targets", state="active")["activeTargets"]
                  if t["labels"]["job"] == "triton"]  # (GPU health's node exporters are not deployed here)
        return active if len(active) == len(testbed.hosts) and all(t["health"] == "up" for t in active) else None

    active = until(up, "every target up")
    seen = sorted((t["labels"]["host"], t["labels"]["gpu_class"], t["labels"]["group"],
                   t["labels"]["instance"], t["labels"]["job"]) for t in active)
    assert seen == sorted((h.name, h.gpu_class.upper(), h.gpu_class.lower(), f"{h.address}:8002", "triton")
                          for h in testbed.hosts)


def test_prometheus_counts_the_inferences(deployed, prom, traffic):
    testbed, _, _ = deployed
    for h in testbed.hosts:
        expr = f'nv_inference_request_success{{job="triton", model="resnet50_onnx", host="{h.name}"}}'

        def counted(expr=expr, want=traffic[h.name]):
            r = prom.query(expr)
            return r if r and float(r[0]["value"][1]) == want else None

        [sample] = until(counted, f"{h.name}: Prometheus counts {traffic[h.name]} requests")
        assert traffic[h.name] >= 3
        labels = sample["metric"]
        assert (labels["version"], labels["gpu_class"], labels["group"]) == (
            "1", h.gpu_class.upper(), h.gpu_class.lower())


def test_rules_evaluate_on_the_fleet(deployed, prom, traffic):
    testbed, _, _ = deployed

    def evaluated():
        groups = prom.get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) else None

    rules = until(evaluated, "every rule evaluated")  # GPU health's too (tests/integration/observability/test_gpu_health_rules.py)
    assert len([r for g in prom.get("/api/v1/rules")["groups"] if g["file"].endswith("/triton.rules.yml")
                for r in g["rules"]]) == 17
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert bad == []
    # the per-model recording rules give a series for every host and model (Triton's real
    # label sets), once rate() has two samples in its window
    want = sorted((h.name, m) for h in testbed.hosts for m in MODELS)

    def recorded():
        got = sorted((s["metric"]["host"], s["metric"]["model"])
                     for s in prom.query(f"triton_model:batch_size:mean{WINDOW}"))
        return got if got == want else None

    until(recorded, "a recorded batch size for every host and model")
    # a healthy fleet: no host down, no model missing
    assert prom.query('ALERTS{alertname=~"TritonDown|TritonModelNotReady"}') == []


def test_every_dashboard_query_runs_on_the_fleet(deployed, prom, traffic):
    testbed, _, _ = deployed
    generated_dashboard = json.loads((prom.cfg / "grafana" / "triton-fleet.json").read_text())
    until(lambda: prom.query(f'sum(nv_inference_request_success{{model="resnet50_onnx"}}) == {sum(traffic.values())}'),
          "the inferences scraped")
    results = {}
    for where, expr in dashboard.queries(generated_dashboard):
        results[where] = prom.query(substitute(expr, window="5m"))
    by_title = {}
    for where, series in results.items():
        by_title.setdefault(where.split("'")[1] if "'" in where else where, []).append(series)
    models = sorted({s["metric"]["model"] for s in by_title["Requests/s"][0]})
    assert models == MODELS
    [batch] = by_title["Batch efficiency"]
    resnet = [float(s["value"][1]) for s in batch if s["metric"]["model"] == "resnet50_onnx"]
    assert resnet and resnet[0] >= 1.0
    queue, compute = by_title["Queue vs compute time per request"]
    assert {s["metric"]["model"] for s in queue} == {s["metric"]["model"] for s in compute} == set(MODELS)
    [up] = by_title["Triton up"]
    assert sorted(s["metric"]["host"] for s in up) == sorted(h.name for h in testbed.hosts)
    assert len(results["variable host"]) == len(testbed.hosts)
    # no GPU behind the testbed's stand-in driver: Triton exports no nv_gpu_* there (the
    # queries still ran; the rule unit tests cover the GPU alerts)
    assert by_title["GPU utilization"] == [[]]


def _ssh_inventory(tmp_path: Path) -> Path:
    """The testbed inventory with health_via = "ssh": Triton's ports read through SSH tunnels."""
    d = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "group_data", d / "group_data")
    (d / "testbed_ssh.py").write_text(
        f"exec(open({str(ROOT / INVENTORY)!r}).read())\n"
        "t4 = [(n, {**d, 'health_via': 'ssh'}) for n, d in t4]\n"
        "l4 = [(n, {**d, 'health_via': 'ssh'}) for n, d in l4]\n")
    return d / "testbed_ssh.py"


def test_tune_reads_the_fleet(deployed, traffic, tmp_path):
    testbed, _, _ = deployed
    direct = {h.name: success_count(h.address, "resnet50_onnx") for h in testbed.hosts}
    for inv in (INVENTORY, str(_ssh_inventory(tmp_path))):
        res = tritonfleet("tune", inv, "--window", "0", "--per-host", "--json", timeout=300)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["errors"] == []
        rows = {(r["name"], r["model"]): r for r in out["rows"]}
        assert sorted(rows) == sorted((h.name, m) for h in testbed.hosts for m in MODELS)
        for h in testbed.hosts:
            r = rows[(h.name, "resnet50_onnx")]
            assert r["requests"] == direct[h.name], inv
            assert r["device"] == "cpu" and r["max_queue_delay_us"] == 5000
            assert r["preferred_batch_size"] == [8, 16, 32, 64]
            assert r["batch_efficiency"] >= 1.0 and r["largest_batch"] >= 1
    # per group (the default): a row per GPU-class group and model, its hosts summed
    res = tritonfleet("tune", INVENTORY, "--window", "0", "--json", "--model", "resnet50_onnx", timeout=300)
    assert res.returncode == 0, res.stderr
    groups = {r["name"]: r for r in json.loads(res.stdout)["rows"]}
    assert sorted(groups) == sorted({h.gpu_class.lower() for h in testbed.hosts})
    for g, r in groups.items():
        members = [h for h in testbed.hosts if h.gpu_class.lower() == g]
        assert sorted(r["hosts"]) == sorted(h.name for h in members)
        assert r["requests"] == sum(direct[h.name] for h in members)


def test_rules_file_names_the_testbed_models(prom):
    rules = yaml.safe_load((prom.cfg / "rules" / "triton.rules.yml").read_text())
    not_ready = [r["labels"]["model"] for g in rules["groups"] for r in g["rules"]
                 if r.get("alert") == "TritonModelNotReady"]
    assert not_ready == MODELS


def test_triton_stopped_on_a_host_raises_triton_down(deployed, prom):
    testbed, _, _ = deployed
    h = testbed.hosts[-1]
    until(lambda: prom.query(f'up{{host="{h.name}"}} == 1'), f"{h.name} up")
    ssh(h, "systemctl stop triton")
    try:
        [alert] = until(lambda: prom.query(f'ALERTS{{alertname="TritonDown", host="{h.name}"}}'),
                        f"TritonDown for {h.name}")
        assert alert["metric"]["alertstate"] in ("pending", "firing")
        assert alert["metric"]["severity"] == "critical"
        others = prom.query('ALERTS{alertname="TritonDown"}')
        assert [a["metric"]["host"] for a in others] == [h.name]
    finally:
        # put the host back: serving, healthy, scraped
        ssh(h, "systemctl start triton")
        res = health.wait_healthy(f"http://{h.address}:8000", f"http://{h.address}:8002", MODELS, timeout=180)
        assert res.ok, res.checks
    until(lambda: prom.query(f'up{{host="{h.name}"}} == 1'), f"{h.name} scraped again")
