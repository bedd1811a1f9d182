"""A model repository found valid is not validated again while nothing the verdict depends on
changed (tritonfleet.model_repo.verdicts); the schema module loads without tritonclient.grpc's
client (tritonfleet.core.triton_schema)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet import ROOT
from tritonfleet.model_repo import derived, validate, verdicts
from tritonfleet.model_repo import render as models


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
    monkeypatch.setattr(derived, "resource", lambda *parts: pkg.joinpath(*parts))
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


# --------------------------------------------------------------------------- parsed once per input

overrides = st.fixed_dictionaries({}, optional={
    "max_batch_size": st.integers(0, 256),
    "dynamic_batching": st.fixed_dictionaries({}, optional={
        "preferred_batch_size": st.lists(st.integers(1, 64), max_size=4),
        "max_queue_delay_microseconds": st.integers(0, 10**6)}),
    "instance_group": st.lists(st.fixed_dictionaries({"count": st.integers(1, 8),
                                                      "kind": st.sampled_from(["KIND_GPU", "KIND_CPU"])}),
                               min_size=1, max_size=2),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(override=overrides)
def test_an_applied_override_is_remembered_and_is_what_protobuf_gives(repo, monkeypatch, override):
    """render.apply_overrides: the first call parses and remembers, the second reads what was
    remembered (no protobuf), both exactly the parse's answer."""
    text = (repo / "resnet50_onnx" / "config.pbtxt").read_text()
    want = models._apply_overrides(text, override)
    with monkeypatch.context() as m:
        calls = []
        real = models._apply_overrides
        m.setattr(models, "_apply_overrides", lambda t, o: calls.append(o) or real(t, o))
        assert models.apply_overrides(text, override) == want
        assert models.apply_overrides(text, override) == want
        assert len(calls) <= 1  # one parse at most (none once an earlier example remembered it)


def test_an_override_is_parsed_again_when_what_it_depends_on_changed(repo, monkeypatch):
    """A refusal is never remembered; protobuf's version, the schema and tritonfleet's version are
    part of the key."""
    from google import protobuf

    from tritonfleet.core import triton_schema

    text = (repo / "resnet50_onnx" / "config.pbtxt").read_text()
    calls = []
    real = models._apply_overrides
    monkeypatch.setattr(models, "_apply_overrides", lambda t, o: calls.append(o) or real(t, o))
    for _ in range(2):
        with pytest.raises(Exception, match="max_batch_sighs"):
            models.apply_overrides(text, {"max_batch_sighs": 3})
    assert len(calls) == 2
    models.apply_overrides(text, {"max_batch_size": 3})
    models.apply_overrides(text, {"max_batch_size": 3})
    assert len(calls) == 3
    monkeypatch.setattr(protobuf, "__version__", "0.0.0")
    models.apply_overrides(text, {"max_batch_size": 3})
    assert len(calls) == 4
    schema = repo.parent / "model_config_pb2.py"
    schema.write_text(triton_schema.schema_file().read_text() + "\n# another release\n")
    monkeypatch.setattr(triton_schema, "schema_file", lambda: schema)
    models.apply_overrides(text, {"max_batch_size": 3})
    assert len(calls) == 5
    monkeypatch.setattr(derived, "__version__", "0.0.0")
    models.apply_overrides(text, {"max_batch_size": 3})
    assert len(calls) == 6


def test_the_engines_per_compute_capability_are_read_once_per_content(repo, monkeypatch):
    calls = []
    real = validate.tensorrt_cc_model_filenames
    monkeypatch.setattr(validate, "tensorrt_cc_model_filenames", lambda r: calls.append(r) or real(r))
    want = real(repo)
    assert verdicts.plan_cc_filenames(repo) == want and verdicts.plan_cc_filenames(repo) == want
    assert len(calls) == 1
    cfg = repo / "resnet50_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "\n# changed\n")
    assert verdicts.plan_cc_filenames(repo) == real(repo) and len(calls) == 2


NO_OP = """
import sys
from pathlib import Path
from tritonfleet.model_repo import render, verdicts
from tritonfleet.serving import warmup
repo = Path(sys.argv[1])
rendered = render.render(repo, {"resnet50_onnx": {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}})
assert verdicts.validate_repository(rendered) == []
verdicts.plan_cc_filenames(rendered)
plans = [warmup.prepared(rendered, m)[0] for m in render.model_names(rendered)]
print(sorted(m for m in sys.modules if m.startswith(("google.protobuf.", "tritonfleet.model_repo.validate"))))
print(plans)
"""


