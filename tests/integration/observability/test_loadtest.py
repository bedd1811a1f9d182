"""``tritonfleet loadtest``: inputs generated from any model configuration (generative), and
the command against a real tritonserver (the nvidia-pytriton binary on loopback): the load
generator's request count equals Triton's own ``nv_inference_request_success`` delta, over
HTTP and gRPC, and the JSON, table and plot it writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.testbed import tritonfleet
from tests.support.tritonproc import copy_repository
from tritonfleet import ROOT
from tritonfleet.observability import loadtest
from tritonfleet_testbed import standin_images as images
from tritonfleet_testbed.localtriton import LocalTriton
from tritonfleet_testbed.ports import free_port

# ---- inputs from a model configuration -----------------------------------------------------------

dims = st.lists(st.one_of(st.integers(1, 6), st.just(-1)), min_size=0, max_size=4)
config_input = st.fixed_dictionaries(
    {"name": st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
     "data_type": st.sampled_from(sorted(loadtest.DTYPES)), "dims": dims},
    optional={"optional": st.booleans()},
)
configs = st.fixed_dictionaries({
    "name": st.just("m"),
    "max_batch_size": st.integers(0, 64),
    "input": st.lists(config_input, min_size=1, max_size=4, unique_by=lambda i: i["name"]),
})


@settings(max_examples=150, deadline=None)
@given(configs, st.sampled_from(["http", "grpc"]))
def test_inputs_match_the_configuration_and_tritonclient_accepts_them(config, protocol):
    required = [i for i in config["input"] if not i.get("optional")]
    if not required:
        with pytest.raises(loadtest.LoadTestError, match="no required inputs"):
            loadtest.input_specs(config)
        return
    specs = loadtest.input_specs(config)
    assert [s.name for s in specs] == [i["name"] for i in required]
    for s, i in zip(specs, required, strict=True):
        want = [1 if d < 0 else d for d in i["dims"]]
        assert list(s.shape) == ([1] + want if config["max_batch_size"] > 0 else want)
        assert s.datatype == loadtest.DTYPES[i["data_type"]][0]
    # tritonclient itself checks each array's dtype and shape against the declared ones
    inputs = loadtest.make_inputs(specs, protocol)
    assert [x.name() for x in inputs] == [s.name for s in specs]
    assert [list(x.shape()) for x in inputs] == [list(s.shape) for s in specs]
    assert [x.datatype() for x in inputs] == [s.datatype for s in specs]


def test_the_runbooks_models_get_their_inputs():
    from google.protobuf.json_format import MessageToDict

    from tests.support.tritonproc import parse_config

    repo = ROOT / "files" / "model_repository"
    got = {}
    for cfg in sorted(repo.glob("*/config.pbtxt")):
        # the JSON form Triton's /v2/models/<m>/config answers with (proto field names)
        d = MessageToDict(parse_config(cfg.read_text()), preserving_proto_field_name=True)
        got[d["name"]] = [(s.name, s.datatype, s.shape) for s in loadtest.input_specs(d)]
    assert got == {
        "resnet50_onnx": [("input", "FP32", (1, 3, 224, 224))],
        "text_classifier_onnx": [("input_ids", "INT64", (1, 128)), ("attention_mask", "INT64", (1, 128))],
    }
    ids = loadtest.make_data(loadtest.InputSpec("input_ids", "INT64", (1, 128)), np.random.default_rng(0))
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 100


def test_an_input_type_it_cannot_generate_is_named():
    with pytest.raises(loadtest.LoadTestError, match="input 'x' of model 'm' has data type TYPE_BF16"):
        loadtest.input_specs({"name": "m", "input": [{"name": "x", "data_type": "TYPE_BF16", "dims": [2]}]})


@given(st.lists(st.integers(1, 512), min_size=1, max_size=6))
def test_concurrency_list(values):
    assert loadtest.parse_concurrency(",".join(map(str, values))) == values


@pytest.mark.parametrize("bad", ["", "0", "1,x", "-4", "4,,0"])
def test_bad_concurrency_is_refused(bad):
    with pytest.raises(loadtest.LoadTestError, match="--concurrency takes numbers >= 1"):
        loadtest.parse_concurrency(bad)


# ---- against a real tritonserver -----------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("loadtest")
    repo = copy_repository(work / "repo", kind_cpu=True)
    with LocalTriton(repo, python_based_backends={"onnxruntime": images.backend_model_py()}) as t:
        yield t


def _inventory(tmp_path: Path, t: LocalTriton, **data) -> Path:
    d = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "group_data", d / "group_data")
    host = {"ssh_hostname": "127.0.0.1", "triton_http_port": t.http_port, "triton_grpc_port": t.grpc_port,
            "triton_metrics_port": t.metrics_port, **data}
    (d / "local.py").write_text(f"cpu = [('local-1', {host!r})]\n")
    return d / "local.py"


def _successes(t: LocalTriton) -> dict[str, float]:
    """Triton's own nv_inference_request_success per model, read by the test."""
    from tritonfleet.observability import metrics

    samples = metrics.parse(__import__("requests").get(t.metrics_url, timeout=10).text)
    return {m: c.requests for m, c in metrics.model_counters(samples).items()}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_request_count_equals_tritons_own_counter(server, tmp_path, protocol):
    inv = _inventory(tmp_path, server)
    before = _successes(server)
    res = tritonfleet("loadtest", str(inv), "--json", "--duration", "1.5", "--concurrency", "1,8",
                      "--protocol", protocol, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    after = _successes(server)
    out = json.loads(res.stdout)
    assert out["errors"] == [] and out["protocol"] == protocol
    results = out["results"]
    assert [(r["host"], r["model"], r["concurrency"]) for r in results] == [
        ("local-1", "resnet50_onnx", 1), ("local-1", "resnet50_onnx", 8),
        ("local-1", "text_classifier_onnx", 1), ("local-1", "text_classifier_onnx", 8)]
    for model in ("resnet50_onnx", "text_classifier_onnx"):
        sent = sum(r["requests"] for r in results if r["model"] == model)
        # the command's warm-up (8 requests a model) plus every measured request, nothing else
        assert after[model] - before[model] == sent + 8, (model, before, after, results)
    for r in results:
        assert r["errors"] == 0 and r["requests"] > 0
        assert r["triton_requests"] == r["requests"]  # per step too: the deltas are the step's
        assert r["throughput"] == pytest.approx(r["requests"] / r["duration_s"])
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
        assert r["queue_us_avg"] >= 0 and r["compute_us_avg"] > 0
        assert r["client_cpu_ms_per_request"] > 0 and r["client_core_rate"] > 0
        # a request's server time (queue + compute) fits in what the client waited for it
        assert (r["queue_us_avg"] + r["compute_us_avg"]) / 1000 < r["p99_ms"] * 1.5
    one = next(r for r in results if r["model"] == "resnet50_onnx" and r["concurrency"] == 1)
    assert one["batch_avg"] == 1.0  # one request in flight: nothing to batch
    assert (one["dynamic_batching"], one["max_queue_delay_us"]) == (True, 5000)
    assert out["client"]["requests"] == sum(r["requests"] for r in results)
    assert "] done: " in res.stderr  # the progress lines


def test_table_plot_and_one_model(server, tmp_path):
    png = tmp_path / "lt.png"
    res = tritonfleet("loadtest", str(_inventory(tmp_path, server)), "--model", "text_classifier_onnx",
                      "--duration", "1", "--concurrency", "2,4", "--plot", str(png), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split()[:6] == ["HOST", "MODEL", "CONC", "REQUESTS", "ERRORS", "INF/S"]
    assert [ln.split()[:3] for ln in lines[1:3]] == [["local-1", "text_classifier_onnx", "2"],
                                                    ["local-1", "text_classifier_onnx", "4"]]
    assert lines[3].startswith("load generator: ") and "requests/s" in lines[3]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_unreachable_host_and_unknown_model_are_named(server, tmp_path):
    d = tmp_path / "bad"
    shutil.copytree(ROOT / "inventories" / "group_data", d / "group_data")
    bad = {"ssh_hostname": "127.0.0.1", "triton_http_port": free_port(), "triton_metrics_port": free_port()}
    (d / "bad.py").write_text(f"cpu = [('local-2', {bad!r})]\n")
    res = tritonfleet("loadtest", str(d / "bad.py"), "--duration", "1", "--concurrency", "1", timeout=120)
    assert res.returncode == 1
    assert "error: local-2: ConnectionError" in res.stderr and "health_host / ssh_hostname" in res.stderr
    res = tritonfleet("loadtest", str(_inventory(tmp_path, server)), "--model", "nope", "--duration", "1",
                      "--concurrency", "1", timeout=120)
    assert res.returncode == 1
    assert "error: local-1: http://127.0.0.1:" in res.stderr, res.stderr[-800:]
    assert "/v2/models/nope/config -> HTTP 404" in res.stderr, res.stderr[-800:]


# ---- tritonfleet tune --loadtest -----------------------------------------------------------------

def _step(c: int, throughput: float, p95: float, queue: float = 100.0, compute: float = 1000.0,
          util: float = 0.9, busy: float = 0.2, **kw) -> dict:
    return {"host": "h1", "model": "resnet50_onnx", "concurrency": c, "requests": 1000, "errors": 0,
            "throughput": throughput, "p50_ms": p95 / 2, "p95_ms": p95, "p99_ms": p95 * 1.2,
            "queue_us_avg": queue, "compute_us_avg": compute, "batch_avg": 4.0, "triton_requests": 1000,
            "utilization": util, "device": "gpu", "max_batch_size": 64, "dynamic_batching": True,
            "max_queue_delay_us": 5000, "preferred_batch_size": [8, 16], "client_busy": busy,
            "client_core_rate": 2000.0, "duration_s": 10.0, **kw}


def test_tune_judges_a_loadtest_sweep_and_cites_its_figures():
    from tritonfleet.observability import tune

    doc = {"results": [_step(1, 100.0, 5.0), _step(4, 380.0, 6.0),
                       _step(16, 400.0, 25.0, queue=4000.0, util=0.3),
                       _step(64, 410.0, 90.0, busy=0.95)]}
    rows = tune.loadtest_rows(doc, "loadtest run.json", lambda h: tune.default_thresholds())
    assert [r.name for r in rows] == ["h1 c=1", "h1 c=4", "h1 c=16", "h1 c=64"]
    cite16 = ("[loadtest run.json: h1 resnet50_onnx at concurrency 16: 400.0 inf/s, p95 25.0 ms, queue "
              "4000 us vs compute 1000 us per request, mean batch 4.00, utilization gpu 30%]")
    assert rows[2].advice[0] == ("lower max_queue_delay_microseconds (now 5000): requests wait 4.0 ms in "
                                 "the queue against 1.0 ms of compute while the GPU is 30% busy " + cite16)
    assert rows[2].advice[1].startswith("throughput levels off: 380.0 -> 400.0 inf/s from concurrency 4 "
                                        "to 16 while p95 rises 6.0 -> 25.0 ms")
    assert rows[2].advice[1].endswith(cite16)
    # busy GPU, batches of 4 under the smallest preferred size 8, the queue short: raise the delay
    assert rows[1].advice[0].startswith("raise max_queue_delay_microseconds (now 5000): the GPU is 90% busy")
    assert any(a.startswith("the load generator used 95% of a core here") for a in rows[3].advice)
    assert not any("levels off" in a for a in rows[3].advice)  # told once, where it starts


def test_tune_loadtest_file_against_a_real_server(server, tmp_path):
    # any utilization below full counts as low (a ratio above 1 is refused by the settings check)
    inv = _inventory(tmp_path, server, monitor_low_utilization=1.0)
    res = tritonfleet("loadtest", str(inv), "--json", "--model", "resnet50_onnx", "--duration", "1.5",
                      "--concurrency", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    path = tmp_path / "lt.json"
    path.write_text(res.stdout)
    [step] = json.loads(res.stdout)["results"]
    res = tritonfleet("tune", str(inv), "--loadtest", str(path), "--json", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    [r] = json.loads(res.stdout)["rows"]
    assert (r["name"], r["model"], r["requests"]) == ("local-1 c=1", "resnet50_onnx", step["requests"])
    cite = f"[loadtest {path}: local-1 resnet50_onnx at concurrency 1: {step['throughput']:.1f} inf/s"
    assert r["advice"] and all(cite in a for a in r["advice"]), r["advice"]
    # single requests never form a preferred batch: told so, with the figures
    assert any(a.startswith("preferred_batch_size 8, 16, 32, 64 never reached (largest batch run: 1)")
               for a in r["advice"])
    res = tritonfleet("tune", "--loadtest", str(path), timeout=300)  # no inventory: all.py's thresholds
    assert res.returncode == 0 and "local-1 c=1" in res.stdout, res.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    res = tritonfleet("tune", "--loadtest", str(bad), timeout=300)
    assert res.returncode == 2 and "no 'results' list" in res.stderr  # bad input: exit 2, as every command
