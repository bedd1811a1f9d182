"""Bad input is refused before any host is touched (pyinfra CLI, @fake hosts)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritonfleet import ROOT

PYINFRA = str(Path(sys.executable).parent / "pyinfra")


@pytest.fixture
def project(tmp_path):
    (tmp_path / "inventories").mkdir()
    shutil.copytree(ROOT / "inventories" / "group_data", tmp_path / "inventories" / "group_data")
    shutil.copytree(ROOT / "files", tmp_path / "files")
    (tmp_path / "inventories" / "fake.py").write_text(
        'fake = {"fake_delay": 0, "fake_delay_jitter": 0}\n'
        't4 = [("@fake/t4-a", fake)]\n'
        'l4 = [("@fake/l4-a", fake)]\n'
    )
    return tmp_path


def run(project, *data, deploy="deploys/triton.py"):
    args = [PYINFRA, "-y", "inventories/fake.py", str(ROOT / deploy)]
    for d in data:
        args[2:2] = ["--data", d]
    return subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=120)


def test_unsupported_driver_branch_is_refused(project):
    res = run(project, "nvidia_driver_branch=550")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "pre-flight failed, no host was changed" in out
    assert "550" in out and "24.08" in out
    assert "Starting operation" not in out


def test_invalid_model_repository_is_refused(project):
    cfg = project / "files/model_repository/resnet50_onnx/config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size: 64", "max_batch_size: 4"))
    res = run(project)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "pre-flight failed, no host was changed" in out
    assert "resnet50_onnx/config.pbtxt" in out and "preferred-batch-size" in out
    assert "tritonfleet validate" in out
    assert "Starting operation" not in out


def test_host_without_gpu_class_is_refused(project):
    (project / "inventories" / "fake.py").write_text(
        'hosts = [("@fake/nogroup", {"fake_delay": 0})]\n')
    res = run(project)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "no gpu_class" in out and "@fake/nogroup" in out


def test_unknown_model_in_overrides_is_refused(project):
    res = run(project, 'model_overrides={"nosuch": {"max_batch_size": 1}}')
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "nosuch" in out and "no host was changed" in out
