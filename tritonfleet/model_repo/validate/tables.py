"""What Triton accepts in a model repository, as tables: the backends of the fleet's image,
fields newer than its server, platform and backend names, the model file each backend loads,
data type sizes, ONNX's types; every rule id, and the :class:`Problem` a rule reports."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .. import contents

#: Backends shipped in the tritonserver <release>-py3 image the fleet runs (/opt/tritonserver/backends).
KNOWN_BACKENDS = frozenset(
    {
        "dali",
        "fil",
        "identity",
        "onnxruntime",
        "openvino",
        "python",
        "pytorch",
        "repeat",
        "square",
        "tensorflow",
        "tensorrt",
    }
)

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
    # what a repository may contain (one definition, shared with the deploy: model_repo.contents)
    **contents.RULES,
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
    "onnx-signature": "inputs and outputs match model.onnx as the onnxruntime backend compares them (names, "
    "count, types, dims with the batch dimension, -1 and reshape, sequence controls)",
    "unchecked": "every check the repository needs can run (the onnx package for model.onnx)",
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

CANONICAL_VERSION = re.compile(r"0|[1-9][0-9]*")
STOLL_PREFIX = re.compile(r"\s*[+-]?[0-9]+")  # what std::stoll accepts at the start of a name

# bytes per element (Triton's GetDataTypeByteSize); TYPE_STRING has no fixed size
TYPE_BYTES = {
    "TYPE_BOOL": 1,
    "TYPE_UINT8": 1,
    "TYPE_UINT16": 2,
    "TYPE_UINT32": 4,
    "TYPE_UINT64": 8,
    "TYPE_INT8": 1,
    "TYPE_INT16": 2,
    "TYPE_INT32": 4,
    "TYPE_INT64": 8,
    "TYPE_FP16": 2,
    "TYPE_FP32": 4,
    "TYPE_FP64": 8,
    "TYPE_BF16": 2,
}
MODEL_DIRECTORY_VAR = "$$TRITON_MODEL_DIRECTORY"


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
