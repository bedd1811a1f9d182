"""The validator on the corpus under tests/corpus.

tests/corpus/{good,bad,limits}/<case>/ are small model repositories; manifest.json says what
each is about, which rules the validator must report for a bad one, and where this server's
verdict differs on purpose ("triton": "accepts" for a repository that is bad only statically,
"limits/" for faults only running the model shows). Each case loaded by the real tritonserver and
the verdicts compared (a repository Triton refuses must never pass the validator):
tests/integration/model_repo/test_validate.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tritonfleet import ROOT
from tritonfleet.cli import main
from tritonfleet.model_repo.validate import (
    RULES,
    Problem,
    list_models,
    validate_config_text,
    validate_repository,
)

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
CASES: dict[str, dict] = MANIFEST["cases"]
PYTHON_CFG = (CORPUS / "good/versions/identity/config.pbtxt").read_text()  # the plain one


def kind(case: str) -> str:
    return case.split("/", 1)[0]


def triton_expected(case: str) -> bool:
    """Whether the server here loads ``case``, as the manifest says."""
    entry = CASES[case]
    if "triton" in entry:
        return entry["triton"] == "accepts"
    return kind(case) == "good"


# ---- the corpus ------------------------------------------------------------------------------

def test_manifest_lists_every_case_and_each_case_is_explained():
    on_disk = {f"{k.name}/{c.name}" for k in CORPUS.iterdir() if k.is_dir() and not k.name.startswith((".", "_"))
               for c in k.iterdir() if c.is_dir()}
    assert on_disk == set(CASES), on_disk ^ set(CASES)
    assert {kind(c) for c in CASES} == {"good", "bad", "limits"}
    for case, entry in CASES.items():
        assert entry["about"], case
        assert ("rules" in entry) == (kind(case) == "bad"), case
        if "triton" in entry:
            assert entry["triton"] in ("accepts", "rejects") and entry.get("why"), case
    # every rule is shown by a corpus case, or by a unit test below where a repository
    # cannot hold the fault (git keeps no absolute or broken symlinks well, nor bad bytes, FIFOs,
    # sockets or link cycles: what a repository may contain is tested on generated trees in
    # tests/unit/model_repo/test_contents.py)
    corpus_rules = {r for e in CASES.values() for r in e.get("rules", [])}
    unit_tested = {"unchecked", "symlink-cycle", "special-file", "file-name", "unreadable", "broken-symlink", "encoding", "onnx-model", "input-name", "output-duplicate", "output-data-type",
                   "output-dims", "output-reshape", "output-format", "output-shape-tensor",
                   "batch-output", "sequence-batching"}
    assert corpus_rules | unit_tested == set(RULES)
    assert not corpus_rules & unit_tested


def test_onnx_files_are_what_make_onnx_writes():
    spec = importlib.util.spec_from_file_location("make_onnx", CORPUS / "make_onnx.py")
    make_onnx = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_onnx)
    assert MANIFEST["onnx"]
    for rel, variant in MANIFEST["onnx"].items():
        model = make_onnx.identity_model(**make_onnx.VARIANTS[variant])
        assert (CORPUS / rel).read_bytes() == model.SerializeToString(), rel


@pytest.mark.parametrize("case", sorted(CASES))
def test_validator_verdict(case):
    problems = validate_repository(CORPUS / case, gpus=0)
    if kind(case) == "bad":
        assert {p.rule for p in problems} == set(CASES[case]["rules"]), [str(p) for p in problems]
        for p in problems:
            assert p.message and p.rule and str(p).startswith(p.path)
    else:
        assert problems == [], [str(p) for p in problems]


# ---- problems: where and what ----------------------------------------------------------------

def test_problem_names_model_file_line_and_rule():
    (p,) = validate_repository(CORPUS / "bad/parse-error")
    assert (p.model, p.file, p.line, p.rule) == ("identity", "config.pbtxt", 2, "parse")
    assert str(p).startswith("identity/config.pbtxt:2: [parse] ")
    assert p.as_dict() == {"model": "identity", "file": "config.pbtxt", "line": 2, "rule": "parse",
                           "message": p.message}


def test_semantic_problems_point_at_their_line():
    (p,) = validate_repository(CORPUS / "bad/zero-dim")
    assert p.line == 7 and "dims: [ 4, 0 ]" in (CORPUS / "bad/zero-dim/identity/config.pbtxt") \
        .read_text().splitlines()[p.line - 1]
    (p,) = validate_repository(CORPUS / "bad/preferred-over-max")
    assert p.line == 24 and "[preferred-batch-size]" in str(p) and "max_batch_size 8" in p.message
    (p,) = validate_repository(CORPUS / "bad/python-syntax")
    assert (p.file, p.line) == ("1/model.py", 2)


def test_repository_problem_string():
    p = Problem("", "", None, "repository", "no model directories in the repository")
    assert str(p) == ".: [repository] no model directories in the repository"


def test_config_text_alone():
    assert validate_config_text(PYTHON_CFG, "identity") == []
    (p,) = validate_config_text(PYTHON_CFG.replace("max_batch_size: 8", "max_batch_size: -2"), "identity")
    assert (p.rule, p.line) == ("max-batch-size", 2)
    (p,) = validate_config_text('name: "x"\n' + PYTHON_CFG, "identity")
    assert p.rule == "name"
    assert [p.rule for p in validate_config_text("max_batch_size: [", "m")] == ["parse"]
    ensemble = (CORPUS / "good/ensemble/pipeline/config.pbtxt").read_text()
    assert validate_config_text(ensemble, "pipeline", other_models={"identity": PYTHON_CFG}) == []
    assert {p.rule for p in validate_config_text(ensemble, "pipeline")} == {"ensemble-step"}


def test_gpu_count_is_checked_only_when_known():
    gpu = PYTHON_CFG.replace("kind: KIND_CPU", "kind: KIND_GPU\n    gpus: [ 1 ]")
    assert validate_config_text(gpu, "identity") == []
    assert validate_config_text(gpu, "identity", gpus=2) == []
    (p,) = validate_config_text(gpu, "identity", gpus=1)
    assert p.rule == "instance-gpus" and "gpu 1" in p.message


def _copy(case: str, dest: Path) -> Path:
    shutil.copytree(CORPUS / case, dest, symlinks=True)
    return dest


def test_absolute_and_broken_symlinks_are_refused(tmp_path):
    repo = _copy("good/python", tmp_path / "repo")
    model_py = repo / "identity/1/model.py"
    (repo / "identity/1/copy.py").symlink_to(model_py)  # absolute, though inside
    (repo / "identity/1/gone.txt").symlink_to("nothing-here.txt")
    problems = {(p.file, p.rule) for p in validate_repository(repo)}
    assert problems == {("1/copy.py", "unsafe-path"), ("1/gone.txt", "broken-symlink")}
    (repo / "identity/1/copy.py").unlink()
    (repo / "identity/1/copy.py").symlink_to("model.py")  # relative, inside: fine
    (repo / "identity/1/gone.txt").unlink()
    assert validate_repository(repo) == []


def test_config_that_is_not_utf8(tmp_path):
    repo = _copy("good/python", tmp_path / "repo")
    (repo / "identity/config.pbtxt").write_bytes(b'backend: "pyth\xff"\n')
    assert [p.rule for p in validate_repository(repo)] == ["encoding"]


def test_unsafe_default_model_filename():
    cfg = PYTHON_CFG + 'default_model_filename: "../../model.py"\n'
    (p,) = validate_config_text(cfg, "identity", model_dir=CORPUS / "good/python/identity")
    assert p.rule == "unsafe-path"


def test_hidden_files_at_the_top_are_ignored_hidden_directories_are_models(tmp_path):
    repo = _copy("good/python", tmp_path / "repo")
    (repo / ".gitkeep").write_text("")
    assert validate_repository(repo) == []
    (repo / ".git").mkdir()
    (p,) = validate_repository(repo)
    assert (p.model, p.rule) == (".git", "config-missing") and "hidden" in p.message


def test_missing_repository():
    (p,) = validate_repository(CORPUS / "nonexistent")
    assert p.rule == "repository"


# ---- the CLI -----------------------------------------------------------------------------------

def _cli(*args, cwd: Path | None = None):
    runner = CliRunner()
    old = Path.cwd()
    try:
        if cwd:
            os.chdir(cwd)
        return runner.invoke(main, ["validate", *args])
    finally:
        os.chdir(old)


def test_cli_default_repository_is_files_model_repository():
    assert (ROOT / "files/model_repository").is_dir()
    res = _cli(cwd=ROOT)
    assert res.exit_code == 0, res.output
    assert res.output.startswith("files/model_repository: valid: ")
    for model in list_models(ROOT / "files/model_repository"):
        assert model in res.output


def test_cli_valid_and_json():
    res = _cli(str(CORPUS / "good/ensemble"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data == {"repository": str(CORPUS / "good/ensemble"), "valid": True,
                    "models": ["identity", "pipeline"], "problems": []}


def test_cli_invalid_prints_one_problem_a_line_and_exits_1():
    repo = CORPUS / "bad/preferred-over-max"
    res = _cli(str(repo))
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines == [f"{repo}/identity/config.pbtxt:24: [preferred-batch-size] "
                     "preferred_batch_size 16 must be > 0 and <= max_batch_size 8"]
    assert "invalid: 1 problem(s) in identity" in res.stderr


def test_cli_invalid_json():
    res = _cli(str(CORPUS / "bad/ensemble-missing-step"), "--json")
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["valid"] is False and data["models"] == ["identity", "pipeline"]
    (p,) = data["problems"]
    assert p["model"] == "pipeline" and p["file"] == "config.pbtxt" and p["rule"] == "ensemble-step"
    assert p["path"] == "pipeline/config.pbtxt" and isinstance(p["line"], int)
    assert "identity_v2" in p["message"]


def test_cli_gpus_option():
    repo = CORPUS / "bad/gpu-on-cpu-host"
    assert _cli(str(repo)).exit_code == 0
    res = _cli(str(repo), "--gpus", "0")
    assert res.exit_code == 1 and "[instance-gpus]" in res.stdout
    assert _cli(str(repo), "--gpus", "1").exit_code == 0


def test_cli_extra_backend():
    repo = CORPUS / "bad/unknown-backend"
    assert _cli(str(repo)).exit_code == 1
    assert _cli(str(repo), "--backend", "onnx").exit_code == 0


def test_cli_usage_errors_exit_2(tmp_path):
    res = _cli(str(tmp_path / "nonexistent"))
    assert res.exit_code == 2 and "no such directory" in res.stderr
    (tmp_path / "file").write_text("")
    res = _cli(str(tmp_path / "file"))
    assert res.exit_code == 2 and "not a directory" in res.stderr
    assert _cli("--no-such-option").exit_code == 2
    assert _cli("a", "b").exit_code == 2
    res = _cli(cwd=tmp_path)  # no files/model_repository here
    assert res.exit_code == 2 and "files/model_repository" in res.stderr


OUTPUT_BLOCK = 'output [\n  {\n    name: "OUTPUT0"\n    data_type: TYPE_FP32\n    dims: [ 4 ]\n  }\n]'


@pytest.mark.parametrize("rule, old, new", [
    ("input-name", '    name: "INPUT0"\n', ""),
    ("output-duplicate", OUTPUT_BLOCK, OUTPUT_BLOCK.replace("  }\n]", '  },\n  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }\n]')),
    ("output-data-type", OUTPUT_BLOCK, OUTPUT_BLOCK.replace("    data_type: TYPE_FP32\n", "")),
    ("output-dims", OUTPUT_BLOCK, OUTPUT_BLOCK.replace("dims: [ 4 ]", "dims: [ -3 ]")),
    ("output-reshape", OUTPUT_BLOCK, OUTPUT_BLOCK.replace("dims: [ 4 ]", "dims: [ 4 ]\n    reshape: { shape: [ 5 ] }")),
    ("output-format", OUTPUT_BLOCK, OUTPUT_BLOCK.replace("dims: [ 4 ]", "dims: [ 4 ]\n    is_non_linear_format_io: true")),
    ("output-shape-tensor", OUTPUT_BLOCK, OUTPUT_BLOCK.replace("dims: [ 4 ]", "dims: [ 4 ]\n    is_shape_tensor: true")),
    ("batch-output", "max_batch_size: 8", 'max_batch_size: 8\nbatch_output [ { target_name: [ "OUT9" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: [ "INPUT0" ] } ]'),
    ("sequence-batching", "max_batch_size: 8", "max_batch_size: 8\nsequence_batching { direct { minimum_slot_utilization: 1.5 } }"),
])
def test_rules_without_a_corpus_case(rule, old, new):
    assert old in PYTHON_CFG
    problems = validate_config_text(PYTHON_CFG.replace(old, new), "identity")
    assert [p.rule for p in problems] == [rule], [str(p) for p in problems]
    assert problems[0].line is not None


def test_unreadable_onnx_model(tmp_path):
    repo = _copy("good/onnx", tmp_path / "repo")
    (repo / "identity/1/model.onnx").write_bytes(b"not a model")
    (p,) = validate_repository(repo)
    assert (p.rule, p.file) == ("onnx-model", "1/model.onnx")
