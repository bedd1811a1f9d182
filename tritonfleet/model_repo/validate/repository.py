"""The repository as tritonserver walks it: its model directories and their names, version
directories and the versions a policy loads, the backend a model resolves to (no auto-complete),
unsafe entries; and the entry points that run every rule (``validate_repository``,
``validate_config_text``, ``tensorrt_cc_model_filenames``)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from google.protobuf import text_format

from .. import contents
from .checker import Checker
from .lines import parse_config
from .model_dirs import autocomplete, list_models
from .tables import ENSEMBLE, KNOWN_BACKENDS, Problem

# ---- what the repository may contain --------------------------------------------------------


def _contents(repo: Path, add: Callable[..., None]) -> None:
    """Every entry tritonfleet.model_repo.contents refuses (the deploy refuses the same ones)."""
    for r in contents.scan(repo)[1]:
        parts = r.rel.split("/")
        add(parts[0] if parts[0] != "." else "", "/".join(parts[1:]), None, r.rule, r.message)


#: What a model directory may be called (Triton itself refuses little more than names that escape
#: the repository; the fleet puts names in URLs and in commands run on the hosts).
MODEL_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")


def _check_model_name(name: str, add) -> bool:
    if ".." in name or "/" in name or "\\" in name:
        add(
            name,
            "",
            None,
            "model-name",
            f"model name '{name}' contains '..': newer Triton refuses path traversal in names; rename the directory",
        )
        return False
    if not name.strip() or any(c.isspace() for c in name):
        add(
            name,
            "",
            None,
            "model-name",
            f"model name '{name}' contains white space: Triton cannot start its instances "
            "(the python stub fails to parse the name); rename the directory",
        )
        return False
    if not MODEL_NAME.fullmatch(name):
        bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "_.-"))})
        why = f"has {', '.join(repr(c) for c in bad)}" if bad else "starts with '-'"
        add(
            name,
            "",
            None,
            "model-name",
            f"model name {name!r} {why}: model names are letters, digits, '_', '.' and '-' (not first), "
            "because the name is part of Triton's URLs (/v2/models/<name>) and of commands run on the "
            "hosts; rename the directory",
        )
        return False
    return True


def validate_repository(
    repo: str | os.PathLike,
    *,
    gpus: int | None = None,
    backends: Iterable[str] = (),
    onnx_signatures: bool = True,
) -> list[Problem]:
    """Every problem Triton would refuse the model repository ``repo`` for; [] when valid.

    ``gpus``: the number of GPUs of the hosts (None: not known, GPU ids are not checked; 0:
    KIND_GPU instances are refused as on a host without GPU). ``backends``: backends the
    Triton image has beyond :data:`KNOWN_BACKENDS`. ``onnx_signatures``: check the inputs and
    outputs of onnxruntime models against their model.onnx (needs the ``onnx`` package;
    skipped without it).
    """
    repo = Path(repo)
    checker = Checker(repo, gpus, KNOWN_BACKENDS | frozenset(backends), onnx_signatures)
    add = checker.add
    if not repo.is_dir():
        add("", str(repo), None, "repository", "not a directory")
        return checker.problems
    _contents(repo, add)
    names = list_models(repo)
    if not names:
        add("", "", None, "repository", "no model directories in the repository")
    for name in names:
        model_dir = repo / name
        if not _check_model_name(name, add):
            checker.load(name, model_dir, None)
            continue
        cfg_path = model_dir / "config.pbtxt"
        if not cfg_path.exists():
            hidden = (
                " (Triton loads every directory of the repository as a model, hidden ones "
                "too: remove it or move it out)"
                if name.startswith(".")
                else ""
            )
            add(
                name,
                "config.pbtxt",
                None,
                "config-missing",
                "no config.pbtxt, which --strict-model-config=true requires" + hidden,
            )
            checker.load(name, model_dir, None)
            continue
        if not cfg_path.is_file():
            add(name, "config.pbtxt", None, "config-missing", "config.pbtxt is not a file")
            checker.load(name, model_dir, None)
            continue
        checker.load(name, model_dir, cfg_path.read_bytes())
    for entry in list(checker.entries.values()):
        if entry.cfg is not None:
            checker.check(entry)
    for entry in checker.entries.values():
        if entry.cfg is not None and entry.platform == ENSEMBLE and entry.cfg.HasField("ensemble_scheduling"):
            checker.check_ensemble(entry)
    checker.check_cycles()
    return _ordered(checker.problems)


def validate_config_text(
    text: str,
    model_dir_name: str,
    *,
    model_dir: str | os.PathLike | None = None,
    gpus: int | None = None,
    backends: Iterable[str] = (),
    other_models: Mapping[str, str] | None = None,
) -> list[Problem]:
    """Problems of one config.pbtxt ``text`` for a model directory named ``model_dir_name``.

    Without ``model_dir`` only the configuration is checked (no version directories or model
    files). ``other_models``: config texts of the repository's other models, by name, for an
    ensemble's steps (steps naming models not given are refused).
    """
    checker = Checker(None, gpus, KNOWN_BACKENDS | frozenset(backends), onnx_signatures=True)
    for name, other in (other_models or {}).items():
        checker.load(name, None, other)
    entry = checker.load(model_dir_name, Path(model_dir) if model_dir else None, text)
    if entry.cfg is None:
        return [p for p in checker.problems if p.model == model_dir_name]
    for e in list(checker.entries.values()):
        if e.cfg is not None:
            checker.check(e)
    if entry.platform == ENSEMBLE and entry.cfg.HasField("ensemble_scheduling"):
        checker.check_ensemble(entry)
    checker.check_cycles()
    return _ordered([p for p in checker.problems if p.model == model_dir_name])


def tensorrt_cc_model_filenames(repo: str | os.PathLike) -> dict[str, dict[str, str]]:
    """{model: its cc_model_filenames} for every TensorRT model of ``repo`` (platform
    tensorrt_plan, backend tensorrt, default_model_filename model.plan, or a model.plan Triton
    tells the backend from: as :func:`autocomplete` decides), the map empty where the config
    declares none. Models whose config cannot be read are left out: validate_repository reports
    them."""
    repo = Path(repo)
    out: dict[str, dict[str, str]] = {}
    for name in list_models(repo):
        model_dir = repo / name
        try:
            cfg = parse_config((model_dir / "config.pbtxt").read_text())
        except (OSError, UnicodeDecodeError, text_format.ParseError):
            continue
        _, backend, err = autocomplete(cfg, model_dir, name)
        if err is None and backend == "tensorrt":
            out[name] = dict(cfg.cc_model_filenames)
    return out


def _ordered(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in sorted(problems, key=lambda p: (p.model, p.file, p.line or 0)):
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
