"""The warm inference gate (tritonfleet.serving.warmup) against the real tritonserver: the runbook's two
models answer one inference each, built from their config.pbtxt; a model that is ready but fails
at its first inference fails with Triton's answer; a model whose output does not fit its config
is caught; requests are built right for every data type (hypothesis)."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.tritonproc import copy_repository, local_server
from tritonfleet.model_repo.validate import parse_config
from tritonfleet.serving import warmup

MODELS = ["resnet50_onnx", "text_classifier_onnx"]

FAILING = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def model(repo, name: str, execute: str) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(FAILING.format(name=name))
    (d / "1" / "model.py").write_text(
        "import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        f"{execute}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("warm")
    repo = copy_repository(work / "repo", kind_cpu=True)
    model(repo, "fails_at_inference", "        raise RuntimeError('CUDA error: an illegal memory access was encountered')\n")
    model(repo, "wrong_shape", "        out = []\n        for r in requests:\n"
                               "            x = pb_utils.get_input_tensor_by_name(r, 'INPUT0').as_numpy()\n"
                               "            t = pb_utils.Tensor('OUTPUT0', np.zeros((1, 3), dtype=np.float32))\n"
                               "            out.append(pb_utils.InferenceResponse(output_tensors=[t]))\n"
                               "        return out\n")
    served = work / "served"  # the stub leaves __pycache__ in what it serves: configs are read from repo
    shutil.copytree(repo, served)
    with local_server(served, work) as srv:
        yield srv, repo


def test_the_runbooks_models_answer_their_first_inference(server):
    srv, repo = server
    res = warmup.warm(f"http://127.0.0.1:{srv.http_port}", repo, MODELS)
    assert res.ok, (res.model, res.answer)
    assert set(res.latency_ms) == set(MODELS) and all(ms > 0 for ms in res.latency_ms.values())


def test_ready_but_failing_fails_with_tritons_answer(server):
    import requests

    srv, repo = server
    url = f"http://127.0.0.1:{srv.http_port}"
    assert requests.get(f"{url}/v2/models/fails_at_inference/ready", timeout=5).status_code == 200  # "ready"
    res = warmup.warm(url, repo, ["resnet50_onnx", "fails_at_inference"])
    assert not res.ok and res.model == "fails_at_inference"
    assert res.answer.startswith("HTTP 500") and "illegal memory access" in res.answer
    assert "resnet50_onnx" in res.latency_ms


def test_outputs_that_do_not_fit_the_config_are_caught(server):
    srv, repo = server
    res = warmup.warm(f"http://127.0.0.1:{srv.http_port}", repo, ["wrong_shape"])
    assert not res.ok and "output 'OUTPUT0' has shape [1, 3], its config says [1, 4]" in res.answer


def test_sequence_models_and_missing_configs_are_skipped(tmp_path):
    cfg = parse_config('name: "s" backend: "python" max_batch_size: 1 sequence_batching {} '
                       'input [{ name: "IN" data_type: TYPE_INT32 dims: [1] }] '
                       'output [{ name: "OUT" data_type: TYPE_INT32 dims: [1] }]')
    assert warmup.request_for(cfg) is None
    res = warmup.warm("http://127.0.0.1:9", tmp_path, ["absent"])
    assert res.ok and res.skipped == {"absent": "no config.pbtxt in the repository"}


@given(st.sampled_from(sorted(warmup.DATATYPES)), st.lists(st.sampled_from([-1, 1, 2, 3]), min_size=1, max_size=3),
       st.sampled_from([0, 4]), st.booleans())
def test_requests_follow_the_config(dtype, dims, max_batch, optional):
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = mc.ModelConfig(name="m", max_batch_size=max_batch)
    cfg.input.add(name="A", data_type=dtype, dims=dims)
    cfg.input.add(name="B", data_type=mc.TYPE_FP32, dims=[2], optional=optional)
    body = warmup.request_for(cfg)
    a = body["inputs"][0]
    want = ([1] if max_batch else []) + [d if d > 0 else 1 for d in dims]
    assert a["shape"] == want and len(a["data"]) == __import__("math").prod(want)
    assert a["datatype"] == warmup.DATATYPES[dtype]
    assert [i["name"] for i in body["inputs"]] == (["A"] if optional else ["A", "B"])


def test_a_prepared_request_is_what_requests_would_send_and_follows_a_changed_config(tmp_path):
    """warmup.prepared: parsed and encoded once per config file (not once per host), byte for
    byte the body requests' json= sends, and a config that changes is read again."""
    import requests

    repo = copy_repository(tmp_path / "repo", kind_cpu=True)
    for m in MODELS:
        plan, body = warmup.prepared(repo, m)
        want = requests.Request("POST", "http://h/", json=warmup.request_from(plan)).prepare().body
        assert body == want
        assert warmup.prepared(repo, m)[1] is body  # the same bytes object: encoded once
    path = repo / MODELS[0] / "config.pbtxt"
    before = warmup.prepared(repo, MODELS[0])[1]
    path.write_text(path.read_text().replace("max_batch_size: 64", "max_batch_size: 0", 1) + "\n")
    after = warmup.prepared(repo, MODELS[0])[1]
    assert after != before
    assert warmup.prepared(tmp_path, "absent") == (None, None)


_NAMES = st.text(min_size=1, max_size=12)  # any text: quotes, backslashes, non-ASCII, control characters
_VALUES = st.one_of(st.just(0), st.just(False), st.just(""), st.integers(-3, 3),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4))


@st.composite
def _inputs(draw):
    """An input as request_for builds it (data: one value repeated, warmup.Repeated), or one it
    never builds (a plain list, data of mixed values, data not its last key, no data, empty data):
    encode must equal json.dumps for every one."""
    shape = draw(st.lists(st.integers(1, 6), min_size=0, max_size=3))
    n = draw(st.integers(1, 40))
    value = draw(_VALUES)
    inp = {"name": draw(_NAMES), "shape": shape, "datatype": draw(st.sampled_from(list(warmup.DATATYPES.values()))),
           "data": warmup.Repeated(value, n)}
    kind = draw(st.sampled_from(["built", "built", "built", "plain", "mixed", "data_first", "no_data", "empty"]))
    if kind == "plain":
        inp["data"] = [value] * n
    elif kind == "mixed":
        inp["data"] = [value] * n + [draw(_VALUES)]
    elif kind == "data_first":
        inp = {"data": inp.pop("data"), **inp}
    elif kind == "no_data":
        del inp["data"]
    elif kind == "empty":
        inp["data"] = warmup.Repeated(value, 0)
    return inp


@given(st.lists(_inputs(), min_size=0, max_size=4), st.booleans())
def test_a_request_body_is_encoded_as_json_dumps_would(inputs, extra_key):
    """warmup.encode is json.dumps(body, allow_nan=False) byte for byte, on generated bodies."""
    import json

    body = {"inputs": inputs, **({"parameters": {"x": 1}} if extra_key else {})}
    assert warmup.encode(body) == json.dumps(body, allow_nan=False).encode("utf-8")


def test_encoding_a_value_json_refuses_fails_as_json_dumps_does():
    import pytest as _pytest

    with _pytest.raises(ValueError):
        warmup.encode({"inputs": [{"name": "x", "data": warmup.Repeated(float("nan"), 3)}]})


def test_the_health_gate_fails_a_ready_model_that_cannot_serve_with_tritons_answer(server):
    """What the deploy's health gate does with it (health.gate + warm_check): the endpoints pass,
    the first inference does not, the report names the model and carries Triton's words."""
    from tritonfleet.serving import health, unit_watch

    srv, repo = server
    data = {"health_via": "direct", "health_host": "127.0.0.1", "triton_http_port": srv.http_port,
            "triton_metrics_port": srv.metrics_port, "health_timeout": 20, "health_request_timeout": 5}
    said = []
    good = health.gate(data, "127.0.0.1", MODELS, warm=health.warm_check(str(repo), MODELS, 30, said.append))
    assert good.ok and said and said[0].startswith("first inference: resnet50_onnx ")
    bad = health.gate(data, "127.0.0.1", MODELS + ["fails_at_inference"],
                      warm=health.warm_check(str(repo), MODELS + ["fails_at_inference"], 30, said.append))
    assert not bad.ok and bad.verdict.cause == "model fails_at_inference is ready but its first inference failed"
    assert "illegal memory access" in bad.verdict.words[0]
    report = health.failure_of(bad, "h", MODELS, unit_watch.UnitWatch(lambda c: "", "triton", "triton", "/opt/triton"), 20)
    assert "model fails_at_inference is ready but its first inference failed" in report.text()
    assert "illegal memory access" in report.text()
    # without the warm gate the same server passes: what this gate adds
    assert health.gate(data, "127.0.0.1", MODELS + ["fails_at_inference"]).ok


def test_the_first_inference_times_go_into_the_hosts_history():
    """The healthy deployment's record carries what the gate measured (pyinfra's @fake host)."""
    from pyinfra.api import deploy

    from tests.support.fakehost import run_fake
    from tritonfleet.serving import health
    from tritonfleet.serving.ops.history import append_record

    @deploy("record")
    def record():
        append_record("/opt/triton", "0123456789abcdef", "u" * 16, "nvcr.io/nvidia/tritonserver:24.08-py3", "deploy")

    health.WARM_LATENCY["@fake/gpu1"] = {"resnet50_onnx": 41.5}
    try:
        _, cmds, state = run_fake(record, {}, {})
    finally:
        health.WARM_LATENCY.pop("@fake/gpu1", None)
    line = next(c for c in cmds if "history.jsonl" in c and "printf" in c)
    assert '"first_inference_ms": {"resnet50_onnx": 41.5}' in line and not state.failed_hosts
    _, cmds, _ = run_fake(record, {}, {})  # no gate measured: no field
    assert "first_inference_ms" not in next(c for c in cmds if "history.jsonl" in c and "printf" in c)
