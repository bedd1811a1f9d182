"""An ONNX model's inputs and outputs against its config.pbtxt, compared the way Triton's
onnxruntime backend compares them when it loads the model.

The reference is the backend's source (triton-inference-server/onnxruntime_backend) of the
fleet's Triton release, branch r24.08 (commit ab34b48e, 2024-08-15); the newest source read
(commit 00fd3e87, 2026-06-29) compares the same way and only adds BF16 I/O (commit 89b93a7,
"Enable bfloat16 I/O tensor dtype (#335)"), which 24.08 refuses as an unsupported data type:

* ``src/onnxruntime_utils.cc`` ``CompareDimsSupported``: with ``max_batch_size`` > 0 the model's
  first dimension must be -1 (variable), and the configuration's dims get a leading -1; then the
  ranks must be equal and each model dimension that is not -1 must equal the configuration's
  (``compare_exact``: every dimension, -1 included, must be equal). So a config ``-1`` against
  a model's fixed size is refused, while a model's -1 takes any configured size.
* ``src/onnxruntime.cc`` ``ModelInstanceState::ValidateInputs``: the model's inputs (graph
  inputs that are not initializers: ``SessionGetInputCount``) must number exactly the
  configuration's inputs (less the optional ones) plus its batch inputs, sequence controls and
  sequence states; each configured input must be a model input or an overridable initializer
  (``CheckAllowedModelInput``), of the configured data type; an optional input is refused when
  ``max_batch_size`` != 0; the dims compared are the ``reshape`` when one is given, else
  ``dims``, with ``compare_exact`` false; a ragged input needs the model shape [-1]; a model
  input of rank 0 (a scalar) takes only configured dims that are all 1.
* ``ModelInstanceState::ValidateOutputs``: each configured output must be a model output
  (``CheckAllowedModelOutput``), of its data type, its dims compared with ``compare_exact``
  true (a batch output's are not compared); sequence state outputs by name and data type.
* ``ValidateBooleanSequenceControl`` / ``ValidateTypedSequenceControl``: a control tensor the
  configuration names must be a model input of dims [1] after the batch dimension, of the
  control's data type (INT32, FP32 or BOOL for the start/end/ready flags; the correlation id's
  data_type).
* ``InputOutputInitializerInfos``: every input and output of the model must be a tensor
  (a sequence or map is refused, whether the configuration names it or not).

The model is read with the ``onnx`` package (a dependency of tritonfleet), as ONNX Runtime
reports it to the backend: a dimension without a fixed value (``dim_param``, or none) is -1;
initializers that are also graph inputs are overridable from IR version 4 on. tests/
test_onnx_signature.py checks that reading against onnxruntime's own session on real models of
every shape class, and the rules above on generated cases. The tritonserver the tests run has
only the python backend, so the onnxruntime backend itself is not run here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UsageError
from ..core.triton_schema import mc

#: ONNX's TensorProto.DataType -> Triton's data type name (the backend's ConvertFromOnnxDataType)
ONNX_TO_TRITON = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}
#: Triton's data type name -> ONNX's as the fleet's release reads a config (r24.08's
#: ModelConfigDataTypeToOnnxDataType: no BF16, which came later; any other name is an
#: "unsupported datatype")
TRITON_TO_ONNX = {v: k for k, v in ONNX_TO_TRITON.items() if v != "TYPE_BF16"}

#: protobuf refuses a message of 2 GiB or more, so ONNX keeps the weights of larger models in
#: external data files ("The maximum size of a protobuf file is 2GB. If an ONNX model is larger
#: than 2GB, it's usually generated with external data", onnxruntime.ai, Working with Large Models)
PROTOBUF_LIMIT = 2**31
#: wire types a protobuf field's tag may carry (0 varint, 1 64-bit, 2 length-delimited, 5
#: 32-bit; 3 and 4 are the deprecated groups no ONNX field uses); field numbers start at 1
#: (protobuf.dev, Encoding: "Message Structure")
WIRE_TYPES = (0, 1, 2, 5)


class OnnxReadError(UsageError, ValueError):
    """The file is not an ONNX model the backend could load."""


@dataclass(frozen=True)
class Tensor:
    """One input or output as ONNX Runtime reports it: ``elem_type`` (ONNX's number, 0 unknown),
    ``dims`` (-1 for a dimension without a fixed value; () for a scalar or a tensor without a
    shape, as GetDimensionsCount reports 0 for both), ``kind`` ("tensor", else what it is)."""

    name: str
    elem_type: int = 0
    dims: tuple[int, ...] = ()
    kind: str = "tensor"

    @property
    def triton_type(self) -> str:
        return ONNX_TO_TRITON.get(self.elem_type, f"an ONNX type ({self.elem_type}) Triton has no name for")


@dataclass(frozen=True)
class ModelIO:
    """``inputs``: graph inputs that are not initializers (SessionGetInputCount);
    ``overridable``: graph inputs that are also initializers (IR version >= 4), which requests
    may feed; ``outputs``: graph outputs."""

    inputs: dict[str, Tensor]
    overridable: dict[str, Tensor]
    outputs: dict[str, Tensor]


def _tensor(value_info) -> Tensor:
    t = value_info.type
    which = t.WhichOneof("value")
    if which != "tensor_type":
        return Tensor(value_info.name, kind=which or "unknown")
    tt = t.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim) if tt.HasField("shape") else ()
    return Tensor(value_info.name, tt.elem_type, dims)


def _looks_like_protobuf(path: Path) -> str | None:
    """Why the file cannot be a protobuf message, from its first bytes (None: it may be one).
    Reads 16 bytes, however large the file: a file of zeros is refused without reading it."""
    with open(path, "rb") as f:
        head = f.read(16)
    if not head:
        return "the file is empty"
    tag, shift = 0, 0
    for byte in head:
        tag |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    else:
        return "it does not start with a protobuf field tag"
    if tag >> 3 == 0 or tag & 7 not in WIRE_TYPES:
        return (
            f"it starts with bytes no protobuf message starts with ({head[:4].hex()}: field number "
            f"{tag >> 3}, wire type {tag & 7})"
        )
    return None


def read_model(path: str | os.PathLike) -> ModelIO:
    """The model's inputs and outputs, read without its weights (external data is not loaded).
    Raises OnnxReadError naming what is wrong."""
    import onnx  # a dependency; imported here, as the deploy needs it only for onnxruntime models
    from google.protobuf.message import DecodeError

    path = Path(path)
    size = path.stat().st_size
    why = _looks_like_protobuf(path)
    if why:
        raise OnnxReadError(f"not an ONNX model: {why}")
    if size >= PROTOBUF_LIMIT:
        raise OnnxReadError(
            f"{size} bytes: protobuf cannot read a message of 2 GiB or more; a model this large "
            "keeps its weights in external data files (onnx.save_model(..., "
            "save_as_external_data=True), model.onnx as a directory)"
        )
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise OnnxReadError(f"not a readable ONNX model: {e}") from None
    graph = model.graph
    if not graph.output:
        raise OnnxReadError("not an ONNX model: its graph has no outputs")
    initializers = {i.name for i in graph.initializer} | {i.values.name for i in graph.sparse_initializer}
    inputs, overridable = {}, {}
    for vi in graph.input:
        if vi.name in initializers:
            if model.ir_version >= 4:
                overridable[vi.name] = _tensor(vi)
        else:
            inputs[vi.name] = _tensor(vi)
    return ModelIO(inputs, overridable, {vi.name: _tensor(vi) for vi in graph.output})


# ---- the backend's rules -----------------------------------------------------------------------


def compare_dims(
    model_shape: tuple[int, ...] | list[int], dims: list[int], max_batch_size: int, compare_exact: bool
) -> str | None:
    """Why the backend refuses configured ``dims`` for a model tensor of ``model_shape`` (None:
    it accepts them): onnxruntime_utils.cc ``CompareDimsSupported``."""
    model_shape, dims = list(model_shape), list(dims)
    if max_batch_size > 0:
        if not model_shape or model_shape[0] != -1:
            return (
                f"with max_batch_size > 0 the model's first dimension must be -1 (the batch), but the model's "
                f"shape is {model_shape}"
            )
        full = [-1, *dims]
        batch = " (the batch dimension, then the config's dims)"
    else:
        full, batch = dims, ""
    ok = len(model_shape) == len(full) and all(
        m == c for m, c in zip(model_shape, full, strict=False) if compare_exact or m != -1
    )
    if ok:
        return None
    return f"the model's shape is {model_shape}, the config's is {full}{batch}"


def _scalar_dims_problem(dims: list[int]) -> str | None:
    """A model tensor of rank 0 takes only configured dims that are all 1 (the backend's
    ValidateInputs/ValidateOutputs, when the model reports no dimension)."""
    if all(d == 1 for d in dims):
        return None
    return f"the model's tensor is a scalar (no dimension): the config's dims must all be 1, not {dims}"


@dataclass(frozen=True)
class Mismatch:
    """One reason the backend refuses the model: ``at`` the config field path ("input", i,
    "dims") for the line, ``message`` the reason."""

    at: tuple
    message: str


def _dims_of(t) -> list[int]:
    return list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)


def _control_tensors(cfg, mc) -> list[tuple[str, str, str]]:
    """[(kind, tensor name, Triton data type)] of the sequence batcher's controls, as
    GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties give them."""
    K = mc.ModelSequenceBatching.Control
    out = []
    for ci in cfg.sequence_batching.control_input:
        for c in ci.control:
            if c.kind == K.CONTROL_SEQUENCE_CORRID:
                dtype = mc.DataType.Name(c.data_type)
            elif len(c.int32_false_true):
                dtype = "TYPE_INT32"
            elif len(c.fp32_false_true):
                dtype = "TYPE_FP32"
            elif len(c.bool_false_true):
                dtype = "TYPE_BOOL"
            else:
                continue  # the config's own rules refuse it
            if c.kind in (
                K.CONTROL_SEQUENCE_START,
                K.CONTROL_SEQUENCE_END,
                K.CONTROL_SEQUENCE_READY,
                K.CONTROL_SEQUENCE_CORRID,
            ):
                out.append((K.Kind.Name(c.kind), ci.name, dtype))
    return out


def check(cfg, io: ModelIO, file: str) -> list[Mismatch]:
    """Every reason the onnxruntime backend refuses model ``io`` (the model file ``file``) with
    configuration ``cfg`` (Triton's ModelConfig). The backend stops at the first; all are given."""
    out: list[Mismatch] = []
    mbs = cfg.max_batch_size
    for kind, tensors in (("input", io.inputs), ("output", io.outputs), ("input", io.overridable)):
        for t in tensors.values():
            if t.kind != "tensor":
                out.append(
                    Mismatch(
                        (kind,),
                        f"{file}: {kind} '{t.name}' is a {t.kind.replace('_type', '')}, "
                        "not a tensor: the onnxruntime backend serves tensors only "
                        "(InputOutputInitializerInfos)",
                    )
                )
    # how many inputs the model must have (ModelInstanceState constructor, ValidateInputs)
    controls = _control_tensors(cfg, mc) if cfg.HasField("sequence_batching") else []
    kinds = {k for k, _, _ in controls}
    expected = (
        sum(1 for t in cfg.input if not t.optional)
        + len(cfg.batch_input)
        + len(kinds)
        + len(cfg.sequence_batching.state)
    )
    if len(io.inputs) != expected:
        configured = (
            {t.name for t in cfg.input}
            | {n for _, n, _ in controls}
            | {s.input_name for s in cfg.sequence_batching.state}
            | {n for b in cfg.batch_input for n in b.target_name}
        )
        unlisted = [n for n in io.inputs if n not in configured]
        out.append(
            Mismatch(
                ("input",),
                f"the config expects {expected} input(s), {file} has {len(io.inputs)}"
                + (f"; not in the config: {', '.join(unlisted)}" if unlisted else ""),
            )
        )
    allowed_in = {**io.inputs, **io.overridable}
    for i, t in enumerate(cfg.input):
        if not t.name:
            continue
        if t.optional and mbs != 0:
            out.append(
                Mismatch(
                    ("input", i, "optional"),
                    f"input '{t.name}' is optional, which the onnxruntime "
                    "backend does not support for a batching model "
                    "(max_batch_size > 0)",
                )
            )
        out += _one(t, i, "input", allowed_in, mbs, file, compare_exact=False)
    batch_outputs = {name for b in cfg.batch_output for name in b.target_name}
    for i, t in enumerate(cfg.output):
        if t.name:
            out += _one(t, i, "output", io.outputs, mbs, file, compare_exact=True, dims=t.name not in batch_outputs)
    for i, s in enumerate(cfg.sequence_batching.state):
        model = io.outputs.get(s.output_name)
        at: tuple = ("sequence_batching", 0, "state", i)
        if model is None:
            out.append(
                Mismatch(
                    at,
                    f"sequence state output '{s.output_name}' is not an output of {file} (its "
                    f"outputs: {', '.join(sorted(io.outputs)) or 'none'})",
                )
            )
        elif TRITON_TO_ONNX.get(mc.DataType.Name(s.data_type)) != model.elem_type:
            out.append(
                Mismatch(
                    at,
                    f"sequence state output '{s.output_name}' is {model.triton_type} in {file}, "
                    f"not {mc.DataType.Name(s.data_type)}",
                )
            )
    for kind, name, dtype in controls:
        model = io.inputs.get(name)
        at = ("sequence_batching", 0, "control_input")
        if model is None:
            out.append(Mismatch(at, f"sequence control {kind} names '{name}', which is not an input of {file}"))
            continue
        debatched = list(model.dims[1:] if mbs > 0 else model.dims)
        if debatched != [1]:
            out.append(
                Mismatch(
                    at,
                    f"sequence control '{name}' has dims {debatched} in {file} "
                    f"{'after the batch dimension ' if mbs > 0 else ''}but dims [1] is expected",
                )
            )
        if TRITON_TO_ONNX.get(dtype) != model.elem_type:
            out.append(
                Mismatch(
                    at,
                    f"sequence control '{name}' is {model.triton_type} in {file}, but the config's "
                    f"{kind} control is {dtype}",
                )
            )
    return out


def _one(
    t, i: int, kind: str, provided: dict[str, Tensor], mbs: int, file: str, compare_exact: bool, dims: bool = True
) -> list[Mismatch]:
    model = provided.get(t.name)
    if model is None:
        return [
            Mismatch(
                (kind, i, "name"),
                f"{kind} '{t.name}' is not in {file} (its {kind}s: {', '.join(sorted(provided)) or 'none'})",
            )
        ]
    if model.kind != "tensor":
        return []  # refused above
    out = []
    want = mc.DataType.Name(t.data_type)
    if t.data_type != mc.TYPE_INVALID and want not in TRITON_TO_ONNX:
        out.append(
            Mismatch(
                (kind, i, "data_type"),
                f"{kind} '{t.name}': {want} is a data type the onnxruntime "
                "backend of the fleet's Triton release (24.08) does not "
                'support ("unsupported datatype"; BF16 came later)',
            )
        )
    elif t.data_type != mc.TYPE_INVALID and TRITON_TO_ONNX.get(want) != model.elem_type:
        out.append(Mismatch((kind, i, "data_type"), f"{kind} '{t.name}' is {model.triton_type} in {file}, not {want}"))
    if not dims:
        return out
    config_dims = _dims_of(t)
    if kind == "input" and t.allow_ragged_batch:
        if list(model.dims) != [-1]:
            out.append(
                Mismatch(
                    (kind, i, "allow_ragged_batch"),
                    f"input '{t.name}' is ragged (allow_ragged_batch), which needs the model's shape "
                    f"[-1]; {file} has {list(model.dims)}",
                )
            )
        return out
    why = compare_dims(model.dims, config_dims, mbs, compare_exact) if model.dims else _scalar_dims_problem(config_dims)
    if why:
        where = "reshape" if t.HasField("reshape") else "dims"
        out.append(
            Mismatch(
                (kind, i, where),
                f"{kind} '{t.name}' in {file}: {why}"
                + (
                    ""
                    if not compare_exact or -1 not in model.dims
                    else " (an output's dims must equal the model's, -1 where it has -1)"
                ),
            )
        )
    return out
