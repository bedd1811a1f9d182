"""The warm inference gate on a deployed test host: a model that Triton reports ready but that
fails its first inference fails the host at the health gate with Triton's answer (a plain deploy
reports it and prints the rollback); the runbook's models pass it with their first-inference
times printed."""

from __future__ import annotations

import requests

from tests.support.testbed import pyinfra, repository_copy

CONFIG = """name: "fails_at_inference"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
ERROR = "CUDA error: an illegal memory access was encountered"


def test_ready_but_failing_model_fails_the_health_gate(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[2]
    repo = repository_copy(tmp_path / "repo")
    d = repo / "fails_at_inference"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(CONFIG)
    (d / "1" / "model.py").write_text("class TritonPythonModel:\n    def execute(self, requests):\n"
                                      f"        raise RuntimeError({ERROR!r})\n")
    try:
        res, _ = pyinfra("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}")
        assert res.returncode != 0, res.stderr[-3000:]
        assert "model fails_at_inference is ready but its first inference failed" in res.stderr, res.stderr[-3000:]
        assert ERROR in res.stderr and "HTTP 500" in res.stderr
        # Triton itself calls it ready: only the inference tells
        r = requests.get(f"http://{h.address}:8000/v2/models/fails_at_inference/ready", timeout=5)
        assert r.status_code == 200
        assert "deploys/rollback.py --limit " + h.name in res.stderr  # the report's fix
    finally:
        res, _ = pyinfra("deploys/models.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-3000:]
    assert "first inference: resnet50_onnx " in res.stderr and "text_classifier_onnx " in res.stderr
