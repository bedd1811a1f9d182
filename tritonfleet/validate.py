"""Validate a Triton model repository the way tritonserver will, before any host sees it.

Every config.pbtxt is parsed with Triton's own ``inference.ModelConfig`` protobuf schema
(tritonclient's model_config_pb2, google.protobuf text_format: the server's parser), then the
repository and configuration rules of Triton 24.08 with ``--strict-model-config=true`` apply.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

# platform -> backend, and the default model file name of each backend
PLATFORM_BACKEND = {
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "ensemble": None,
}
DEFAULT_FILENAME = {
    "tensorrt": "model.plan",
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "python": "model.py",
    "openvino": "model.xml",
    "dali": "model.dali",
}
PLATFORM_FILENAME = {"tensorflow_graphdef": "model.graphdef", "tensorflow_savedmodel": "model.savedmodel"}


@dataclass
class Problem:
    model: str
    file: str
    line: int | None
    rule: str
    message: str

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line else "")
        return f"{where}: [{self.rule}] {self.message}"

    def as_dict(self) -> dict:
        return asdict(self)


def _dtype_name(v: int) -> str:
    return mc.DataType.Name(v)


def _check_tensors(p, model, rel, tensors, kind, max_batch):
    seen = set()
    if not tensors:
        p(model, rel, None, f"{kind}-missing", f"strict config needs at least one {kind}")
    for t in tensors:
        if not t.name:
            p(model, rel, None, f"{kind}-name", f"every {kind} needs a name")
        elif t.name in seen:
            p(model, rel, None, f"{kind}-duplicate", f"{kind} '{t.name}' is declared twice")
        seen.add(t.name)
        if t.data_type == mc.TYPE_INVALID:
            p(model, rel, None, f"{kind}-data-type", f"{kind} '{t.name}' needs data_type (e.g. TYPE_FP32)")
        if not t.dims and not (max_batch > 0 and t.reshape.shape == [] and t.HasField("reshape")):
            if max_batch == 0 or not t.HasField("reshape"):
                if not t.dims:
                    p(model, rel, None, f"{kind}-dims",
                      f"{kind} '{t.name}' needs dims (the batch dimension is implied by max_batch_size)")
        for d in t.dims:
            if d == 0 or d < -1:
                p(model, rel, None, f"{kind}-dims", f"{kind} '{t.name}' has dim {d}: dims are -1 or > 0")


def _detect_platform(model_dir: Path) -> str | None:
    by_file = {"model.plan": "tensorrt_plan", "model.onnx": "onnxruntime_onnx", "model.pt": "pytorch_libtorch",
               "model.graphdef": "tensorflow_graphdef", "model.savedmodel": "tensorflow_savedmodel"}
    for version in sorted(model_dir.iterdir()):
        if version.is_dir() and version.name.isdigit():
            for name, platform in by_file.items():
                if (version / name).exists():
                    return platform
    return None


def _model_file_present(model_dir: Path, version: Path, name: str) -> bool:
    path = version / name
    return path.exists()


def validate_config(cfg: mc.ModelConfig, model_dir: Path, rel: str, all_models: set[str], p) -> None:
    model = model_dir.name
    if cfg.name and cfg.name != model:
        p(model, rel, None, "name", f"name '{cfg.name}' must equal the directory name '{model}'")
    platform, backend = cfg.platform, cfg.backend
    if not platform and not backend:
        # Triton picks the platform from the model file it finds (model.onnx -> onnxruntime_onnx, ...)
        platform = _detect_platform(model_dir)
        if not platform:
            p(model, rel, None, "platform",
              "no 'platform' or 'backend', and no model file to detect it from (model.onnx, model.plan, ...)")
    if platform and platform not in PLATFORM_BACKEND:
        p(model, rel, None, "platform", f"unknown platform '{platform}' (known: {', '.join(PLATFORM_BACKEND)})")
    if platform and backend and PLATFORM_BACKEND.get(platform) not in (None, backend):
        p(model, rel, None, "platform-backend",
          f"platform '{platform}' runs on backend '{PLATFORM_BACKEND[platform]}', not '{backend}'")
    if cfg.max_batch_size < 0:
        p(model, rel, None, "max-batch-size", "max_batch_size must be >= 0")
    if cfg.HasField("dynamic_batching"):
        if cfg.max_batch_size == 0:
            p(model, rel, None, "dynamic-batching", "dynamic_batching needs max_batch_size > 0")
        for size in cfg.dynamic_batching.preferred_batch_size:
            if size <= 0 or (cfg.max_batch_size > 0 and size > cfg.max_batch_size):
                p(model, rel, None, "preferred-batch-size",
                  f"preferred_batch_size {size} must be > 0 and <= max_batch_size {cfg.max_batch_size}")
    if platform != "ensemble":
        _check_tensors(p, model, rel, cfg.input, "input", cfg.max_batch_size)
        _check_tensors(p, model, rel, cfg.output, "output", cfg.max_batch_size)
    for ig in cfg.instance_group:
        if ig.count < 0:
            p(model, rel, None, "instance-group", f"instance group count {ig.count} must be >= 0")
        if ig.kind == mc.ModelInstanceGroup.KIND_CPU and ig.gpus:
            p(model, rel, None, "instance-group", "a KIND_CPU instance group must not list gpus")
        if any(g < 0 for g in ig.gpus):
            p(model, rel, None, "instance-group", "gpu ids must be >= 0")
    # versions and model files
    versions = [d for d in model_dir.iterdir() if d.is_dir() and not d.name.startswith(".")]
    numeric = [d for d in versions if re.fullmatch(r"[0-9]+", d.name)]
    for d in versions:
        if d not in numeric:
            p(model, f"{model}/{d.name}", None, "version-dir",
              f"'{d.name}' is not a numeric version directory (Triton ignores it)")
    if not numeric and platform != "ensemble":
        p(model, model, None, "version-missing", "at least one numeric version directory (e.g. 1/) is needed")
    backend_eff = backend or PLATFORM_BACKEND.get(platform or "", None)
    filename = cfg.default_model_filename or PLATFORM_FILENAME.get(platform) or DEFAULT_FILENAME.get(backend_eff or "")
    if filename and platform != "ensemble":
        for d in numeric:
            if not _model_file_present(model_dir, d, filename):
                p(model, f"{model}/{d.name}", None, "model-file",
                  f"version {d.name} has no {filename} (needed by {platform or backend})")
    if platform == "ensemble":
        _check_ensemble(cfg, model, rel, all_models, p)


def _check_ensemble(cfg, model, rel, all_models, p):
    steps = cfg.ensemble_scheduling.step
    if not steps:
        p(model, rel, None, "ensemble", "an ensemble needs ensemble_scheduling with steps")
    available = {t.name for t in cfg.input}
    produced = set()
    for s in steps:
        available |= set(s.output_map.values())
        produced |= set(s.output_map.values())
    for s in steps:
        if s.model_name not in all_models:
            p(model, rel, None, "ensemble-step", f"step model '{s.model_name}' is not in the repository")
        for tensor in s.input_map.values():
            if tensor not in available:
                p(model, rel, None, "ensemble-tensor", f"step '{s.model_name}' reads '{tensor}', which no one produces")
    for t in cfg.output:
        if t.name not in produced:
            p(model, rel, None, "ensemble-output", f"ensemble output '{t.name}' is produced by no step")


def _unsafe(repo: Path, path: Path) -> str | None:
    if path.is_symlink():
        target = Path(os.path.realpath(path))
        try:
            target.relative_to(Path(os.path.realpath(repo)))
        except ValueError:
            return f"symlink {path.relative_to(repo)} points outside the repository ({target})"
    return None


def validate_repository(repo: Path | str) -> list[Problem]:
    """Every problem Triton would refuse the repository for (empty list: valid)."""
    repo = Path(repo)
    problems: list[Problem] = []

    def p(model, file, line, rule, message):
        problems.append(Problem(model, file, line, rule, message))

    if not repo.is_dir():
        p("-", str(repo), None, "repository", "not a directory")
        return problems
    models = sorted(d for d in repo.iterdir() if not d.name.startswith("."))
    for root, dirs, files in os.walk(repo):
        for name in dirs + files:
            why = _unsafe(repo, Path(root) / name)
            if why:
                p(Path(root, name).relative_to(repo).parts[0], str(Path(root, name).relative_to(repo)),
                  None, "unsafe-path", why)
    names = {d.name for d in models if d.is_dir()}
    if not names:
        p("-", str(repo), None, "repository", "no model directories")
    for d in models:
        if not d.is_dir():
            continue
        rel = f"{d.name}/config.pbtxt"
        cfg_path = d / "config.pbtxt"
        if not cfg_path.is_file():
            p(d.name, rel, None, "config-missing", "strict model config needs config.pbtxt")
            continue
        cfg = mc.ModelConfig()
        try:
            text_format.Parse(cfg_path.read_text(), cfg)
        except text_format.ParseError as e:
            line = getattr(e, "GetLine", lambda: None)()
            p(d.name, rel, line, "parse", str(e).split(":", 2)[-1].strip())
            continue
        except UnicodeDecodeError:
            p(d.name, rel, None, "parse", "config.pbtxt is not UTF-8 text")
            continue
        validate_config(cfg, d, rel, names, p)
    return problems
