"""Local side of the model sync: manifest, release ids, per-class overrides."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet import ROOT
from tritonfleet.model_repo import render as models

REPO = ROOT / "files" / "model_repository"


@pytest.fixture
def repo(tmp_path) -> Path:
    dst = tmp_path / "repo"
    shutil.copytree(REPO, dst)
    return dst


def test_release_id_depends_on_content_only(repo, tmp_path):
    a = models.release_id(models.manifest(repo))
    other = tmp_path / "copy"
    shutil.copytree(repo, other)
    assert models.release_id(models.manifest(other)) == a
    (other / "resnet50_onnx" / "config.pbtxt").write_text(
        (other / "resnet50_onnx" / "config.pbtxt").read_text() + "\n# changed\n")
    assert models.release_id(models.manifest(other)) != a


def test_manifest_lists_hidden_files_empty_directories_and_sizes(repo):
    """Everything Triton may read travels: hidden files at any depth, and directories that hold
    nothing (an ensemble's version directory)."""
    (repo / ".git").mkdir()
    (repo / ".git" / "x").write_text("x")
    (repo / "resnet50_onnx" / "1" / ".keep").write_text("")
    (repo / "ens" / "1").mkdir(parents=True)
    man = models.manifest(repo)
    assert "resnet50_onnx/config.pbtxt" in man
    assert man[".git/x"][0] == 1 and man["resnet50_onnx/1/.keep"][0] == 0
    assert man["ens/1/"] == [0, "dir"] and "ens/" not in man
    size, digest = man["resnet50_onnx/1/model.onnx"]
    assert size == (repo / "resnet50_onnx/1/model.onnx").stat().st_size and len(digest) == 64


def test_overrides_keep_empty_directories_and_hidden_files(repo, tmp_path):
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "resnet50_onnx" / "1" / ".keep").write_text("")
    over = {"resnet50_onnx": {"max_batch_size": 8}}
    out = models.render(repo, over, tmp_path / "rendered")
    assert (out / "ens" / "1").is_dir() and (out / "resnet50_onnx" / "1" / ".keep").is_file()
    assert {p for p in models.manifest(out) if "config" not in p} == {p for p in models.manifest(repo) if "config" not in p}


def test_overrides_replace_fields_through_the_schema(repo, tmp_path):
    over = {"resnet50_onnx": {"instance_group": [{"count": 4, "kind": "KIND_CPU"}]}}
    out = models.render(repo, over, tmp_path / "rendered")
    text = (out / "resnet50_onnx" / "config.pbtxt").read_text()
    assert "KIND_CPU" in text and "count: 4" in text and "KIND_GPU" not in text
    assert "preferred_batch_size: 8" in text  # the rest is kept
    # untouched model: byte-identical
    assert (out / "text_classifier_onnx/config.pbtxt").read_bytes() == (
        repo / "text_classifier_onnx/config.pbtxt").read_bytes()
    assert models.render(repo, {}, tmp_path / "r2") == repo


def test_override_of_unknown_model_or_field_is_an_error(repo, tmp_path):
    with pytest.raises(ValueError, match="nosuch"):
        models.render(repo, {"nosuch": {"max_batch_size": 1}}, tmp_path / "r")
    with pytest.raises(Exception, match="no_such_field"):
        models.render(repo, {"resnet50_onnx": {"no_such_field": 1}}, tmp_path / "r")


def test_hash_cache_answers_unchanged_files_and_forgets_old_versions(repo, tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    first = models.manifest(repo)
    cache = json.loads((tmp_path / "cache" / "sha256-cache.json").read_text())
    assert len(cache) == len(first)
    # an unchanged file is answered from the cache (its content is not read again)
    calls = []
    real = models.file_sha256
    monkeypatch.setattr(models, "file_sha256", lambda p, c=None: calls.append(p) or real(p, c))
    cfg = repo / "resnet50_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "\n# changed\n")
    second = models.manifest(repo)
    assert calls == [cfg]
    assert second["resnet50_onnx/config.pbtxt"] != first["resnet50_onnx/config.pbtxt"]
    cache = json.loads((tmp_path / "cache" / "sha256-cache.json").read_text())
    assert len(cache) == len(first), "the entry of the file's old version is dropped"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.binary(min_size=1, max_size=64), data=st.data(),
       how=st.sampled_from(["rename over it", "copy with preserved times", "rewrite in place, mtime set back"]))
def test_a_replaced_file_with_the_same_size_and_mtime_is_hashed_again(tmp_path, old, data, how):
    """The cache never answers for a file that was replaced by another of the same size and mtime."""
    import hashlib
    import time

    new = data.draw(st.binary(min_size=len(old), max_size=len(old)).filter(lambda b: b != old), label="new")
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    repo = case / "repo" / "m" / "1"
    repo.mkdir(parents=True)
    f = repo / "model.onnx"
    f.write_bytes(old)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "CACHE_DIR", case / "cache")
        assert models.manifest(case / "repo")["m/1/model.onnx"][1] == hashlib.sha256(old).hexdigest()
        before = f.stat()
        time.sleep(0.02)  # past the clock tick of the hash above (docs/hardening.md)
        other = case / "other"
        other.write_bytes(new)
        os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
        if how == "rename over it":
            other.replace(f)
        elif how == "copy with preserved times":
            shutil.copy2(other, f)
        else:
            f.write_bytes(new)
            os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = f.stat()
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        assert models.manifest(case / "repo")["m/1/model.onnx"] == [len(new), hashlib.sha256(new).hexdigest()]
        # and unchanged from now on, it is answered from the cache again
        assert models.manifest(case / "repo")["m/1/model.onnx"][1] == hashlib.sha256(new).hexdigest()
