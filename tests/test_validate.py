"""`tritonfleet validate` against the real tritonserver: a repository Triton refuses must
never pass the validator. Each case is a small repository built from the runbook's models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tritonproc import MODEL_REPOSITORY, local_server

from tritonfleet import ROOT
from tritonfleet.validate import validate_repository

TC = "text_classifier_onnx"


def copy_repository(dest: Path, kind_cpu: bool = True) -> Path:
    """The runbook's repository, text kept as written, instances on CPU (no GPU here)."""
    shutil.copytree(MODEL_REPOSITORY, dest)
    for cfg in dest.glob("*/config.pbtxt"):
        text = cfg.read_text()
        assert "kind: KIND_GPU\n    gpus: [ 0 ]" in text
        cfg.write_text(text.replace("kind: KIND_GPU\n    gpus: [ 0 ]", "kind: KIND_CPU"))
    return dest


def _edit(repo: Path, model: str, old: str, new: str) -> None:
    cfg = repo / model / "config.pbtxt"
    text = cfg.read_text()
    assert old in text, (old, text)
    cfg.write_text(text.replace(old, new, 1))


def _only_text_classifier(repo: Path) -> None:
    shutil.rmtree(repo / "resnet50_onnx")


CASES = {
    "good": lambda r: None,
    "good-one-model": _only_text_classifier,
    "name-mismatch": lambda r: _edit(r, TC, 'name: "text_classifier_onnx"', 'name: "other"'),
    "parse-error": lambda r: _edit(r, TC, "max_batch_size: 32", "max_batch_size 32 {"),
    "unknown-field": lambda r: _edit(r, TC, "max_batch_size: 32", "max_batch_size: 32\nbatch_size: 4"),
    "preferred-over-max": lambda r: _edit(r, TC, "preferred_batch_size: [ 4, 8, 16, 32 ]",
                                          "preferred_batch_size: [ 4, 8, 16, 64 ]"),
    "no-version-dir": lambda r: shutil.rmtree(r / TC / "1"),
    "no-model-file": lambda r: (r / TC / "1" / "model.onnx").unlink(),
    "no-config": lambda r: (r / TC / "config.pbtxt").unlink(),
    "unknown-platform": lambda r: _edit(r, TC, 'platform: "onnxruntime_onnx"', 'platform: "onnx_magic"'),
    "no-platform": lambda r: _edit(r, TC, 'platform: "onnxruntime_onnx"', ""),
    "platform-backend-mismatch": lambda r: _edit(r, TC, 'platform: "onnxruntime_onnx"',
                                                 'platform: "onnxruntime_onnx"\nbackend: "pytorch"'),
    "missing-data-type": lambda r: _edit(r, TC, "data_type: TYPE_FP32", ""),
    "zero-dim": lambda r: _edit(r, TC, "dims: [ 2 ]", "dims: [ 0 ]"),
    "missing-dims": lambda r: _edit(r, TC, "dims: [ 2 ]", ""),
    "no-outputs": lambda r: _edit(r, TC, 'output [\n  {\n    name: "probabilities"\n    data_type: TYPE_FP32\n    dims: [ 2 ]\n  }\n]', ""),
    "duplicate-input": lambda r: _edit(r, TC, 'name: "attention_mask"', 'name: "input_ids"'),
    "cpu-group-with-gpus": lambda r: _edit(r, TC, "kind: KIND_CPU", "kind: KIND_CPU\n    gpus: [ 0 ]"),
    "negative-batch": lambda r: _edit(r, TC, "max_batch_size: 32", "max_batch_size: -1"),
}


def build(case: str, base: Path) -> Path:
    repo = copy_repository(base / case / "repo", kind_cpu=True)
    CASES[case](repo)
    return repo


def triton_accepts(repo: Path, work: Path) -> tuple[bool, str]:
    work.mkdir(parents=True, exist_ok=True)
    try:
        with local_server(repo, work, wait=False) as srv:
            try:
                srv.wait_ready(timeout=60)
            except (RuntimeError, TimeoutError):
                return False, srv.log()[-600:]
            models = [d.name for d in repo.iterdir() if d.is_dir()]
            return all(srv.model_ready(m) for m in models), srv.log()[-600:]
    except RuntimeError as e:
        return False, str(e)[-600:]


# Cases the validator refuses on purpose although this server loads them: a model with no
# outputs answers nothing (the real onnxruntime backend checks outputs against the model).
STRICTER = {"no-outputs"}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    base = tmp_path_factory.mktemp("corpus")

    def one(case):
        repo = build(case, base)
        ours = validate_repository(repo)
        theirs, log = triton_accepts(repo, base / case / "work")
        return case, (not ours, theirs, ours, log)

    with ThreadPoolExecutor(4) as pool:
        out = dict(pool.map(one, CASES))
    agree = sum(1 for ok, t, _, _ in out.values() if ok == t)
    print(f"\nvalidator vs tritonserver: {agree}/{len(out)} cases agree")
    return out


def test_no_false_accept(verdicts):
    false_accepts = {c: log for c, (ok, theirs, _, log) in verdicts.items() if ok and not theirs}
    assert not false_accepts, false_accepts


def test_good_repositories_pass_both(verdicts):
    for case in ("good", "good-one-model"):
        ok, theirs, problems, log = verdicts[case]
        assert ok and theirs, (case, problems, log)


def test_agreement_is_complete(verdicts):
    disagree = {c: [str(p) for p in probs] for c, (ok, t, probs, _) in verdicts.items() if ok != t}
    assert set(disagree) == STRICTER, disagree


def test_errors_name_model_file_line_and_rule(tmp_path):
    repo = build("parse-error", tmp_path)
    (p,) = validate_repository(repo)
    assert (p.model, p.file, p.rule) == (TC, f"{TC}/config.pbtxt", "parse")
    assert p.line == 3
    assert str(p).startswith(f"{TC}/config.pbtxt:3: [parse]")


def test_symlink_out_of_the_repository_is_refused(tmp_path):
    repo = copy_repository(tmp_path / "repo", kind_cpu=True)
    os.symlink("/etc/passwd", repo / TC / "1" / "vocab.txt")
    problems = validate_repository(repo)
    assert [p.rule for p in problems] == ["unsafe-path"]


def _cli(*args):
    return subprocess.run([str(Path(sys.executable).parent / "tritonfleet"), "validate", *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_cli_exit_codes_and_json(tmp_path):
    res = _cli()
    assert res.returncode == 0, res.stderr
    assert "2 models valid" in res.stdout
    bad = build("preferred-over-max", tmp_path)
    res = _cli(str(bad), "--json")
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert data["valid"] is False and data["problems"][0]["rule"] == "preferred-batch-size"
    assert data["models"] == ["resnet50_onnx", TC]
    res = _cli(str(tmp_path / "nonexistent"))
    assert res.returncode == 2 and "no such directory" in res.stderr
