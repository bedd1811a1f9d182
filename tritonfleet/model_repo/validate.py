"""Validate a Triton model repository the way tritonserver loads it, before any host sees it.

Every ``config.pbtxt`` is parsed with Triton's own schema (``inference.ModelConfig`` from
tritonclient's ``model_config_pb2``, read by ``google.protobuf.text_format`` as the server's
parser reads it), then the repository and configuration rules of the server apply as it runs
on the hosts: ``--strict-model-config=true`` (no backend auto-complete), ``--exit-on-error``.

The rules follow Triton's core (model_repository_manager, model_lifecycle, model_config_utils
ValidateModelConfig / ValidateInstanceGroup / ValidateIOShape, ensemble_utils) and were checked
against a real tritonserver 2.51 (tests/unit/model_repo/test_validate.py). Where the server's behaviour is
plainly a trap the validator is stricter and says so in the message (a symlink out of the
repository, a duplicate tensor name, an instance count below zero, a version directory with
leading zeros that Triton silently skips).

Public API: :class:`Problem`, :func:`validate_repository`, :func:`validate_config_text`,
:func:`parse_config`, :func:`list_models`.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

__all__ = [
    "KNOWN_BACKENDS",
    "NEWER_FIELDS",
    "RULES",
    "Problem",
    "list_models",
    "parse_config",
    "validate_config_text",
    "validate_repository",
]

#: Backends shipped in the tritonserver <release>-py3 image the fleet runs (/opt/tritonserver/backends).
KNOWN_BACKENDS = frozenset({
    "dali", "fil", "identity", "onnxruntime", "openvino", "python", "pytorch", "repeat",
    "square", "tensorflow", "tensorrt",
})

#: ModelConfig fields that tritonclient's schema knows and the fleet's tritonserver does not:
#: the server refuses such a config as a parse error ("has no field named ..."). Field path ->
#: message type holding it. Kept in step with the server's schema by a test that reads the
#: schema compiled into the bundled tritonserver library.
NEWER_FIELDS = {
    "model_metrics": "inference.ModelConfig",
    "max_inflight_requests": "inference.ModelEnsembling",
}

#: Every rule id a :class:`Problem` can carry, with what it checks.
RULES = {
    "repository": "the repository is a directory holding at least one model directory",
    "unsafe-path": "no symlink out of the repository or to an absolute path; plain file names only",
    "broken-symlink": "every symlink points to something",
    "model-name": "model directory names of letters, digits, '_', '.' and '-' only, not starting with '-', "
                  "without '..'",
    "config-missing": "each model directory (hidden ones too) has a config.pbtxt (strict model config)",
    "encoding": "config.pbtxt is UTF-8 text",
    "parse": "config.pbtxt parses as Triton's ModelConfig (protobuf text format)",
    "newer-field": "no field the fleet's Triton release does not know yet",
    "name": "name, if given, equals the directory name",
    "platform": "a platform or backend is given or can be told from the model file; the platform is known",
    "platform-backend": "platform and backend go together; an ensemble has no backend",
    "backend": "the backend is one the Triton image has",
    "max-batch-size": "max_batch_size >= 0",
    "dynamic-batching": "dynamic_batching only for a batching model (max_batch_size > 0)",
    "preferred-batch-size": "preferred batch sizes are > 0 and <= max_batch_size",
    "priority": "priority levels, default level and preserve_ordering are consistent",
    "response-cache": "no response cache on decoupled or sequence-batched models",
    "sequence-control": "sequence batching controls are named, unique and typed as Triton requires",
    "sequence-batching": "sequence batching strategy settings in range",
    "input-name": "every input has a name",
    "output-name": "every output has a name",
    "input-duplicate": "input names are unique",
    "output-duplicate": "output names are unique",
    "input-data-type": "every input has a data_type",
    "output-data-type": "every output has a data_type",
    "input-dims": "every input has dims, each -1 or > 0",
    "output-dims": "every output has dims, each -1 or > 0",
    "input-reshape": "an input reshape holds as many elements as its dims",
    "output-reshape": "an output reshape holds as many elements as its dims",
    "input-format": "NHWC/NCHW inputs have 3 dims; non-linear formats only for TensorRT",
    "output-format": "non-linear output formats only for TensorRT, with 3 dims",
    "input-shape-tensor": "shape tensors only for TensorRT",
    "output-shape-tensor": "shape tensors only for TensorRT",
    "output-missing": "a model (not an ensemble) has at least one output",
    "batch-input": "batch inputs have one existing source input and an INT32/FP32 type",
    "batch-output": "batch outputs have one existing source input and existing, unique targets",
    "instance-count": "instance counts >= 0",
    "instance-gpus": "gpus only for KIND_GPU, ids that exist (when the GPU count is known)",
    "instance-profile": "profiles only for TensorRT, as non-negative integers",
    "warmup": "warmup samples feed exactly the model's inputs, within max_batch_size",
    "version-dir": "version directories are plain numbers without leading zeros",
    "version-policy": "the version policy selects versions that exist",
    "version-missing": "at least one version directory (ensembles too)",
    "model-file": "each loaded version has the model file its backend reads",
    "referenced-file": "every file the configuration names is in the model directory: output "
                       "label_filename, warmup input_data_file (with enough bytes), "
                       "cc_model_filenames (in each loaded version), the python backend's "
                       "EXECUTION_ENV_PATH under $$TRITON_MODEL_DIRECTORY",
    "python-syntax": "a python backend model.py compiles",
    "onnx-model": "model.onnx is a readable ONNX model",
    "onnx-signature": "inputs and outputs match model.onnx (names, types, dims)",
    "ensemble": "ensemble_scheduling exactly on ensembles, without instance groups, optimization, warmup",
    "ensemble-step": "each step names a model of the repository, at a loaded version, batching no less",
    "ensemble-tensor": "step maps name real step tensors of consistent type and shape; data flows to every output",
    "ensemble-cycle": "no ensemble depends on itself",
}

# Triton's platform names and the backend each maps to (GetBackendTypeFromPlatform).
PLATFORM_BACKEND = {
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}
ENSEMBLE = "ensemble"
# Backends whose platform Triton checks against the backend (GetBackendType): for any other
# backend (python, openvino, ...) Triton accepts whatever platform is written.
TYPED_BACKENDS = frozenset(PLATFORM_BACKEND.values())

# The model file each backend loads from a version directory unless default_model_filename
# says otherwise: (name, kind) with kind "file", "dir" or "any".
MODEL_FILE = {
    "tensorrt": ("model.plan", "file"),
    "onnxruntime": ("model.onnx", "any"),  # a file, or a directory for models with external data
    "pytorch": ("model.pt", "file"),
    "python": ("model.py", "file"),
    "openvino": ("model.xml", "file"),
    "dali": ("model.dali", "file"),
}
PLATFORM_FILE = {
    "tensorflow_graphdef": ("model.graphdef", "file"),
    "tensorflow_savedmodel": ("model.savedmodel", "dir"),
}
# Sub-directories of a model that Triton never reads as versions.
NOT_VERSIONS = {"warmup", "initial_state", "configs"}
INT64_MAX = 2**63 - 1

_CANONICAL_VERSION = re.compile(r"0|[1-9][0-9]*")
_STOLL_PREFIX = re.compile(r"\s*[+-]?[0-9]+")  # what std::stoll accepts at the start of a name

# bytes per element (Triton's GetDataTypeByteSize); TYPE_STRING has no fixed size
TYPE_BYTES = {
    "TYPE_BOOL": 1, "TYPE_UINT8": 1, "TYPE_UINT16": 2, "TYPE_UINT32": 4, "TYPE_UINT64": 8,
    "TYPE_INT8": 1, "TYPE_INT16": 2, "TYPE_INT32": 4, "TYPE_INT64": 8, "TYPE_FP16": 2,
    "TYPE_FP32": 4, "TYPE_FP64": 8, "TYPE_BF16": 2,
}
MODEL_DIRECTORY_VAR = "$$TRITON_MODEL_DIRECTORY"

ONNX_TYPES = {  # onnx TensorProto.DataType -> Triton data type name
    1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16",
    6: "TYPE_INT32", 7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL", 10: "TYPE_FP16",
    11: "TYPE_FP64", 12: "TYPE_UINT32", 13: "TYPE_UINT64", 16: "TYPE_BF16",
}


@dataclass(frozen=True)
class Problem:
    """One reason Triton would refuse (or mis-serve) the repository.

    ``model``: the model directory name ('' for the repository itself); ``file``: the path the
    problem is in, relative to the model directory ('config.pbtxt', '1/model.py', '' for the
    directory itself); ``line``: 1-based line in that file where known; ``rule``: a short id;
    ``message``: what is wrong and, where obvious, the fix.
    """

    model: str
    file: str
    line: int | None
    rule: str
    message: str

    @property
    def path(self) -> str:
        """``model/file`` (repository-relative; '.' for the repository itself)."""
        return "/".join(p for p in (self.model, self.file) if p) or "."

    def __str__(self) -> str:
        where = self.path + (f":{self.line}" if self.line else "")
        return f"{where}: [{self.rule}] {self.message}"

    def as_dict(self) -> dict:
        return asdict(self)


# ---- parsing -------------------------------------------------------------------------------

def parse_config(text: str) -> mc.ModelConfig:
    """``text`` parsed as Triton's ModelConfig (raises ``text_format.ParseError``)."""
    return text_format.Parse(text, mc.ModelConfig())


class _Lines:
    """Field path -> first line (1-based) in a text-format message that parsed cleanly.

    Paths are tuples like ``("input", 1, "dims")``: a message field carries the index of its
    occurrence (0 for a singular one), a scalar field none.
    """

    def __init__(self, text: str):
        self.map: dict[tuple, int] = {}
        try:
            self._tok = text_format.Tokenizer(text.split("\n"))
            self._message((), None)
        except Exception:  # noqa: BLE001 - line numbers are a help, never a failure
            pass

    def _next(self) -> None:
        self._tok.NextToken()

    def _record(self, path: tuple, line: int) -> None:
        self.map.setdefault(path, line)

    def _message(self, path: tuple, closer: str | None) -> None:
        tok = self._tok
        counts: dict[str, int] = {}
        while not tok.AtEnd() and tok.token != closer:
            name, line = tok.token, tok._line + 1
            self._next()
            if tok.token == ":":
                self._next()
            if tok.token in ("{", "<"):
                index = counts.get(name, 0)
                counts[name] = index + 1
                self._record(path + (name,), line)
                self._record(path + (name, index), line)
                end = "}" if tok.token == "{" else ">"
                self._next()
                self._message(path + (name, index), end)
                self._next()
            elif tok.token == "[":
                self._record(path + (name,), line)
                self._next()
                while not tok.AtEnd() and tok.token != "]":
                    if tok.token in ("{", "<"):
                        index = counts.get(name, 0)
                        counts[name] = index + 1
                        self._record(path + (name, index), tok._line + 1)
                        end = "}" if tok.token == "{" else ">"
                        self._next()
                        self._message(path + (name, index), end)
                        self._next()
                    else:
                        self._scalar()
                    if tok.token == ",":
                        self._next()
                self._next()
            else:
                self._record(path + (name,), line)
                self._scalar()
            if tok.token in (",", ";"):
                self._next()

    def _scalar(self) -> None:
        tok = self._tok
        if tok.token == "-":
            self._next()
        first = tok.token
        self._next()
        if first[:1] in ("'", '"'):
            while not tok.AtEnd() and tok.token[:1] in ("'", '"'):
                self._next()

    def line(self, *path) -> int | None:
        """The line of ``path``, else of its nearest enclosing field that is written."""
        path = tuple(path)
        while path:
            if path in self.map:
                return self.map[path]
            path = path[:-1]
        return None


def _repeated(field) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6; label() is deprecated there
    return flag if isinstance(flag, bool) else field.label == field.LABEL_REPEATED


def _newer_fields(cfg: mc.ModelConfig, lines: _Lines) -> list[tuple[str, int | None]]:
    """Fields set in ``cfg`` that the fleet's tritonserver does not know."""
    found = []

    def walk(msg, path):
        for field, value in msg.ListFields():
            here = path + (field.name,)
            if NEWER_FIELDS.get(field.name) == field.containing_type.full_name:
                shown = ".".join(str(p) for p in here if not isinstance(p, int))
                found.append((shown, lines.line(*here)))
                continue
            if field.type == field.TYPE_MESSAGE:
                if field.message_type.GetOptions().map_entry:
                    if field.message_type.fields_by_name["value"].type == field.TYPE_MESSAGE:
                        for v in value.values():
                            walk(v, here)
                elif _repeated(field):
                    for i, v in enumerate(value):
                        walk(v, here + (i,))
                else:
                    walk(value, here + (0,))

    walk(cfg, ())
    return found


# ---- the repository ------------------------------------------------------------------------

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


def _version_dirs(model_dir: Path) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """({version: dir name} as Triton reads them, [(dir name, why it is a problem)])."""
    versions: dict[int, str] = {}
    odd: list[tuple[str, str]] = []
    for name in _subdirs(model_dir):
        if name in NOT_VERSIONS:
            continue
        if _CANONICAL_VERSION.fullmatch(name):
            if int(name) > INT64_MAX:
                odd.append((name, f"version {name} is beyond a 64-bit integer; Triton cannot read it"))
            else:
                versions[int(name)] = name
            continue
        if name.startswith("0"):
            # Triton skips a name with a leading zero ('01', '0abc') without loading it
            if name.isdigit():
                odd.append((name, f"'{name}' has leading zeros: Triton ignores it (rename it "
                                  f"{int(name)})"))
            continue
        m = _STOLL_PREFIX.match(name)
        if m:
            # std::stoll reads the leading number and ignores the rest: '1abc' is version 1,
            # '-1' version -1; either clashes with or hides the intended version.
            odd.append((name, f"'{name}' is read by Triton as version {int(m.group())}: version "
                              "directories are plain numbers (1, 2, ...)"))
        # anything else (old/, notes/) Triton ignores, and so do we
    return versions, odd


def _versions_to_load(cfg: mc.ModelConfig, versions: dict[int, str]) -> tuple[list[int], list[int]]:
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
class _Entry:
    name: str
    dir: Path | None
    cfg: mc.ModelConfig | None = None
    lines: _Lines | None = None
    platform: str = ""
    backend: str = ""
    loaded_versions: tuple[int, ...] = ()


def _autocomplete(cfg: mc.ModelConfig, model_dir: Path | None, model_name: str) -> tuple[str, str, str | None]:
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
            return "", "", (
                "no 'platform' or 'backend', and no model file Triton can tell it from in "
                f"{subdirs[0] + '/' if has_version else 'a version directory'} (model.onnx, "
                "model.plan, model.pt, model.py, ...): add e.g. backend: \"onnxruntime\"")
        backend = model_name.split(".", 1)[1]
    return platform, backend, None


class _Checker:
    def __init__(self, repo: Path | None, gpus: int | None, backends: frozenset[str],
                 onnx_signatures: bool):
        self.repo = repo
        self.gpus = gpus
        self.backends = backends
        self.onnx_signatures = onnx_signatures
        self.problems: list[Problem] = []
        self.entries: dict[str, _Entry] = {}

    def add(self, model: str, file: str, line: int | None, rule: str, message: str) -> None:
        assert rule in RULES, rule
        self.problems.append(Problem(model, file, line, rule, message))

    # -- parsing -------------------------------------------------------------------------------
    def load(self, name: str, model_dir: Path | None, text: str | bytes | None) -> _Entry:
        entry = _Entry(name, model_dir)
        self.entries[name] = entry
        if text is None:
            return entry
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as e:
                self.add(name, "config.pbtxt", None, "encoding", f"config.pbtxt is not UTF-8 text ({e.reason})")
                return entry
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cfg = parse_config(text)
        except text_format.ParseError as e:
            msg = str(e)
            m = re.match(r"(\d+):(\d+) : (.*)", msg, re.S)
            self.add(name, "config.pbtxt", e.GetLine() or None, "parse",
                     (m.group(3) if m else msg).strip())
            return entry
        entry.cfg, entry.lines = cfg, _Lines(text)
        return entry

    # -- one model -----------------------------------------------------------------------------
    def check(self, entry: _Entry) -> None:
        cfg, lines, model = entry.cfg, entry.lines, entry.name
        assert cfg is not None and lines is not None
        cf = "config.pbtxt"

        def p(rule, message, *path):
            self.add(model, cf, lines.line(*path) if path else None, rule, message)

        for field, line in _newer_fields(cfg, lines):
            self.add(model, cf, line, "newer-field",
                     f"'{field}' is newer than the fleet's Triton, which refuses the whole file "
                     "(\"has no field named\"): remove it")
        if cfg.name and cfg.name != model:
            p("name", f"name \"{cfg.name}\" must equal the directory name \"{model}\" (or leave "
                      "name out)", "name")

        platform, backend, err = _autocomplete(cfg, entry.dir, model)
        entry.platform, entry.backend = platform, backend
        if err:
            p("platform", err)
        elif platform == ENSEMBLE:
            if backend:
                p("platform-backend", f"an ensemble has no backend (found backend \"{backend}\"): "
                                      "remove it", "backend")
        elif not backend:
            p("platform", f"unknown platform \"{platform}\" (known: "
                          f"{', '.join([*PLATFORM_BACKEND, ENSEMBLE])}); or name a backend", "platform")
        elif backend in TYPED_BACKENDS and PLATFORM_BACKEND.get(platform) != backend:
            want = [k for k, v in PLATFORM_BACKEND.items() if v == backend]
            p("platform-backend", f"platform \"{platform}\" does not go with backend \"{backend}\" "
                                  f"(use platform {' or '.join(want)}, or drop platform)", "platform")
        elif backend not in self.backends:
            p("backend", f"backend \"{backend}\" is not in the Triton image (it has "
                         f"{', '.join(sorted(self.backends))})", "backend")

        if cfg.max_batch_size < 0:
            p("max-batch-size", f"max_batch_size {cfg.max_batch_size} must be >= 0 (0: the model "
                                "does not batch)", "max_batch_size")
        self._batching(cfg, p)
        is_ensemble = platform == ENSEMBLE
        if cfg.HasField("ensemble_scheduling") and not is_ensemble:
            p("ensemble", "ensemble_scheduling is only for platform \"ensemble\"", "ensemble_scheduling")
        if is_ensemble and not cfg.HasField("ensemble_scheduling"):
            p("ensemble", "an ensemble needs ensemble_scheduling with its steps")
        self._tensors(cfg, p, platform)
        if not is_ensemble:
            self._instance_groups(cfg, p, platform)
        else:
            if cfg.instance_group:
                p("ensemble", "an ensemble takes no instance_group: remove it", "instance_group")
            if cfg.HasField("optimization"):
                p("ensemble", "an ensemble takes no optimization: remove it", "optimization")
            if cfg.model_warmup:
                p("ensemble", "an ensemble takes no model_warmup: remove it", "model_warmup")
        if cfg.model_transaction_policy.decoupled and cfg.response_cache.enable:
            p("response-cache", "the response cache does not work with a decoupled model: disable "
                                "response_cache", "response_cache")
        self._warmup(cfg, p)
        if entry.dir is not None:
            self._files(entry, p)

    def _batching(self, cfg, p) -> None:
        mbs = cfg.max_batch_size
        if cfg.HasField("dynamic_batching"):
            db = cfg.dynamic_batching
            if mbs == 0:
                p("dynamic-batching", "dynamic_batching needs max_batch_size > 0 (with 0 the model "
                                      "never batches)", "dynamic_batching")
            for size in db.preferred_batch_size:
                if size <= 0 or size > mbs:
                    p("preferred-batch-size", f"preferred_batch_size {size} must be > 0 and <= "
                                              f"max_batch_size {mbs}",
                      "dynamic_batching", 0, "preferred_batch_size")
            levels = db.priority_levels
            if levels:
                if not 1 <= db.default_priority_level <= levels:
                    p("priority", f"default_priority_level must be in [1, {levels}]",
                      "dynamic_batching", 0, "default_priority_level")
                for level in db.priority_queue_policy:
                    if not 1 <= level <= levels:
                        p("priority", f"priority_queue_policy level {level} must be in [1, {levels}]",
                          "dynamic_batching", 0, "priority_queue_policy")
            if db.preserve_ordering:
                if levels > 1:
                    p("priority", "preserve_ordering allows one priority level only",
                      "dynamic_batching", 0, "preserve_ordering")
                policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
                if any(q.default_timeout_microseconds and q.timeout_action == mc.ModelQueuePolicy.DELAY
                       for q in policies):
                    p("priority", "preserve_ordering does not allow the DELAY timeout action",
                      "dynamic_batching", 0, "preserve_ordering")
        if cfg.HasField("sequence_batching"):
            self._sequence(cfg, p)

    def _sequence(self, cfg, p) -> None:
        sb = cfg.sequence_batching
        where = ("sequence_batching", 0)
        if cfg.response_cache.enable:
            p("response-cache", "the response cache does not work with sequence batching: disable "
                                "response_cache", "response_cache")
        K = mc.ModelSequenceBatching.Control
        seen_names = set()
        seen_kinds: dict[int, int] = {}
        for i, ci in enumerate(sb.control_input):
            at = where + ("control_input", i)
            if not ci.name:
                p("sequence-control", "every sequence batching control_input needs a name", *at)
            elif ci.name in seen_names:
                p("sequence-control", f"control tensor '{ci.name}' is given for several controls", *at)
            seen_names.add(ci.name)
            for c in ci.control:
                seen_kinds[c.kind] = seen_kinds.get(c.kind, 0) + 1
                kind = K.Kind.Name(c.kind)
                lists = [n for n in ("int32_false_true", "fp32_false_true", "bool_false_true")
                         if len(getattr(c, n))]
                if c.kind == K.CONTROL_SEQUENCE_CORRID:
                    if lists:
                        p("sequence-control", f"{kind} takes data_type, not {lists[0]}", *at)
                    if c.data_type not in (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32,
                                           mc.TYPE_INT32, mc.TYPE_STRING):
                        p("sequence-control", f"{kind} data_type must be TYPE_UINT64, TYPE_INT64, "
                                              "TYPE_UINT32, TYPE_INT32 or TYPE_STRING", *at)
                elif not lists:
                    p("sequence-control", f"{kind} needs one of int32_false_true, fp32_false_true, "
                                          "bool_false_true", *at)
                elif len(lists) > 1:
                    p("sequence-control", f"{kind} gives more than one of {', '.join(lists)}", *at)
                elif len(getattr(c, lists[0])) != 2:
                    p("sequence-control", f"{kind} {lists[0]} needs exactly 2 entries (false, true)", *at)
        for kind, n in seen_kinds.items():
            if n > 1:
                p("sequence-control", f"{K.Kind.Name(kind)} is given {n} times", *where)
        if sb.HasField("oldest"):
            for size in sb.oldest.preferred_batch_size:
                if size <= 0 or size > cfg.max_batch_size:
                    p("preferred-batch-size", f"sequence oldest preferred_batch_size {size} must be "
                                              f"> 0 and <= max_batch_size {cfg.max_batch_size}",
                      *where, "oldest", 0, "preferred_batch_size")
        if sb.HasField("direct"):
            u = sb.direct.minimum_slot_utilization
            if u < 0.0 or u > 1.0:
                p("sequence-batching", f"minimum_slot_utilization {u:g} must be in (0, 1]",
                  *where, "direct", 0, "minimum_slot_utilization")

    def _tensors(self, cfg, p, platform) -> None:
        mbs = cfg.max_batch_size
        names: dict[str, str] = {}
        for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
            for i, t in enumerate(tensors):
                at = (kind, i)
                label = f"{kind} '{t.name}'" if t.name else f"{kind} #{i + 1}"
                if not t.name:
                    p(f"{kind}-name", f"{label} needs a name", *at)
                elif t.name in names and names[t.name] == kind:
                    p(f"{kind}-duplicate", f"{kind} '{t.name}' is declared twice: tensor names are "
                                           "unique", *at, "name")
                if t.name:
                    names.setdefault(t.name, kind)
                if t.data_type == mc.TYPE_INVALID:
                    p(f"{kind}-data-type", f"{label} needs data_type (e.g. TYPE_FP32)", *at)
                if not t.dims:
                    p(f"{kind}-dims", f"{label} needs dims (without the batch dimension, which "
                                      "max_batch_size implies)", *at)
                for d in t.dims:
                    if d < 1 and d != -1:
                        p(f"{kind}-dims", f"{label} has dim {d}: each dim is >= 1, or -1 for a "
                                          "variable size", *at, "dims")
                        break
                if t.HasField("reshape"):
                    self._reshape(t, label, kind, mbs, p, at)
                if kind == "input" and t.format in (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW) \
                        and len(t.dims) != 3:
                    p("input-format", f"{label}: format {mc.ModelInput.Format.Name(t.format)} needs "
                                      "3 dims", *at, "format")
                if t.is_shape_tensor and platform != "tensorrt_plan":
                    p(f"{kind}-shape-tensor", f"{label}: shape tensors are for TensorRT models only",
                      *at, "is_shape_tensor")
                if t.is_non_linear_format_io:
                    if platform != "tensorrt_plan":
                        p(f"{kind}-format", f"{label}: non-linear IO format is for TensorRT models "
                                            "only", *at, "is_non_linear_format_io")
                    elif len(t.dims) != 3:
                        p(f"{kind}-format", f"{label}: non-linear IO format needs 3 dims", *at, "dims")
        if platform != ENSEMBLE and not cfg.output:
            p("output-missing", "no output: a model answers with its configured outputs only; "
                                "add output [ ... ]")
        inputs = {t.name for t in cfg.input}
        outputs = {t.name for t in cfg.output}
        for i, b in enumerate(cfg.batch_input):
            at = ("batch_input", i)
            if len(b.source_input) != 1:
                p("batch-input", f"batch_input {b.target_name or i}: expects 1 source_input, got "
                                 f"{len(b.source_input)}", *at)
            if b.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
                p("batch-input", f"batch_input {b.target_name or i}: data_type must be TYPE_INT32 or "
                                 "TYPE_FP32", *at)
            for s in b.source_input:
                if s not in inputs:
                    p("batch-input", f"batch_input source_input '{s}' is not an input", *at)
        for i, b in enumerate(cfg.batch_output):
            at = ("batch_output", i)
            if len(b.source_input) != 1:
                p("batch-output", f"batch_output expects 1 source_input, got {len(b.source_input)}", *at)
            for s in b.source_input:
                if s not in inputs:
                    p("batch-output", f"batch_output source_input '{s}' is not an input", *at)
            seen = set()
            for target in b.target_name:
                if target not in outputs:
                    p("batch-output", f"batch_output target_name '{target}' is not an output", *at)
                if target in seen:
                    p("batch-output", f"batch_output target_name '{target}' is given twice", *at)
                seen.add(target)

    @staticmethod
    def _reshape(t, label, kind, mbs, p, at) -> None:
        shape = list(t.reshape.shape)
        if not shape and mbs == 0:
            p(f"{kind}-reshape", f"{label}: an empty reshape (a scalar) needs max_batch_size > 0",
              *at, "reshape")
            return
        if any(d < 1 and d != -1 for d in shape):
            p(f"{kind}-reshape", f"{label}: reshape dims are >= 1, or -1", *at, "reshape")
            return

        def chunks(dims):
            out, cur = [], 1
            for d in dims:
                if d == -1:
                    out.append(cur)
                    cur = 1
                else:
                    cur *= d
            return out + [cur]

        dims = list(t.dims)
        if not dims:
            return
        a, b = chunks(dims), chunks(shape)
        if not shape:
            ok = a == [1]
        else:
            ok = a == b
        if not ok:
            p(f"{kind}-reshape", f"{label}: reshape {shape} holds a different number of elements "
                                 f"than dims {dims}", *at, "reshape")

    def _instance_groups(self, cfg, p, platform) -> None:
        G = mc.ModelInstanceGroup
        for i, g in enumerate(cfg.instance_group):
            at = ("instance_group", i)
            label = f"instance group {g.name or i + 1}"
            kind = g.kind
            if g.count < 0:
                p("instance-count", f"{label}: count {g.count} must be >= 0 (Triton quietly runs 1)",
                  *at, "count")
            if any(d < 0 for d in g.gpus):
                p("instance-gpus", f"{label}: gpu ids are >= 0", *at, "gpus")
            if kind == G.KIND_AUTO:
                # Triton resolves KIND_AUTO to KIND_GPU when GPUs exist (and all listed ones do)
                if self.gpus is not None and (self.gpus == 0 or any(d >= self.gpus for d in g.gpus)):
                    kind = G.KIND_CPU
                elif self.gpus is not None:
                    kind = G.KIND_GPU
            if kind in (G.KIND_CPU, G.KIND_MODEL) and g.gpus:
                p("instance-gpus", f"{label}: {G.Kind.Name(kind)} lists gpus"
                                   + (" (KIND_AUTO on a host without those GPUs)" if g.kind == G.KIND_AUTO else "")
                                   + ": remove gpus, or use KIND_GPU", *at, "gpus")
            if kind == G.KIND_GPU and self.gpus is not None:
                if self.gpus == 0:
                    p("instance-gpus", f"{label}: KIND_GPU, but the host has no GPU", *at, "kind")
                for d in g.gpus:
                    if d >= self.gpus:
                        p("instance-gpus", f"{label}: gpu {d} does not exist on a host with "
                                           f"{self.gpus} GPU(s)", *at, "gpus")
            if g.profile:
                if platform != "tensorrt_plan":
                    p("instance-profile", f"{label}: profile is for TensorRT models only", *at, "profile")
                for prof in g.profile:
                    if not re.fullmatch(r"\s*[+]?[0-9]+.*", prof):
                        p("instance-profile", f"{label}: profile '{prof}' must be a non-negative "
                                              "integer", *at, "profile")

    def _warmup(self, cfg, p) -> None:
        inputs = {t.name: t for t in cfg.input}
        for i, w in enumerate(cfg.model_warmup):
            at = ("model_warmup", i)
            for name, wi in sorted(w.inputs.items()):
                if name not in inputs:
                    p("warmup", f"warmup '{w.name}' feeds '{name}', which is not an input", *at)
                    continue
                # the warmup request is checked like any request (type and shape) at load
                t, dims = inputs[name], list(wi.dims)
                if any(d < 0 for d in dims):
                    p("warmup", f"warmup '{w.name}' input '{name}' dims {dims}: every dimension "
                                "must be given (no -1)", *at)
                elif t.data_type != wi.data_type:
                    p("warmup", f"warmup '{w.name}' input '{name}' is {mc.DataType.Name(wi.data_type)}, "
                                f"the input is {mc.DataType.Name(t.data_type)}", *at)
                elif len(dims) != len(t.dims) or any(c not in (-1, d) for c, d in zip(t.dims, dims, strict=True)):
                    p("warmup", f"warmup '{w.name}' input '{name}' dims {dims} do not fit the "
                                f"input's dims {list(t.dims)}", *at)
            for name, t in inputs.items():
                if name not in w.inputs and not t.optional:
                    p("warmup", f"warmup '{w.name}' does not feed input '{name}'", *at)
            if cfg.max_batch_size and w.batch_size > cfg.max_batch_size:
                p("warmup", f"warmup '{w.name}' batch_size {w.batch_size} > max_batch_size "
                            f"{cfg.max_batch_size}", *at)

    # -- files on disk -------------------------------------------------------------------------
    def _files(self, entry: _Entry, p) -> None:
        cfg, model, model_dir = entry.cfg, entry.name, entry.dir
        versions, odd = _version_dirs(model_dir)
        for name, why in odd:
            self.add(model, name, None, "version-dir", why)
        load, absent = _versions_to_load(cfg, versions)
        for v in absent:
            p("version-policy", f"version_policy names version {v}, but there is no {v}/ directory",
              "version_policy")
        entry.loaded_versions = tuple(load)
        if not load:
            if not versions:
                self.add(model, "", None, "version-missing",
                         "no version directory: add 1/ with the model file in it"
                         + (" (an ensemble needs an empty 1/ too; keep a placeholder file in it "
                            "under git)" if entry.platform == ENSEMBLE else ""))
            elif not absent:
                p("version-policy", "the version_policy selects no version", "version_policy")
        dmf = cfg.default_model_filename
        if dmf and (os.path.isabs(dmf) or ".." in Path(dmf).parts or "/" in dmf):
            p("unsafe-path", f"default_model_filename \"{dmf}\" must be a plain file name in the "
                             "version directory", "default_model_filename")
            return
        self._referenced_files(entry, p, [versions[v] for v in load])
        if entry.platform == ENSEMBLE:
            return
        if dmf and entry.backend == "python" and not dmf.endswith(".py"):
            p("model-file", f"default_model_filename \"{dmf}\": the python backend loads only a "
                            "file whose name ends with .py", "default_model_filename")
            return
        wanted = None
        if dmf:
            wanted = (dmf, "any")
        elif entry.platform in PLATFORM_FILE:
            wanted = PLATFORM_FILE[entry.platform]
        elif entry.backend in MODEL_FILE:
            wanted = MODEL_FILE[entry.backend]
        for v in load:
            vdir = model_dir / versions[v]
            if wanted:
                name, kind = wanted
                path = vdir / name
                if not path.exists():
                    self.add(model, f"{versions[v]}/{name}", None, "model-file",
                             f"version {v} has no {name} (the {entry.backend or entry.platform} "
                             "backend loads it)")
                    continue
                if kind == "file" and not path.is_file():
                    self.add(model, f"{versions[v]}/{name}", None, "model-file",
                             f"{name} must be a file, not a directory")
                    continue
                if kind == "dir" and not path.is_dir():
                    self.add(model, f"{versions[v]}/{name}", None, "model-file",
                             f"{name} must be a directory (a SavedModel)")
                    continue
            if entry.backend == "openvino" and wanted and wanted[0].endswith(".xml"):
                bin_path = vdir / (wanted[0][:-4] + ".bin")
                if not bin_path.exists():
                    self.add(model, f"{versions[v]}/{bin_path.name}", None, "model-file",
                             f"OpenVINO needs {bin_path.name} next to {wanted[0]}")
            if entry.backend == "python" and wanted and wanted[0].endswith(".py"):
                self._python_source(model, versions[v], vdir / wanted[0])
            if entry.backend == "onnxruntime" and self.onnx_signatures and wanted:
                onnx_path = vdir / wanted[0]
                if onnx_path.is_dir():
                    onnx_path = onnx_path / "model.onnx"
                self._onnx_signature(entry, f"{versions[v]}/{wanted[0]}", onnx_path, p)

    def _referenced_files(self, entry: _Entry, p, version_dirs: list[str]) -> None:
        """Files the configuration names by name: Triton opens each when it loads the model and
        refuses the model when one is missing (labels: Model::Init; warmup data: the instance's
        warmup; cc_model_filenames and EXECUTION_ENV_PATH: the backend)."""
        cfg, model, model_dir = entry.cfg, entry.name, entry.dir

        def inside(rel: str, what: str, *at) -> Path | None:
            path = Path(os.path.normpath(model_dir / rel))
            if os.path.isabs(rel) or (path != model_dir and model_dir not in path.parents):
                p("unsafe-path", f"{what} \"{rel}\" must name a file inside the model directory", *at)
                return None
            return path

        def missing(path: Path, rel: str, what: str, *at) -> bool:
            if path.is_file() or path.is_dir():
                return False
            self.add(model, rel, lines_of(*at), "referenced-file",
                     f"{what} names {rel}, which is not in the model directory: add the file or "
                     "remove the setting")
            return True

        def lines_of(*at):
            return entry.lines.line(*at) if at else None

        for i, out in enumerate(cfg.output):
            if out.label_filename:
                at = ("output", i, "label_filename")
                path = inside(out.label_filename, "label_filename", *at)
                if path is not None:
                    missing(path, out.label_filename, f"output '{out.name}' label_filename", *at)
        for i, w in enumerate(cfg.model_warmup):
            at = ("model_warmup", i)
            for name, inp in sorted(w.inputs.items()):
                if inp.WhichOneof("input_data_type") != "input_data_file":
                    continue
                rel = f"warmup/{inp.input_data_file}"
                path = inside(rel, "input_data_file", *at)
                if path is None or missing(path, rel, f"warmup '{w.name}' input '{name}'", *at):
                    continue
                type_name = mc.DataType.Name(inp.data_type)
                if type_name in TYPE_BYTES and all(d > 0 for d in inp.dims):
                    need = TYPE_BYTES[type_name]
                    for d in inp.dims:
                        need *= d
                    have = path.stat().st_size if path.is_file() else 0
                    if have < need:
                        self.add(model, rel, lines_of(*at), "referenced-file",
                                 f"warmup '{w.name}' input '{name}' needs {need} bytes "
                                 f"({type_name}, dims {list(inp.dims)}); {rel} has {have}")
        for cc, name in sorted(cfg.cc_model_filenames.items()):
            for vname in version_dirs if entry.platform != ENSEMBLE else ():
                rel = f"{vname}/{name}"
                path = inside(rel, f"cc_model_filenames[\"{cc}\"]", "cc_model_filenames")
                if path is not None:
                    missing(path, rel, f"cc_model_filenames[\"{cc}\"] (the file for GPUs of compute "
                                       f"capability {cc})", "cc_model_filenames")
        env = cfg.parameters.get("EXECUTION_ENV_PATH")
        if env is not None and entry.backend == "python":
            value = env.string_value
            if value.startswith(MODEL_DIRECTORY_VAR):
                rel = value[len(MODEL_DIRECTORY_VAR):].lstrip("/")
                path = inside(rel, "EXECUTION_ENV_PATH", "parameters")
                if path is not None and rel:
                    missing(path, rel, "parameters EXECUTION_ENV_PATH", "parameters")

    def _python_source(self, model: str, vname: str, path: Path) -> None:
        try:
            source = path.read_bytes()
        except OSError as e:
            self.add(model, f"{vname}/{path.name}", None, "model-file", f"cannot read: {e.strerror}")
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compile(source, str(path), "exec", dont_inherit=True)
        except SyntaxError as e:
            self.add(model, f"{vname}/{path.name}", e.lineno, "python-syntax",
                     f"the python backend cannot import it: {e.msg}")
        except ValueError as e:
            self.add(model, f"{vname}/{path.name}", None, "python-syntax", str(e))

    def _onnx_signature(self, entry: _Entry, rel: str, path: Path, p) -> None:
        """Inputs and outputs against the ONNX model's graph, as the onnxruntime backend checks
        them at load (only where the ``onnx`` package is installed)."""
        try:
            import onnx
        except ImportError:
            return
        if not path.is_file():
            self.add(entry.name, rel, None, "model-file", f"{path.name} not found")
            return
        try:
            graph = onnx.load(str(path), load_external_data=False).graph
        except Exception as e:  # noqa: BLE001 - any failure to read is a broken model file
            self.add(entry.name, rel, None, "onnx-model", f"not a readable ONNX model: {e}")
            return
        cfg = entry.cfg
        initializers = {i.name for i in graph.initializer}
        model_io = {
            "input": {i.name: i for i in graph.input if i.name not in initializers},
            "output": {o.name: o for o in graph.output},
        }
        for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
            provided = model_io[kind]
            for i, t in enumerate(tensors):
                if not t.name:
                    continue
                if t.name not in provided:
                    p("onnx-signature", f"{kind} '{t.name}' is not in {rel} (its {kind}s: "
                                        f"{', '.join(sorted(provided)) or 'none'})", kind, i, "name")
                    continue
                tt = provided[t.name].type.tensor_type
                have = ONNX_TYPES.get(tt.elem_type)
                want = mc.DataType.Name(t.data_type)
                if have and t.data_type != mc.TYPE_INVALID and have != want:
                    p("onnx-signature", f"{kind} '{t.name}' is {have} in {rel}, not {want}",
                      kind, i, "data_type")
                if not tt.HasField("shape") or not t.dims:
                    continue
                model_dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
                if cfg.max_batch_size > 0:
                    if not model_dims:
                        continue
                    model_dims = model_dims[1:]
                dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
                if len(dims) != len(model_dims) or any(
                        a != b and a != -1 and b != -1 for a, b in zip(dims, model_dims, strict=False)):
                    batch = " (without the batch dimension)" if cfg.max_batch_size > 0 else ""
                    p("onnx-signature", f"{kind} '{t.name}' has dims {dims} in the config but "
                                        f"{model_dims}{batch} in {rel}", kind, i, "dims")
        configured = {t.name for t in cfg.input}
        for name in model_io["input"]:
            if name not in configured:
                p("onnx-signature", f"{rel} has input '{name}', which the config does not list", "input")

    # -- ensembles -----------------------------------------------------------------------------
    def check_ensemble(self, entry: _Entry) -> None:
        cfg, lines, model = entry.cfg, entry.lines, entry.name
        es = cfg.ensemble_scheduling

        def p(rule, message, *path):
            self.add(model, "config.pbtxt", lines.line(*path) if path else None, rule, message)

        if not es.step:
            p("ensemble", "an ensemble needs at least one step", "ensemble_scheduling")
            return
        mbs = cfg.max_batch_size
        # ensemble tensor -> (data type, dims, batching, who)
        tensors: dict[str, tuple[int, list[int], bool, str]] = {}
        for t in cfg.input:
            tensors[t.name] = (t.data_type, list(t.reshape.shape if t.HasField("reshape") else t.dims),
                               mbs > 0, model)
        for t in cfg.output:
            tensors.setdefault(t.name, (t.data_type, list(t.reshape.shape if t.HasField("reshape") else t.dims),
                                        mbs > 0, model))
        written: set[str] = set()
        producers: dict[str, int] = {}
        edges: list[tuple[set[str], set[str]]] = []
        for i, step in enumerate(es.step):
            at = ("ensemble_scheduling", 0, "step", i)
            label = f"step {i + 1} ({step.model_name or 'no model_name'})"
            if not step.model_name:
                p("ensemble-step", f"{label} needs model_name", *at)
                continue
            if not step.input_map:
                p("ensemble-step", f"{label} needs input_map", *at)
            if not step.output_map:
                p("ensemble-step", f"{label} needs output_map", *at)
            for t in step.output_map.values():
                if t in producers:
                    p("ensemble-tensor", f"{label} writes '{t}', which step {producers[t] + 1} "
                                         "writes already", *at, "output_map")
                producers.setdefault(t, i)
            edges.append((set(step.input_map.values()), set(step.output_map.values())))
            written |= set(step.output_map.values())
            target = self.entries.get(step.model_name)
            if target is None:
                p("ensemble-step", f"{label}: there is no model '{step.model_name}' in the repository",
                  *at, "model_name")
                continue
            tcfg = target.cfg
            if tcfg is None:
                continue  # its own problems are reported for it
            if step.model_version != -1 and step.model_version not in target.loaded_versions:
                unset = " (0 is what an unset model_version means)" if step.model_version == 0 else ""
                p("ensemble-step", f"{label}: version {step.model_version} of '{step.model_name}' is "
                                   f"not loaded{unset}: use model_version: -1 for its latest",
                  *at, "model_version")
            if tcfg.max_batch_size and tcfg.max_batch_size < mbs:
                p("ensemble-step", f"the ensemble's max_batch_size {mbs} exceeds {step.model_name}'s "
                                   f"{tcfg.max_batch_size}", "max_batch_size")
            t_batch = tcfg.max_batch_size > 0
            t_inputs = {t.name: t for t in tcfg.input}
            t_outputs = {t.name: t for t in tcfg.output}
            for key, value in step.input_map.items():
                if key not in t_inputs:
                    p("ensemble-tensor", f"{label}: '{step.model_name}' has no input '{key}' (its "
                                         f"inputs: {', '.join(t_inputs) or 'none'})", *at, "input_map")
                    continue
                self._consistent(tensors, value, t_inputs[key], t_batch, step.model_name, label, p, at)
            for name, t in t_inputs.items():
                if name not in step.input_map and not t.optional:
                    p("ensemble-tensor", f"{label}: input '{name}' of '{step.model_name}' is not "
                                         "mapped", *at, "input_map")
            for key, value in step.output_map.items():
                if key not in t_outputs:
                    p("ensemble-tensor", f"{label}: '{step.model_name}' has no output '{key}' (its "
                                         f"outputs: {', '.join(t_outputs) or 'none'})", *at, "output_map")
                    continue
                self._consistent(tensors, value, t_outputs[key], t_batch, step.model_name, label, p, at)
        # data flow: every ensemble output written, every ensemble input and step tensor read
        ready = {t.name for t in cfg.input}
        changed = True
        while changed:
            changed = False
            for ins, outs in edges:
                if ins <= ready and not outs <= ready:
                    ready |= outs
                    changed = True
        read = set().union(*(ins for ins, _ in edges)) if edges else set()
        for i, t in enumerate(cfg.input):
            if t.name not in read:
                p("ensemble-tensor", f"ensemble input '{t.name}' is read by no step", "input", i)
        for i, t in enumerate(cfg.output):
            if t.name not in written:
                p("ensemble-tensor", f"ensemble output '{t.name}' is written by no step", "output", i)
            elif t.name not in ready:
                p("ensemble-tensor", f"ensemble output '{t.name}' is never computed: a step before it "
                                     "reads a tensor no one writes", "output", i)
        outputs = {t.name for t in cfg.output}
        for name in sorted((read | written) - outputs - {t.name for t in cfg.input}):
            if name not in written:
                p("ensemble-tensor", f"'{name}' is read by a step but written by none (not an "
                                     "ensemble input either)", "ensemble_scheduling")
            elif name not in read:
                p("ensemble-tensor", f"'{name}' is written by a step but read by none (not an "
                                     "ensemble output either)", "ensemble_scheduling")

    @staticmethod
    def _consistent(tensors, name, t, batching, who, label, p, at) -> None:
        dims = list(t.dims)
        if name not in tensors:
            tensors[name] = (t.data_type, dims, batching, who)
            return
        dtype, odims, obatch, owho = tensors[name]
        if dtype != t.data_type:
            p("ensemble-tensor", f"{label}: '{name}' is {mc.DataType.Name(dtype)} in {owho} but "
                                 f"{mc.DataType.Name(t.data_type)} in {who}", *at)
            return

        def same(a, b):
            return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))

        full_a = ([-1] if obatch else []) + odims
        full_b = ([-1] if batching else []) + dims
        if not same(odims, dims) and not same(full_a, full_b):
            p("ensemble-tensor", f"{label}: '{name}' has shape {full_a} in {owho} but {full_b} in "
                                 f"{who}", *at)

    def check_cycles(self) -> None:
        graph = {n: [s.model_name for s in e.cfg.ensemble_scheduling.step]
                 for n, e in self.entries.items() if e.cfg is not None and e.platform == ENSEMBLE}
        state: dict[str, int] = {}

        def visit(n, trail):
            state[n] = 1
            for m in graph.get(n, []):
                if state.get(m) == 1:
                    cycle = trail[trail.index(m):] + [m] if m in trail else [n, m]
                    e = self.entries[n]
                    self.add(n, "config.pbtxt", e.lines.line("ensemble_scheduling"), "ensemble-cycle",
                             f"ensembles depend on each other in a circle: {' -> '.join(cycle)}")
                elif m in graph and state.get(m) is None:
                    visit(m, trail + [m])
            state[n] = 2

        for n in sorted(graph):
            if state.get(n) is None:
                visit(n, [n])


# ---- unsafe entries -------------------------------------------------------------------------

def _unsafe_paths(repo: Path, add: Callable[..., None]) -> None:
    root = Path(os.path.realpath(repo))
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = path.relative_to(repo)
            model, file = rel.parts[0], "/".join(rel.parts[1:])
            if not path.is_symlink():
                continue
            target = os.readlink(path)
            real = Path(os.path.realpath(path))
            if os.path.isabs(target):
                add(model, file, None, "unsafe-path",
                    f"symlink to the absolute path {target}: it breaks when the repository is "
                    "copied to hosts; use a relative link inside the repository, or a copy")
            elif real != root and root not in real.parents:
                add(model, file, None, "unsafe-path",
                    f"symlink {target} points outside the repository ({real}): copy the file in")
            elif not real.exists():
                add(model, file, None, "broken-symlink", f"symlink {target} points to nothing")


#: What a model directory may be called (Triton itself refuses little more than names that escape
#: the repository; the fleet puts names in URLs and in commands run on the hosts).
MODEL_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")


def _check_model_name(name: str, add) -> bool:
    if ".." in name or "/" in name or "\\" in name:
        add(name, "", None, "model-name",
            f"model name '{name}' contains '..': newer Triton refuses path traversal in names; "
            "rename the directory")
        return False
    if not name.strip() or any(c.isspace() for c in name):
        add(name, "", None, "model-name",
            f"model name '{name}' contains white space: Triton cannot start its instances "
            "(the python stub fails to parse the name); rename the directory")
        return False
    if not MODEL_NAME.fullmatch(name):
        bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "_.-"))})
        why = (f"has {', '.join(repr(c) for c in bad)}" if bad else "starts with '-'")
        add(name, "", None, "model-name",
            f"model name {name!r} {why}: model names are letters, digits, '_', '.' and '-' (not first), "
            "because the name is part of Triton's URLs (/v2/models/<name>) and of commands run on the "
            "hosts; rename the directory")
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
    checker = _Checker(repo, gpus, KNOWN_BACKENDS | frozenset(backends), onnx_signatures)
    add = checker.add
    if not repo.is_dir():
        add("", str(repo), None, "repository", "not a directory")
        return checker.problems
    _unsafe_paths(repo, add)
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
            hidden = (" (Triton loads every directory of the repository as a model, hidden ones "
                      "too: remove it or move it out)" if name.startswith(".") else "")
            add(name, "config.pbtxt", None, "config-missing",
                "no config.pbtxt, which --strict-model-config=true requires" + hidden)
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
    checker = _Checker(None, gpus, KNOWN_BACKENDS | frozenset(backends), onnx_signatures=True)
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
    tells the backend from: as :func:`_autocomplete` decides), the map empty where the config
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
        _, backend, err = _autocomplete(cfg, model_dir, name)
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
