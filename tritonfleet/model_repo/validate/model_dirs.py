"""The model directories as tritonserver reads them: a repository's models, a model's version
directories and the versions its policy loads, and the backend a model resolves to without
auto-complete (``ModelEntry``: one model as the checker sees it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...core.triton_schema import mc
from .lines import Lines
from .tables import (
    CANONICAL_VERSION,
    INT64_MAX,
    NOT_VERSIONS,
    STOLL_PREFIX,
)


def list_models(repo: str | os.PathLike) -> list[str]:
    """The model names Triton sees in ``repo``: every sub-directory, hidden ones included."""
    repo = Path(repo)
    return sorted(d.name for d in repo.iterdir() if d.is_dir())


def _subdirs(path: Path) -> list[str]:
    """Sub-directory names in Triton's order (std::set<std::string>: byte order)."""
    try:
        return sorted((d.name for d in path.iterdir() if d.is_dir()), key=lambda n: n.encode())
    except OSError:
        return []


def list_version_dirs(model_dir: Path) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """({version: dir name} as Triton reads them, [(dir name, why it is a problem)])."""
    versions: dict[int, str] = {}
    odd: list[tuple[str, str]] = []
    for name in _subdirs(model_dir):
        if name in NOT_VERSIONS:
            continue
        if CANONICAL_VERSION.fullmatch(name):
            if int(name) > INT64_MAX:
                odd.append((name, f"version {name} is beyond a 64-bit integer; Triton cannot read it"))
            else:
                versions[int(name)] = name
            continue
        if name.startswith("0"):
            # Triton skips a name with a leading zero ('01', '0abc') without loading it
            if name.isdigit():
                odd.append((name, f"'{name}' has leading zeros: Triton ignores it (rename it {int(name)})"))
            continue
        m = STOLL_PREFIX.match(name)
        if m:
            # std::stoll reads the leading number and ignores the rest: '1abc' is version 1,
            # '-1' version -1; either clashes with or hides the intended version.
            odd.append(
                (
                    name,
                    f"'{name}' is read by Triton as version {int(m.group())}: version "
                    "directories are plain numbers (1, 2, ...)",
                )
            )
        # anything else (old/, notes/) Triton ignores, and so do we
    return versions, odd


def versions_to_load(cfg: mc.ModelConfig, versions: dict[int, str]) -> tuple[list[int], list[int]]:
    """(versions Triton loads under the version policy, specific versions that are absent)."""
    policy = cfg.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "specific":
        wanted = list(policy.specific.versions)
        return [v for v in wanted if v in versions], [v for v in wanted if v not in versions]
    if which == "all":
        return sorted(versions), []
    n = policy.latest.num_versions if which == "latest" else 1
    return sorted(versions, reverse=True)[:n], []


@dataclass
class ModelEntry:
    name: str
    dir: Path | None
    cfg: mc.ModelConfig | None = None
    lines: Lines | None = None
    platform: str = ""
    backend: str = ""
    loaded_versions: tuple[int, ...] = ()


def autocomplete(cfg: mc.ModelConfig, model_dir: Path | None, model_name: str) -> tuple[str, str, str | None]:
    """(platform, backend, error) as Triton's AutoCompleteBackendFields leaves them.

    It looks into the first sub-directory only (byte order), whatever its name.
    """
    platform, backend, dmf = cfg.platform, cfg.backend, cfg.default_model_filename
    subdirs = _subdirs(model_dir) if model_dir else []
    has_version = bool(subdirs)
    first = model_dir / subdirs[0] if has_version else None

    def present(name, kind):
        if first is None:
            return False
        p = first / name
        return p.is_dir() if kind == "dir" else p.is_file() if kind == "file" else p.exists()

    if not platform and backend in ("", "tensorflow"):
        if dmf == "model.savedmodel":
            platform = "tensorflow_savedmodel"
        elif dmf == "model.graphdef":
            platform = "tensorflow_graphdef"
        elif not dmf and has_version:
            if present("model.savedmodel", "dir"):
                platform = "tensorflow_savedmodel"
            if present("model.graphdef", "file"):
                platform = "tensorflow_graphdef"
    if platform in ("tensorflow_savedmodel", "tensorflow_graphdef"):
        return platform, backend or "tensorflow", None
    if not backend:
        if platform == "tensorrt_plan" or dmf == "model.plan":
            backend = "tensorrt"
        elif not platform and not dmf and present("model.plan", "file"):
            backend = "tensorrt"
    if backend == "tensorrt":
        return platform or "tensorrt_plan", backend, None
    if not backend:
        if platform == "onnxruntime_onnx" or dmf == "model.onnx":
            backend = "onnxruntime"
        elif not platform and not dmf and present("model.onnx", "any"):
            backend = "onnxruntime"
    if backend == "onnxruntime":
        return platform or "onnxruntime_onnx", backend, None
    if not backend:
        if dmf == "model.xml" or (not platform and not dmf and present("model.xml", "any")):
            backend = "openvino"
    if backend == "openvino":
        return platform, backend, None
    if not backend:
        if platform == "pytorch_libtorch" or dmf == "model.pt":
            backend = "pytorch"
        elif not platform and not dmf and present("model.pt", "file"):
            backend, platform = "pytorch", "pytorch_libtorch"
    if backend == "pytorch":
        return platform or "pytorch_libtorch", backend, None
    if not backend:
        if dmf == "model.py" or (not platform and not dmf and present("model.py", "any")):
            backend = "python"
    if backend == "python":
        return platform, backend, None
    if not backend and not platform and not dmf:
        if "." not in model_name:
            return (
                "",
                "",
                (
                    "no 'platform' or 'backend', and no model file Triton can tell it from in "
                    f"{subdirs[0] + '/' if has_version else 'a version directory'} (model.onnx, "
                    'model.plan, model.pt, model.py, ...): add e.g. backend: "onnxruntime"'
                ),
            )
        backend = model_name.split(".", 1)[1]
    return platform, backend, None
