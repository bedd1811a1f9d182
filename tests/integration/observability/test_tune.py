"""``tritonfleet tune``: the advice rules on given figures, and the whole command against a real
tritonserver (the nvidia-pytriton binary on loopback) under a generated load."""

from __future__ import annotations

import ast
import json
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.support.testbed import tritonfleet
from tests.support.tritonproc import copy_repository
from tritonfleet import ROOT
from tritonfleet.inventory.roster import FleetHost
from tritonfleet.observability import metrics, tune
from tritonfleet.observability.metrics import ModelCounters
from tritonfleet.observability.tune import Thresholds, TuneRow, TuneThresholds
from tritonfleet.settings.table import read
from tritonfleet_testbed import standin_images as images
from tritonfleet_testbed.localtriton import LocalTriton

T = Thresholds(queue_compute_ratio=1.0, low_utilization=0.4, busy_utilization=0.8)
BATCHER = TuneThresholds(max_batch_size=64, dynamic_batching=True, max_queue_delay_us=5000,
                   preferred=(8, 16, 32, 64), device="gpu")


def row(requests_: int, queue_ms: float, compute_ms: float, batch: float, util: float | None,
        batches: dict[int, int] | None = None, settings: TuneThresholds = BATCHER) -> TuneRow:
    executions = requests_ / batch
    c = ModelCounters(requests=requests_, queue_us=requests_ * queue_ms * 1000,
                      compute_infer_us=requests_ * compute_ms * 1000, inferences=requests_,
                      executions=executions, batches=Counter(batches or {}))
    return TuneRow("t4", "resnet50_onnx", ["h1"], c, settings, util, 10.0)


# ---- the advice rules ----------------------------------------------------------------------------

def test_queue_dominating_on_an_idle_gpu_lowers_the_queue_delay():
    advice = tune.advise(row(100, 4.0, 1.0, 8.0, 0.25, {8: 12, 16: 1}), T)
    assert advice == ["lower max_queue_delay_microseconds (now 5000): requests wait 4.0 ms in the "
                      "queue against 1.0 ms of compute while the GPU is 25% busy",
                      "preferred_batch_size 32, 64 never reached (largest batch run: 16): while no "
                      "preferred size can be formed, each batch waits the whole "
                      "max_queue_delay_microseconds; list sizes the load reaches"]


def test_queue_dominating_on_a_busy_gpu_is_not_told_to_lower_the_delay():
    advice = tune.advise(row(100, 4.0, 1.0, 8.0, 0.95, {8: 12, 64: 1}), T)
    assert advice == []  # busy and queueing: more capacity, not a shorter delay (and no raise)


def test_small_batches_on_a_busy_gpu_raise_the_queue_delay():
    advice = tune.advise(row(100, 0.2, 3.0, 2.5, 0.9, {2: 20, 3: 20, 64: 1}), T)
    assert advice == ["raise max_queue_delay_microseconds (now 5000): the GPU is 90% busy while "
                      "batches average 2.5 (smallest preferred batch size 8): a longer wait fills them"]


def test_small_batches_on_an_idle_gpu_are_fine():
    assert tune.advise(row(100, 0.2, 3.0, 2.5, 0.3, {2: 20, 3: 20, 64: 1}), T) == []


def test_no_dynamic_batching_on_a_busy_gpu():
    s = TuneThresholds(max_batch_size=32, dynamic_batching=False, device="gpu")
    assert tune.advise(row(100, 0.1, 3.0, 1.0, 0.9, {1: 100}, settings=s), T) == [
        "enable dynamic_batching: the GPU is 90% busy running batches of 1.0 on average"]


def test_queue_without_a_queue_delay_on_an_idle_gpu_adds_instances():
    s = TuneThresholds(max_batch_size=32, dynamic_batching=True, max_queue_delay_us=0, device="gpu")
    advice = tune.advise(row(100, 9.0, 3.0, 1.0, 0.1, {1: 100}, settings=s), T)
    assert advice == ["add instances (instance_group count): requests wait 9.0 ms in the queue "
                      "against 3.0 ms of compute while the GPU is 10% busy, with no queue delay set"]


def test_without_utilization_only_the_figures_are_told():
    advice = tune.advise(row(100, 4.0, 1.0, 8.0, None, {8: 12, 64: 1}), T)
    assert advice == ["requests wait 4.0 ms in the queue against 1.0 ms of compute; no GPU "
                      "utilization metric to tell an idle GPU (lower max_queue_delay_microseconds) "
                      "from a busy one (add instances)"]


def test_no_requests_no_advice():
    assert tune.advise(TuneRow("t4", "m", ["h1"], ModelCounters(), BATCHER, 0.1, 10.0), T) == []


def test_settings_from_a_live_configuration():
    cfg = {"max_batch_size": 64, "dynamic_batching": {"preferred_batch_size": [16, 8],
                                                      "max_queue_delay_microseconds": 5000},
           "instance_group": [{"kind": "KIND_CPU", "count": 2}]}
    assert TuneThresholds.from_config(cfg) == TuneThresholds(64, True, 5000, (8, 16), "cpu")
    assert TuneThresholds.from_config({"max_batch_size": 0}).dynamic_batching is False
    assert TuneThresholds.from_config({"instance_group": [{"kind": "KIND_GPU"}]}).device == "gpu"


def test_counter_differences_and_restarts():
    a = ModelCounters(requests=10, executions=5, queue_us=100, batches=Counter({1: 2, 2: 4}))
    b = ModelCounters(requests=16, executions=8, queue_us=160, batches=Counter({1: 2, 2: 4, 4: 1}))
    d = b - a
    assert (d.requests, d.executions, d.queue_us, dict(d.batches)) == (6, 3, 60, {4: 1})
    restarted = ModelCounters(requests=3, executions=3, batches=Counter({1: 3}))
    assert (restarted - a).requests == 3  # a counter went down: the server restarted


def test_parse_keeps_tritons_counter_names():
    text = ('# TYPE nv_inference_request_success counter\n'
            'nv_inference_request_success{model="m",version="1"} 3\n'
            '# TYPE nv_gpu_utilization gauge\nnv_gpu_utilization{gpu_uuid="GPU-1"} 0.5\n'
            'nv_gpu_utilization{gpu_uuid="GPU-2"} 0.25\n')
    samples = metrics.parse(text)
    assert [(s.name, s.value) for s in samples] == [
        ("nv_inference_request_success", 3.0), ("nv_gpu_utilization", 0.5), ("nv_gpu_utilization", 0.25)]
    assert metrics.gauge_mean(samples, "nv_gpu_utilization") == 0.375
    assert metrics.model_counters(samples)["m"].requests == 3


# ---- against a real tritonserver ----------------------------------------------------------------

DELAY_US = 500_000  # far above the stand-in model's compute time: the queue dominates
PREFERRED = [8, 16, 32, 64]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("tune")
    repo = copy_repository(work / "repo", kind_cpu=True)
    cfg = repo / "resnet50_onnx" / "config.pbtxt"
    text = cfg.read_text()
    assert "max_queue_delay_microseconds: 5000" in text
    cfg.write_text(text.replace("max_queue_delay_microseconds: 5000",
                                f"max_queue_delay_microseconds: {DELAY_US}"))
    with LocalTriton(repo, python_based_backends={"onnxruntime": images.backend_model_py()}) as t:
        yield t


def _infer(t: LocalTriton, seed: int) -> None:
    client = httpclient.InferenceServerClient(url=t.http_url.removeprefix("http://"))
    try:
        data = np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)
        inp = httpclient.InferInput("input", data.shape, "FP32")
        inp.set_data_from_numpy(data)
        assert client.infer("resnet50_onnx", [inp]).as_numpy("output").shape == (1, 1000)
    finally:
        client.close()


def _stats(t: LocalTriton) -> dict:
    return requests.get(f"{t.http_url}/v2/models/resnet50_onnx/stats", timeout=10).json()["model_stats"][0]


def _inventory(tmp_path: Path, t: LocalTriton, **data) -> Path:
    d = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "group_data", d / "group_data")
    host = {"ssh_hostname": "127.0.0.1", "triton_http_port": t.http_port,
            "triton_metrics_port": t.metrics_port, **data}
    (d / "local.py").write_text(f"cpu = [('local-1', {host!r})]\n")
    return d / "local.py"


def _tune_json(inv: Path, *args: str) -> dict:
    res = tritonfleet("tune", str(inv), "--json", *args, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def sequential_load(server):
    """Four single requests, one after the other: none can be batched."""
    for i in range(4):
        _infer(server, i)
    return 4


def _always_low(t: LocalTriton) -> list[FleetHost]:
    """The host with a low-utilization threshold above any utilization (1.01: the CPU this
    server reports is often 100% busy on the test machine), so the runbook's rule applies to
    what was measured. An inventory cannot say so (the settings check refuses a ratio above 1),
    so the host is made here and read in-process, as the command reads it."""
    h = _host(t)
    h.data.update(monitor_low_utilization=1.01, triton_restricted_apis=[])
    return [h]


def _rows_in_process(hosts: list[FleetHost], models: set[str] | None = None):
    reads, seconds = tune.read_fleet(hosts, 0, models)
    return tune.rows(reads, seconds), seconds


def test_tune_measures_the_queue_against_compute(server, sequential_load, tmp_path):
    # any utilization counts as low: the runbook's rule applies to what was measured
    (rows, errors), seconds = _rows_in_process(_always_low(server), {"resnet50_onnx"})
    assert errors == [] and seconds is None
    [r] = [json.loads(json.dumps(row.as_dict())) for row in rows]
    stats = _stats(server)
    assert (r["name"], r["model"], r["hosts"]) == ("cpu", "resnet50_onnx", ["local-1"])
    assert r["requests"] == sequential_load == stats["inference_stats"]["success"]["count"]
    assert r["batch_efficiency"] == 1.0 and r["largest_batch"] == 1
    assert r["batch_sizes"] == {"1": sequential_load}
    # the metrics' figures agree with Triton's own statistics (ns) of the same requests
    n = stats["inference_stats"]["success"]["count"]
    assert r["queue_ms"] == pytest.approx(stats["inference_stats"]["queue"]["ns"] / n / 1e6, rel=0.01)
    compute_ns = sum(stats["inference_stats"][k]["ns"] for k in ("compute_input", "compute_infer", "compute_output"))
    assert r["compute_ms"] == pytest.approx(compute_ns / n / 1e6, rel=0.01)
    # no preferred size can form from single requests: each waits the whole delay
    assert r["queue_ms"] >= DELAY_US / 1000 * 0.9
    assert (r["device"], r["max_queue_delay_us"], r["preferred_batch_size"]) == ("cpu", DELAY_US, PREFERRED)
    assert 0 <= r["utilization"] <= 1
    assert r["advice"][0].startswith(f"lower max_queue_delay_microseconds (now {DELAY_US}): requests wait ")
    assert r["advice"][1].startswith("preferred_batch_size 8, 16, 32, 64 never reached (largest batch run: 1)")
    assert len(r["advice"]) == 2


def test_busy_device_and_queueing_is_not_told_to_change_the_delay(server, sequential_load, tmp_path):
    # no utilization counts as low, every one as busy: the queue dominates, so neither rule fits
    inv = _inventory(tmp_path, server, monitor_low_utilization=0, monitor_busy_utilization=0)
    [r] = _tune_json(inv, "--window", "0", "--model", "resnet50_onnx")["rows"]
    assert not any("max_queue_delay_microseconds (now" in a for a in r["advice"]), r["advice"]
    assert len(r["advice"]) == 1 and "never reached" in r["advice"][0]


def test_table_names_every_model_and_its_advice(server, sequential_load, tmp_path):
    res = tritonfleet("tune", str(_inventory(tmp_path, server)), "--window", "0", timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "2 model rows from 1 of 1 hosts, since each server started"
    assert lines[1].split()[:4] == ["GROUP", "MODEL", "HOSTS", "REQUESTS"]
    resnet = next(line for line in lines if "resnet50_onnx" in line).split()
    assert resnet[:4] == ["cpu", "resnet50_onnx", "1", str(sequential_load)]
    text = next(line for line in lines if "text_classifier_onnx" in line)
    assert text.rstrip().endswith("no requests")
    # the advice in the table, where the rule applies (see _always_low)
    (rows, _), _ = _rows_in_process(_always_low(server))
    table = tune.table(rows, per_host=False).splitlines()
    resnet = next(line for line in table if "resnet50_onnx" in line)
    assert "lower max_queue_delay_microseconds" in resnet


def _host(t: LocalTriton) -> FleetHost:
    data = {name: ast.literal_eval(default) for name, default, _ in read()}
    data.update(ssh_hostname="127.0.0.1", triton_http_port=t.http_port, triton_metrics_port=t.metrics_port)
    return FleetHost("local-1", ["cpu"], data)


def test_a_window_judges_only_what_happened_in_it(server, sequential_load):
    """Two reads around a burst of 16 concurrent requests: only the burst is judged."""
    h = _host(server)
    with metrics.endpoints(h) as urls:
        before = metrics.read_host(h, *urls)
        batches_before = Counter({b["batch_size"]: b["compute_infer"]["count"] for b in _stats(server)["batch_stats"]})
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: _infer(server, 100 + i), range(16)))
        # Triton counts a request when its response is released, a moment after the client has it:
        # the window's second read once the burst is all counted (bounded)
        deadline = time.monotonic() + 10
        while True:
            after = metrics.read_host(h, *urls, configs=False)
            rows, errors = tune.rows([(before, after)], 2.0)
            done = next((r.requests for r in rows if r.model == "resnet50_onnx"), 0)
            if done >= 16 or time.monotonic() > deadline or after.error:
                break
            time.sleep(0.05)
    assert before.error is None and after.error is None
    assert errors == []
    r = next(r for r in rows if r.model == "resnet50_onnx")
    batches_after = Counter({b["batch_size"]: b["compute_infer"]["count"] for b in _stats(server)["batch_stats"]})
    burst = batches_after - batches_before
    assert r.requests == 16 and r.counters.inferences == 16
    assert dict(r.counters.batches) == dict(burst)
    assert sum(size * n for size, n in burst.items()) == 16
    assert r.batch == 16 / sum(burst.values())
    assert r.rate == 8.0  # 16 requests over the 2 s given as the window
    never = [p for p in PREFERRED if p > max(burst)]
    reached = [a for a in r.advice if "never reached" in a]
    if never:
        assert reached and reached[0].startswith(f"preferred_batch_size {', '.join(map(str, never))} never reached")
    else:
        assert not reached
    idle = next(r for r in rows if r.model == "text_classifier_onnx")
    assert idle.requests == 0 and idle.advice == []


def test_unreachable_host_is_named_and_the_rest_reported(server, tmp_path):
    d = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "group_data", d / "group_data")
    good = {"ssh_hostname": "127.0.0.1", "triton_http_port": server.http_port,
            "triton_metrics_port": server.metrics_port}
    from tritonfleet_testbed.ports import free_port

    bad = {"ssh_hostname": "127.0.0.1", "health_host": "127.0.0.1", "triton_metrics_port": free_port()}
    (d / "two.py").write_text(f"cpu = [('local-1', {good!r}), ('local-2', {bad!r})]\n")
    res = tritonfleet("tune", str(d / "two.py"), "--window", "0", "--per-host", timeout=300)
    assert res.returncode == 1
    assert "local-1" in res.stdout and "resnet50_onnx" in res.stdout
    assert f"error: local-2: http://127.0.0.1:{bad['triton_metrics_port']}/metrics: ConnectionError" in res.stderr
    assert "health_host / ssh_hostname" in res.stderr


def test_window_reads_twice(server, sequential_load, tmp_path):
    """--window N: two reads N seconds apart; nothing was sent in between, so nothing is judged."""
    out = _tune_json(_inventory(tmp_path, server), "--window", "1")
    assert out["window_s"] >= 1 and out["errors"] == []
    assert sorted(r["model"] for r in out["rows"]) == ["resnet50_onnx", "text_classifier_onnx"]
    for r in out["rows"]:
        assert (r["requests"], r["requests_per_s"], r["batch_sizes"], r["advice"]) == (0, 0, {}, [])


def test_no_window_is_waited_when_every_host_failed_its_first_read(monkeypatch):
    """tune used to sleep its whole --window after every host had failed: nothing to read again."""
    from tritonfleet_testbed.ports import free_port

    data = {name: ast.literal_eval(default) for name, default, _ in read()}
    # no restricted API: no API key to read over SSH (these hosts have no SSH connection)
    hosts = [FleetHost(f"down-{i}", ["cpu"], {**data, "ssh_hostname": "127.0.0.1", "triton_restricted_apis": [],
                                              "triton_metrics_port": free_port(), "triton_http_port": free_port()})
             for i in range(2)]
    waited = []
    monkeypatch.setattr(tune.time, "sleep", waited.append)
    reads, seconds = tune.read_fleet(hosts, 30)
    assert waited == [] and seconds is None
    rows, errors = tune.rows(reads, seconds)
    assert rows == [] and [e.split(":")[0] for e in errors] == ["down-0", "down-1"]
    assert all("ConnectionError" in e for e in errors)
