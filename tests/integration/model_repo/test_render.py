"""files/model_repository: the runbook's configs, the stand-in ONNX models, and serving them
with the real tritonserver (python backend + the Python-based onnxruntime backend)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

import tests.support.tritonproc as tp

REPO = tp.MODEL_REPOSITORY
MODELS = ["resnet50_onnx", "text_classifier_onnx"]

# The runbook's model configurations, field by field.
EXPECTED = {
    "resnet50_onnx": {
        "name": "resnet50_onnx",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 64,
        "input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}],
        "output": [{"name": "output", "data_type": "TYPE_FP32", "dims": [1000]}],
        "dynamic_batching": {
            "preferred_batch_size": [8, 16, 32, 64],
            "max_queue_delay_microseconds": 5000,
        },
        "instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}],
    },
    "text_classifier_onnx": {
        "name": "text_classifier_onnx",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 32,
        "input": [
            {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [128]},
            {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": [128]},
        ],
        "output": [{"name": "probabilities", "data_type": "TYPE_FP32", "dims": [2]}],
        "dynamic_batching": {
            "preferred_batch_size": [4, 8, 16, 32],
            "max_queue_delay_microseconds": 2000,
        },
        "instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": [0]}],
    },
}

ONNX_TYPES = {"TYPE_FP32": onnx.TensorProto.FLOAT, "TYPE_INT64": onnx.TensorProto.INT64}


def _config(name: str) -> model_config_pb2.ModelConfig:
    return tp.parse_config((REPO / name / "config.pbtxt").read_text())


def _has_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


# --- the repository ---------------------------------------------------------------------


def test_repository_holds_exactly_the_two_models():
    assert sorted(p.name for p in REPO.iterdir() if p.is_dir()) == MODELS
    for name in MODELS:
        files = sorted(
            str(p.relative_to(REPO / name)) for p in (REPO / name).rglob("*") if p.is_file()
        )
        assert files == ["1/model.onnx", "config.pbtxt"], files


@pytest.mark.parametrize("name", MODELS)
def test_config_is_the_runbooks(name):
    expected = json_format.ParseDict(EXPECTED[name], model_config_pb2.ModelConfig())
    assert _config(name) == expected
    text = (REPO / name / "config.pbtxt").read_text()
    assert text.startswith(f'name: "{name}"\nplatform: "onnxruntime_onnx"\n')
    assert "kind: KIND_GPU" in text and "gpus: [ 0 ]" in text


@pytest.mark.parametrize("name", MODELS)
def test_onnx_model_matches_its_config(name):
    config = _config(name)
    model = onnx.load(REPO / name / "1" / "model.onnx")
    onnx.checker.check_model(model, full_check=True)
    # loadable by the onnxruntime of Triton 24.08 (ORT 1.18: IR <= 9, opset <= 20)
    assert model.ir_version <= 9
    assert all(o.version <= 20 for o in model.opset_import if o.domain in ("", "ai.onnx"))

    def io(values):
        out = {}
        for v in values:
            t = v.type.tensor_type
            out[v.name] = (t.elem_type, [d.dim_param or d.dim_value for d in t.shape.dim])
        return out

    graph_inputs = io(model.graph.input)
    graph_outputs = io(model.graph.output)
    for section, graph_io in (("input", graph_inputs), ("output", graph_outputs)):
        entries = getattr(config, section)
        assert sorted(graph_io) == sorted(e.name for e in entries)
        for e in entries:
            elem, shape = graph_io[e.name]
            dtype = model_config_pb2.DataType.Name(e.data_type)
            assert elem == ONNX_TYPES[dtype], (e.name, elem)
            # dynamic batch dimension first, then the configured dims
            assert isinstance(shape[0], str) and shape[0], shape
            assert shape[1:] == list(e.dims), (e.name, shape)
    assert (REPO / name / "1" / "model.onnx").stat().st_size < 256 * 1024


def test_models_are_byte_identical_to_a_fresh_generation(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO.parent / "make_models.py"), str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in MODELS:
        fresh = (tmp_path / name / "1" / "model.onnx").read_bytes()
        assert fresh == (REPO / name / "1" / "model.onnx").read_bytes(), name


def test_models_compute_what_they_claim():
    rng = np.random.default_rng(0)
    resnet = ort.InferenceSession(
        str(REPO / "resnet50_onnx/1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    x = (
        rng.random((5, 3, 224, 224), dtype=np.float32)
        * np.arange(1, 6, dtype=np.float32)[:, None, None, None]
    )
    (out,) = resnet.run(None, {"input": x})
    assert out.shape == (5, 1000) and out.dtype == np.float32
    # GlobalAveragePool -> one linear layer: images with equal channel means score equally
    y = np.broadcast_to(x.mean(axis=(2, 3), keepdims=True), x.shape).astype(np.float32)
    np.testing.assert_allclose(resnet.run(None, {"input": y})[0], out, rtol=1e-3, atol=1e-3)
    assert not np.allclose(out[0], out[1])

    text = ort.InferenceSession(
        str(REPO / "text_classifier_onnx/1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    ids = rng.integers(0, 50265, (4, 128), dtype=np.int64)
    mask = np.ones((4, 128), dtype=np.int64)
    mask[1, 64:] = 0
    mask[2, :] = 0
    (p,) = text.run(None, {"input_ids": ids, "attention_mask": mask})
    assert p.shape == (4, 2) and p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    assert np.isfinite(p).all()
    # masked-out tokens do not matter
    ids2 = ids.copy()
    ids2[1, 64:] = 7
    np.testing.assert_allclose(text.run(None, {"input_ids": ids2, "attention_mask": mask})[0], p)


# --- serving with the real tritonserver ----------------------------------------------------


def test_unmodified_repository_on_this_gpu_less_server(tmp_path):
    """The runbook's KIND_GPU configs: refused without a GPU, served when there is one."""
    repo = tp.copy_repository(tmp_path / "models", kind_cpu=False)
    with tp.local_server(repo, tmp_path, wait=False) as server:
        if _has_gpu():
            server.wait_ready()
            assert all(server.model_ready(m) for m in MODELS)
            return
        rc = server.wait_exit(120)
    log = server.log()
    assert rc != 0
    assert "error: creating server: Internal - failed to load all models" in log
    for name in MODELS:
        assert (
            f"failed to load '{name}' version 1: Invalid argument: instance group {name}_0 of "
            f"model {name} specifies invalid or unsupported gpu id 0. GPUs with at least the "
            "minimum required CUDA compute compatibility of 6.000000 are: "
        ) in log


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("triton")
    repo = tp.copy_repository(work / "models", kind_cpu=True)
    with tp.local_server(repo, work) as s:
        yield s


def _client(server, concurrency=1):
    return httpclient.InferenceServerClient(server.url, concurrency=concurrency)


def _image_input(x):
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def _text_inputs(ids, mask):
    a = httpclient.InferInput("input_ids", list(ids.shape), "INT64")
    a.set_data_from_numpy(ids)
    b = httpclient.InferInput("attention_mask", list(mask.shape), "INT64")
    b.set_data_from_numpy(mask)
    return [a, b]


def test_cpu_override_loads_both_models(server):
    client = _client(server)
    assert client.is_server_ready()
    for name in MODELS:
        assert client.is_model_ready(name)
        meta = client.get_model_metadata(name)
        assert meta["platform"] == "onnxruntime_onnx"
        cfg = client.get_model_config(name)
        assert cfg["backend"] == "onnxruntime"
        assert [g["kind"] for g in cfg["instance_group"]] == ["KIND_CPU"]
    assert "onnxruntime" in server.log() and "model.py" in server.log()


def test_resnet_inference_like_the_article(server):
    client = _client(server)
    x = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)
    result = client.infer(
        "resnet50_onnx", _image_input(x), outputs=[httpclient.InferRequestedOutput("output")]
    )
    out = result.as_numpy("output")
    assert out.shape == (1, 1000) and out.dtype == np.float32
    session = ort.InferenceSession(
        str(REPO / "resnet50_onnx/1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(out, session.run(None, {"input": x})[0], rtol=1e-5, atol=1e-5)
    top5 = np.argsort(out[0])[::-1][:5]
    assert len(set(top5.tolist())) == 5


def test_text_classifier_inference_like_the_article(server):
    client = _client(server)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 50265, (1, 128), dtype=np.int64)
    mask = np.ones((1, 128), dtype=np.int64)
    p = client.infer("text_classifier_onnx", _text_inputs(ids, mask)).as_numpy("probabilities")
    assert p.shape == (1, 2) and p.dtype == np.float32
    assert abs(float(p.sum()) - 1.0) < 1e-5
    session = ort.InferenceSession(
        str(REPO / "text_classifier_onnx/1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(
        p, session.run(None, {"input_ids": ids, "attention_mask": mask})[0], rtol=1e-5
    )


def test_client_side_batch_and_limits(server):
    client = _client(server)
    ids = np.arange(8 * 128, dtype=np.int64).reshape(8, 128)
    mask = np.ones_like(ids)
    p = client.infer("text_classifier_onnx", _text_inputs(ids, mask)).as_numpy("probabilities")
    assert p.shape == (8, 2)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    # max_batch_size 32 and the configured dims are enforced by Triton itself
    too_big = np.zeros((33, 128), dtype=np.int64)
    with pytest.raises(InferenceServerException, match="batch"):
        client.infer("text_classifier_onnx", _text_inputs(too_big, too_big))
    wrong = np.zeros((1, 64), dtype=np.int64)
    with pytest.raises(InferenceServerException):
        client.infer("text_classifier_onnx", _text_inputs(wrong, wrong))


def _exec_and_request_counts(server, model):
    m = server.metrics()
    labels = f'{{model="{model}",version="1"}}'
    return m[f"nv_inference_exec_count{labels}"], m[f"nv_inference_request_success{labels}"]


@pytest.mark.parametrize("model", MODELS)
def test_concurrent_requests_are_batched(server, model):
    n = 64
    rng = np.random.default_rng(3)
    if model == "resnet50_onnx":
        batches = [rng.random((1, 3, 224, 224), dtype=np.float32) for _ in range(n)]
        requests = [_image_input(x) for x in batches]
        out_name = "output"
    else:
        batches = [rng.integers(0, 50265, (1, 128), dtype=np.int64) for _ in range(n)]
        requests = [_text_inputs(x, np.ones_like(x)) for x in batches]
        out_name = "probabilities"
    exec_before, req_before = _exec_and_request_counts(server, model)
    results = server.infer_at_once(model, requests)
    exec_after, req_after = _exec_and_request_counts(server, model)
    assert req_after - req_before == n
    executions = exec_after - exec_before
    # the dynamic batcher ran them as a few batches, not one execution per request
    assert 0 < executions <= n // 2, f"{n} requests ran in {executions} executions"

    # every request got its own rows back out of the batches
    outputs = [r.as_numpy(out_name) for r in results]
    session = ort.InferenceSession(
        str(REPO / model / "1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    if model == "resnet50_onnx":
        expected = session.run(None, {"input": np.concatenate(batches)})[0]
    else:
        ids = np.concatenate(batches)
        expected = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    np.testing.assert_allclose(np.concatenate(outputs), expected, rtol=1e-5, atol=1e-5)

    stats = _client(server).get_inference_statistics(model)["model_stats"][0]["batch_stats"]
    assert max(int(b["batch_size"]) for b in stats) > 1


def test_many_clients_in_parallel_threads(server):
    client_count = 8

    def run(i):
        c = _client(server)
        x = np.full((1, 3, 224, 224), i / 10, dtype=np.float32)
        return c.infer("resnet50_onnx", _image_input(x)).as_numpy("output")

    with ThreadPoolExecutor(client_count) as pool:
        outs = list(pool.map(run, range(client_count)))
    assert all(o.shape == (1, 1000) for o in outs)
    assert not np.allclose(outs[0], outs[1])


def test_backend_rejects_a_config_that_does_not_match_the_model(tmp_path):
    repo = tp.copy_repository(tmp_path / "models", kind_cpu=True)
    cfg = repo / "text_classifier_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "attention_mask"', 'name: "token_type_ids"'))
    with tp.local_server(repo, tmp_path, wait=False) as server:
        rc = server.wait_exit(120)
    assert rc != 0
    log = server.log()
    assert "configuration expects input 'token_type_ids'" in log
    assert "successfully loaded 'resnet50_onnx'" in log


def test_default_model_filename_is_honoured(tmp_path):
    repo = tp.copy_repository(tmp_path / "models", kind_cpu=True)
    model_dir = repo / "resnet50_onnx"
    (model_dir / "1" / "model.onnx").rename(model_dir / "1" / "resnet50.onnx")
    cfg = model_dir / "config.pbtxt"
    cfg.write_text(cfg.read_text() + 'default_model_filename: "resnet50.onnx"\n')
    (repo / "text_classifier_onnx").rename(tmp_path / "unused")
    with tp.local_server(repo, tmp_path) as server:
        assert server.model_ready("resnet50_onnx")
        out = _client(server).infer(
            "resnet50_onnx", _image_input(np.zeros((2, 3, 224, 224), np.float32))
        )
        assert out.as_numpy("output").shape == (2, 1000)


def test_launcher_environment_is_loopback_only(server):
    log = server.log()
    assert f"Started HTTPService at 127.0.0.1:{server.http_port}" in log
    assert f"Started GRPCInferenceService at 127.0.0.1:{server.grpc_port}" in log
