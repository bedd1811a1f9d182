"""A model repository found valid is not validated again while nothing the verdict depends on
changed (tritonfleet.model_repo.verdicts); the schema module loads without tritonclient.grpc's
client (tritonfleet.core.triton_schema)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tritonfleet import ROOT
from tritonfleet.model_repo import render as models
from tritonfleet.model_repo import validate, verdicts


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    r = tmp_path / "repo"
    shutil.copytree(ROOT / "files" / "model_repository", r)
    return r


def test_a_valid_repository_is_validated_once_until_it_changes(repo, monkeypatch):
    calls = []
    real = validate.validate_repository

    def counted(path, gpus=None):
        calls.append((path, gpus))
        return real(path, gpus=gpus)

    monkeypatch.setattr(validate, "validate_repository", counted)
    assert verdicts.validate_repository(repo) == [] and len(calls) == 1
    assert verdicts.validate_repository(repo) == [] and len(calls) == 1  # remembered
    assert verdicts.validate_repository(repo, gpus=2) == [] and len(calls) == 2  # another GPU count
    cfg = repo / "resnet50_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "\n# changed\n")
    assert verdicts.validate_repository(repo) == [] and len(calls) == 3  # another content


def test_a_changed_validator_validates_again(repo, monkeypatch, tmp_path):
    """The validator's source is part of the key: each module of the validate package and the
    schema loader (a copy of them here, changed one at a time)."""
    from tritonfleet import resource

    pkg = tmp_path / "pkg"
    shutil.copytree(resource("model_repo", "validate"), pkg / "model_repo" / "validate",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "core").mkdir()
    shutil.copy(resource("core", "triton_schema.py"), pkg / "core")
    monkeypatch.setattr(verdicts, "resource", lambda *parts: pkg.joinpath(*parts))
    calls = []
    real = validate.validate_repository
    monkeypatch.setattr(validate, "validate_repository", lambda path, gpus=None: calls.append(path) or real(path))
    assert verdicts.validate_repository(repo) == [] and verdicts.validate_repository(repo) == []
    assert len(calls) == 1
    for i, changed in enumerate(["model_repo/validate/config_rules.py", "model_repo/validate/tables.py",
                                 "core/triton_schema.py"], 2):
        (pkg / changed).write_text((pkg / changed).read_text() + "\n# changed\n")
        assert verdicts.validate_repository(repo) == [] and len(calls) == i, changed


def test_an_invalid_repository_is_never_remembered(repo, monkeypatch):
    cfg = repo / "resnet50_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size", "max_batch_sighs"))
    first = verdicts.validate_repository(repo)
    assert first and first == validate.validate_repository(repo)
    monkeypatch.setattr(validate, "validate_repository", lambda path, gpus=None: ["still broken"])
    assert verdicts.validate_repository(repo) == ["still broken"]


def test_the_schema_loads_without_the_grpc_client():
    code = ("import sys; from tritonfleet.core.triton_schema import model_config; m = model_config(); "
            "c = m.ModelConfig(name='x', max_batch_size=4); "
            "print(c.max_batch_size, 'numpy' in sys.modules, 'grpc' in sys.modules, 'tritonclient.grpc' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["4", "False", "False", "False"]
    # the client package, imported after it, uses the same module
    code = ("from tritonfleet.core.triton_schema import model_config; m = model_config(); "
            "import tritonclient.grpc as g; print(g.model_config_pb2 is m)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "True"


def test_a_repository_that_is_no_release_gets_the_validators_words(repo):
    """A broken link cannot be hashed into a key: the validator runs and names the problem (no
    exception from the key, nothing remembered)."""
    (repo / "resnet50_onnx" / "labels.txt").symlink_to("missing-labels.txt")
    problems = verdicts.validate_repository(repo)
    assert any("broken-symlink" in str(p) for p in problems), problems
    assert not (models.CACHE_DIR / "validated").exists()
