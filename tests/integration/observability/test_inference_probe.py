"""The continuous inference probe (tritonfleet.observability.inference_probe) against the real
tritonserver: its request from Triton's own JSON configuration is the warm gate's request from
config.pbtxt (the runbook's models, and generated configurations through protobuf's JSON form),
a model that is ready but fails counts failures in a row, a model whose outputs do not fit is
caught, the testbed backend's fault switch makes a model ready-but-broken, a stopped server is
"not up", and the probe's command line from the unit runs as the host would run it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2 as pb

from tests.integration.serving.test_warmup import model
from tests.support.tritonproc import copy_repository, local_server
from tritonfleet.model_repo.validate.lines import parse_config
from tritonfleet.observability import inference_probe as ip
from tritonfleet.observability import telemetry_units as tu
from tritonfleet.serving import warmup
from tritonfleet.settings.defaults import DEFAULTS

MODELS = ["resnet50_onnx", "text_classifier_onnx"]


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("probe")
    repo = copy_repository(work / "repo", kind_cpu=True)
    model(repo, "fails_at_inference", "        raise RuntimeError('CUDA error: an illegal memory access was encountered')\n")
    model(repo, "wrong_shape", "        out = []\n        for r in requests:\n"
                               "            t = pb_utils.Tensor('OUTPUT0', np.zeros((1, 3), dtype=np.float32))\n"
                               "            out.append(pb_utils.InferenceResponse(output_tensors=[t]))\n"
                               "        return out\n")
    served = work / "served"
    shutil.copytree(repo, served)
    faults = work / "faults"
    faults.mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITONFLEET_TESTBED_FAULT_DIR", str(faults))  # the stand-in backend's switch, here only
    try:
        with local_server(served, work) as srv:
            yield srv, repo, faults
    finally:
        mp.undo()


def config_json(srv, name: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/v2/models/{name}/config", timeout=10) as r:
        return json.loads(r.read())


def test_the_request_from_tritons_config_is_the_warm_gates(server):
    srv, repo, _ = server
    for name in [*MODELS, "fails_at_inference"]:
        cfg = config_json(srv, name)
        assert ip.request_for(cfg) == warmup.request_for(parse_config((repo / name / "config.pbtxt").read_text()))


dims = st.lists(st.integers(-1, 4).filter(lambda d: d != 0), min_size=1, max_size=3)
tensors = st.lists(st.tuples(st.sampled_from(sorted(set(pb.DataType.keys()) - {"TYPE_INVALID"})), dims, st.booleans()),
                   min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(max_batch=st.integers(0, 8), inputs=tensors, outputs=tensors, sequence=st.booleans(),
       reshape=st.booleans(), answer=st.lists(st.integers(-1, 4), max_size=4))
def test_generated_configs_give_the_same_request_and_verdict(max_batch, inputs, outputs, sequence, reshape, answer):
    """Differential: a ModelConfig through protobuf's JSON form (what Triton's config API serves;
    int64 dims come as strings there, as numbers from Triton) against the warm gate's protobuf."""
    cfg = pb.ModelConfig(name="m", max_batch_size=max_batch)
    for i, (dtype, d, optional) in enumerate(inputs):
        cfg.input.add(name=f"in{i}", data_type=pb.DataType.Value(dtype), dims=d, optional=optional)
    for i, (dtype, d, _) in enumerate(outputs):
        o = cfg.output.add(name=f"out{i}", data_type=pb.DataType.Value(dtype), dims=d)
        if reshape:
            o.reshape.shape.extend(list(reversed(d)))
    if sequence:
        cfg.sequence_batching.SetInParent()
    as_json = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    assert ip.request_for(as_json) == warmup.request_for(cfg)
    given_outputs = [{"name": f"out{i}", "shape": list(answer)} for i in range(len(outputs))]
    assert ip.shape_problems(as_json, given_outputs) == warmup.shape_problems(cfg, given_outputs)
    # the warm gate's plan as a converged host's run reads it back from the disk (JSON)
    plan = json.loads(json.dumps(warmup.plan_for(cfg)))
    assert warmup.request_from(plan) == ip.request_for(as_json)
    assert warmup.problems_in(plan, given_outputs) == ip.shape_problems(as_json, given_outputs)


def prober(srv, *, key_file: str = "") -> ip.Prober:
    return ip.Prober([(str(srv.http_port), f"http://127.0.0.1:{srv.http_port}")], key_file, 30)


def test_ready_models_pass_and_ready_but_broken_ones_count_failures(server):
    srv, _, _ = server
    p = prober(srv)
    for round_ in (1, 2):
        found = samples(p.round())
        port = str(srv.http_port)
        assert found[("tritonfleet_inference_probe_up", (("triton_port", port),))] == 1
        assert found[("tritonfleet_inference_probe_models", (("triton_port", port),))] == 4
        for m in MODELS:
            labels = (("model", m), ("triton_port", port))
            assert found[("tritonfleet_inference_probe_success", labels)] == 1
            assert found[("tritonfleet_inference_probe_consecutive_failures", labels)] == 0
            assert found[("tritonfleet_inference_probe_latency_seconds", labels)] > 0
        for m in ("fails_at_inference", "wrong_shape"):
            labels = (("model", m), ("triton_port", port))
            assert found[("tritonfleet_inference_probe_success", labels)] == 0
            assert found[("tritonfleet_inference_probe_consecutive_failures", labels)] == round_
            assert ("tritonfleet_inference_probe_last_success_timestamp_seconds", labels) not in found


def test_the_testbed_backends_switch_makes_a_model_ready_but_broken(server):
    srv, _, faults = server
    p = prober(srv)
    labels = (("model", "text_classifier_onnx"), ("triton_port", str(srv.http_port)))
    (faults / "text_classifier_onnx").touch()
    try:
        for n in (1, 2):
            found = samples(p.round())
            assert found[("tritonfleet_inference_probe_consecutive_failures", labels)] == n
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/v2/models/text_classifier_onnx/ready",
                                    timeout=5) as r:
            assert r.status == 200  # "ready"
    finally:
        (faults / "text_classifier_onnx").unlink()
    found = samples(p.round())
    assert found[("tritonfleet_inference_probe_consecutive_failures", labels)] == 0
    assert found[("tritonfleet_inference_probe_success", labels)] == 1


def test_a_server_that_does_not_answer_is_not_up_and_probes_nothing():
    p = ip.Prober([("8000", "http://127.0.0.1:9")], "", 2)
    found = samples(p.round())
    assert found == {("tritonfleet_inference_probe_up", (("triton_port", "8000"),)): 0,
                     ("tritonfleet_inference_probe_models", (("triton_port", "8000"),)): 0}


def test_the_units_command_line_probes_as_the_host_would(server, tmp_path):
    srv, _, _ = server
    settings_ = {**DEFAULTS, "telemetry_textfile_dir": str(tmp_path), "probe_interval": 1}
    args = [a for a, _ in tu.probe_args(settings_, [srv.http_port])]
    assert args[:2] == [tu.PYTHON, tu.PROBE]
    assert f"--triton={srv.http_port}=http://127.0.0.1:{srv.http_port}" in args
    assert f"--key-file={DEFAULTS['triton_api_key_file']}" in args  # restricted APIs by default
    assert f"ExecStart={tu.command_line(tu.probe_args(settings_, [srv.http_port]))}" in \
        tu.probe_unit(settings_, [srv.http_port]).splitlines()
    res = subprocess.run([sys.executable, str(Path(ip.__file__)), *args[2:], "--once"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    found = samples((tmp_path / ip.TEXTFILE).read_text())
    assert found[("tritonfleet_inference_probe_success", (("model", "resnet50_onnx"),
                                                          ("triton_port", str(srv.http_port))))] == 1
    assert "fails_at_inference on port" in res.stderr and "HTTP 500" in res.stderr  # Triton's answer, logged


def test_the_key_goes_in_the_header_triton_expects(tmp_path):
    """A restricted Triton (tritonfleet.serving.apikey) refuses a request without the key: the probe
    sends it as the header tritonfleet.serving.apikey names."""
    from tritonfleet.serving import apikey

    assert ip.HEADER == apikey.HEADER
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    assert ip.Prober([], str(key), 1).key() == "s3cret"
    assert ip.Prober([], str(tmp_path / "missing"), 1).key() == ""
