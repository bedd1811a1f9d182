"""ONNX signatures compared the way Triton's onnxruntime backend compares them
(tritonfleet.model_repo.onnx_io).

* The dims rule, generated: ``ref_compare_dims`` below is CompareDimsSupported of the backend's
  src/onnxruntime_utils.cc transcribed statement by statement; the validator's rule must give
  the same verdict on every generated (model shape, config dims, max_batch_size, exact) case,
  and the consequences the issue names hold: a fixed batch dimension with max_batch_size > 0,
  and a config -1 against a model's fixed size, are refused.
* Reading the model, differential: real ONNX models of every shape class, built with
  onnx.helper (fixed, symbolic and unknown dimensions, rank 0, no shape, a fixed batch
  dimension, overridable initializers at IR 8 and not at IR 3, a sequence input), read by the
  validator (the onnx package) and by onnxruntime's own session, the API the backend asks
  (SessionGetInputCount, SessionGetOverridableInitializer*, GetDimensions): the same inputs,
  types and dims.
* Whole verdicts, differential: generated configurations for those models, judged by the
  validator and by ``ref_backend`` (ValidateInputs / ValidateOutputs of src/onnxruntime.cc,
  transcribed) applied to what onnxruntime reports.

The tritonserver of the tests has only the python backend, so the onnxruntime backend itself
does not run here: the reference is its source, at the commit docs/model-repository.md names.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper
from tritonclient.grpc import model_config_pb2 as mc

from tritonfleet.model_repo import onnx_io
from tritonfleet.model_repo.validate.repository import validate_repository

FAST = settings(max_examples=200, deadline=None)


# ---- the backend, transcribed ----------------------------------------------------------------

def ref_compare_dims(model_shape: list[int], dims: list[int], max_batch_size: int, compare_exact: bool) -> bool:
    """onnxruntime_utils.cc CompareDimsSupported, statement by statement: True when it returns
    success."""
    supports_batching = max_batch_size > 0
    if supports_batching:
        if len(model_shape) == 0 or model_shape[0] != -1:
            return False
        full_dims = [-1] + list(dims)
        succ = len(model_shape) == len(full_dims)
        if succ:
            for i in range(len(full_dims)):
                model_dim = model_shape[i]
                if compare_exact or model_dim != -1:
                    succ &= model_dim == full_dims[i]
        return succ
    succ = len(model_shape) == len(dims)
    if succ:
        for i in range(len(dims)):
            model_dim = model_shape[i]
            if compare_exact or model_dim != -1:
                succ &= model_dim == dims[i]
    return succ


ORT_TYPES = {"tensor(float)": TP.FLOAT, "tensor(double)": TP.DOUBLE, "tensor(int32)": TP.INT32,
             "tensor(int64)": TP.INT64, "tensor(float16)": TP.FLOAT16, "tensor(bool)": TP.BOOL,
             "tensor(uint8)": TP.UINT8, "tensor(int8)": TP.INT8, "tensor(string)": TP.STRING,
             "tensor(bfloat16)": TP.BFLOAT16}


def ort_view(path: Path):
    """({input: (type, dims)}, {overridable: ...}, {output: ...}) as onnxruntime reports them:
    dims as GetDimensions gives them (-1 for a symbolic or unknown dimension)."""
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def view(args):
        return {a.name: (ORT_TYPES.get(a.type, a.type), tuple(d if isinstance(d, int) else -1 for d in a.shape))
                for a in args}
    return view(s.get_inputs()), view(s.get_overridable_initializers()), view(s.get_outputs())


#: ModelConfigDataTypeToOnnxDataType of the backend's r24.08 branch (the fleet's Triton release),
#: transcribed: no BF16 there
R2408_CONFIG_TYPES = {"TYPE_BOOL": TP.BOOL, "TYPE_UINT8": TP.UINT8, "TYPE_UINT16": TP.UINT16,
                      "TYPE_UINT32": TP.UINT32, "TYPE_UINT64": TP.UINT64, "TYPE_INT8": TP.INT8,
                      "TYPE_INT16": TP.INT16, "TYPE_INT32": TP.INT32, "TYPE_INT64": TP.INT64,
                      "TYPE_FP16": TP.FLOAT16, "TYPE_FP32": TP.FLOAT, "TYPE_FP64": TP.DOUBLE,
                      "TYPE_STRING": TP.STRING}


def ref_backend(cfg: mc.ModelConfig, inputs: dict, overridable: dict, outputs: dict) -> bool:
    """Whether the backend loads the model: ValidateInputs and ValidateOutputs of
    src/onnxruntime.cc (r24.08) transcribed (no sequence batching, batch inputs or outputs
    here), over onnxruntime's view of the model."""
    to_onnx = R2408_CONFIG_TYPES
    if any(not isinstance(t, int) for t, _ in [*inputs.values(), *overridable.values(), *outputs.values()]):
        return False  # InputOutputInitializerInfos: non-tensor I/O
    expected = sum(1 for t in cfg.input if not t.optional)
    if len(inputs) != expected:
        return False
    infos = {**inputs, **overridable}
    for io in cfg.input:
        if io.optional and cfg.max_batch_size != 0:
            return False
        if io.name not in infos:
            return False  # CheckAllowedModelInput
        etype, shape = infos[io.name]
        if to_onnx.get(mc.DataType.Name(io.data_type)) != etype:
            return False
        dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
        if len(shape) != 0:
            if not ref_compare_dims(list(shape), dims, cfg.max_batch_size, False):
                return False
        elif any(d != 1 for d in dims):
            return False
    for io in cfg.output:
        if io.name not in outputs:
            return False  # CheckAllowedModelOutput
        etype, shape = outputs[io.name]
        if to_onnx.get(mc.DataType.Name(io.data_type)) != etype:
            return False
        dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
        if len(shape) != 0:
            if not ref_compare_dims(list(shape), dims, cfg.max_batch_size, True):
                return False
        elif any(d != 1 for d in dims):
            return False
    return True


# ---- the dims rule on generated cases ------------------------------------------------------------

dim = st.sampled_from([-1, 1, 2, 3, 4, 16])
shapes = st.lists(dim, max_size=4)


@FAST
@given(model=shapes, dims=shapes, mbs=st.sampled_from([0, 1, 8]), exact=st.booleans())
def test_the_dims_rule_is_the_backends(model, dims, mbs, exact):
    assert (onnx_io.compare_dims(model, dims, mbs, exact) is None) == ref_compare_dims(model, dims, mbs, exact)


@FAST
@given(model=st.lists(dim, min_size=1, max_size=4), mbs=st.integers(1, 64), exact=st.booleans())
def test_a_fixed_batch_dimension_is_refused_when_the_model_batches(model, mbs, exact):
    fixed = [4, *model[1:]]
    assert onnx_io.compare_dims(fixed, [d if d != -1 else 1 for d in model[1:]], mbs, exact) is not None


@FAST
@given(model=st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=4), data=st.data(),
       mbs=st.sampled_from([0, 8]), exact=st.booleans())
def test_a_config_wildcard_against_a_fixed_size_is_refused(model, data, mbs, exact):
    i = data.draw(st.integers(0, len(model) - 1))
    dims = list(model)
    dims[i] = -1
    shape = [-1, *model] if mbs else model
    assert onnx_io.compare_dims(shape, dims, mbs, exact) is not None
    assert onnx_io.compare_dims(shape, list(model), mbs, exact) is None


@FAST
@given(model=st.lists(dim, min_size=1, max_size=4), data=st.data())
def test_a_model_wildcard_takes_any_input_size_but_only_minus_one_for_an_output(model, data):
    dims = [data.draw(st.sampled_from([-1, 7])) if d == -1 else d for d in model]
    assert onnx_io.compare_dims(model, dims, 0, compare_exact=False) is None
    assert (onnx_io.compare_dims(model, dims, 0, compare_exact=True) is None) == (dims == model)


# ---- real models of every shape class ---------------------------------------------------------

vi = helper.make_tensor_value_info


def _no_shape(name: str, elem: int = TP.FLOAT) -> onnx.ValueInfoProto:
    v = onnx.ValueInfoProto()
    v.name = name
    v.type.tensor_type.elem_type = elem
    return v


def _identity(shape, elem=TP.FLOAT, name_in="INPUT0", name_out="OUTPUT0", ir=8):
    make = (lambda n: _no_shape(n, elem)) if shape is None else (lambda n: vi(n, elem, list(shape)))
    graph = helper.make_graph([helper.make_node("Identity", [name_in], [name_out])], "g",
                              [make(name_in)], [make(name_out)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = ir
    return m


def _with_initializer(ir: int):
    w = helper.make_tensor("W", TP.FLOAT, [4], [1, 2, 3, 4])
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"])], "g",
                              [vi("INPUT0", TP.FLOAT, ["batch", 4]), vi("W", TP.FLOAT, [4])],
                              [vi("OUTPUT0", TP.FLOAT, ["batch", 4])], initializer=[w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = ir
    return m


def _two_inputs():
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["OUTPUT0"])], "g",
                              [vi("A", TP.INT64, [-1, 3]), vi("B", TP.INT64, [1, 3])],
                              [vi("OUTPUT0", TP.INT64, [-1, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _sequence_input():
    graph = helper.make_graph([helper.make_node("SequenceLength", ["S"], ["OUTPUT0"])], "g",
                              [helper.make_tensor_sequence_value_info("S", TP.FLOAT, None)],
                              [vi("OUTPUT0", TP.INT64, [])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


#: shape class -> the model
MODELS = {
    "dynamic-batch": lambda: _identity(["batch", 4]),
    "unknown-batch": lambda: _identity([None, 4]),
    "fixed-batch": lambda: _identity([1, 4]),
    "fixed": lambda: _identity([2, 4]),
    "all-dynamic": lambda: _identity(["b", "n"]),
    "rank3": lambda: _identity(["batch", 3, "w"]),
    "scalar": lambda: _identity([]),
    "no-shape": lambda: _identity(None),
    "int64": lambda: _identity(["batch", 4], TP.INT64),
    "fp16": lambda: _identity(["batch", 4], TP.FLOAT16),
    "bf16": lambda: _identity(["batch", 4], TP.BFLOAT16),
    "string": lambda: _identity(["batch", 1], TP.STRING),
    "overridable": lambda: _with_initializer(8),
    "ir3-initializer": lambda: _with_initializer(3),
    "two-inputs": _two_inputs,
    "sequence": _sequence_input,
}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("onnx")
    out = {}
    for name, make in MODELS.items():
        out[name] = d / f"{name}.onnx"
        onnx.save(make(), out[name])
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_validator_reads_a_model_as_onnxruntime_reports_it(model_files, name):
    inputs, overridable, outputs = ort_view(model_files[name])
    io = onnx_io.read_model(model_files[name])

    def ours(tensors):
        return {t.name: (t.elem_type if t.kind == "tensor" else f"({t.kind})", t.dims) for t in tensors.values()}

    if name == "sequence":  # onnxruntime names the type; the validator knows it is no tensor
        assert io.inputs["S"].kind == "sequence_type" and inputs["S"][0] == "seq(tensor(float))"
        assert ours(io.outputs) == outputs
        return
    assert ours(io.inputs) == inputs
    assert ours(io.overridable) == overridable
    assert ours(io.outputs) == outputs


TYPES = ["TYPE_FP32", "TYPE_INT64", "TYPE_FP16", "TYPE_STRING", "TYPE_INT32", "TYPE_BF16"]
config_dims = st.lists(st.sampled_from([-1, 1, 2, 3, 4]), max_size=3)
tensor = st.fixed_dictionaries({"name": st.sampled_from(["INPUT0", "OUTPUT0", "A", "B", "W", "X"]),
                                "type": st.sampled_from(TYPES), "dims": config_dims,
                                "reshape": st.none() | config_dims})


def _config(mbs: int, inputs: list[dict], outputs: list[dict]) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name="m", backend="onnxruntime", max_batch_size=mbs)
    for kind, items in (("input", inputs), ("output", outputs)):
        seen = set()
        for t in items:
            if t["name"] in seen or not t["dims"]:
                continue
            seen.add(t["name"])
            x = getattr(cfg, kind).add(name=t["name"], data_type=mc.DataType.Value(t["type"]), dims=t["dims"])
            if t["reshape"] is not None:
                x.reshape.shape.extend(t["reshape"])
    return cfg


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(MODELS)), mbs=st.sampled_from([0, 0, 4]),
       inputs=st.lists(tensor, min_size=1, max_size=2), outputs=st.lists(tensor, min_size=1, max_size=2),
       fit=st.booleans())
def test_verdicts_are_the_backends_on_real_models(model_files, tmp_path_factory, name, mbs, inputs, outputs, fit):
    """The validator's onnx-signature verdict for a generated config, against ref_backend over
    onnxruntime's view of the real model. Half the configs are made from the model's own
    signature (``fit``) so that accepted configs occur as often as refused ones."""
    ins, over, outs = ort_view(model_files[name])
    if fit:  # the model's own names, types and dims (batch dimension dropped when batching)
        def own(tensors):
            out = []
            for n, (etype, shape) in tensors.items():
                if not isinstance(etype, int) or etype not in onnx_io.ONNX_TO_TRITON:
                    continue
                dims = list(shape[1:] if mbs else shape) or [1]
                out.append({"name": n, "type": onnx_io.ONNX_TO_TRITON[etype], "dims": dims,
                            "reshape": None})
            return out
        inputs, outputs = own(ins) or inputs, own(outs) or outputs
    cfg = _config(mbs, inputs, outputs)
    if not cfg.input or not cfg.output:
        return
    repo = tmp_path_factory.mktemp("repo")
    (repo / "m" / "1").mkdir(parents=True)
    shutil.copy(model_files[name], repo / "m" / "1" / "model.onnx")
    (repo / "m" / "config.pbtxt").write_text(text_format.MessageToString(cfg))
    problems = validate_repository(repo)
    signature = [p for p in problems if p.rule in ("onnx-signature", "onnx-model")]
    others = [p for p in problems if p not in signature]
    if others:  # refused for its configuration alone (e.g. a reshape of another size): not this test's
        event("refused for the configuration alone")
        return
    event("accepted" if not signature else "refused for the signature")
    assert (not signature) == ref_backend(cfg, ins, over, outs), (name, text_format.MessageToString(cfg),
                                                                   [str(p) for p in signature])


# ---- the mismatch classes an operator met, each refused ----------------------------------------

CONFIG = '''name: "m"
backend: "onnxruntime"
max_batch_size: {mbs}
input [ {{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ {dims} ] }} ]
'''

#: class -> (model, config fields, the words of the refusal)
MISMATCHES = {
    "wrong-dim": (lambda: _identity(["batch", 4]), dict(dims="5"), "the model's shape is [-1, 4], the config's is [-1, 5]"),
    "renamed-input": (lambda: _identity(["batch", 4], name_in="X"), dict(name="INPUT0"), "input 'INPUT0' is not in"),
    "wrong-type": (lambda: _identity(["batch", 4], TP.INT64), dict(), "is TYPE_INT64 in 1/model.onnx, not TYPE_FP32"),
    "fixed-batch": (lambda: _identity([1, 4]), dict(), "the model's first dimension must be -1"),
    "wildcard-vs-fixed": (lambda: _identity([2, 4]), dict(mbs=0, dims="-1, 4"), "the model's shape is [2, 4], the "
                                                                              "config's is [-1, 4]"),
    "scalar": (lambda: _identity([]), dict(mbs=0, dims="4"), "is a scalar"),
}


def mismatch_repository(root: Path) -> dict[str, str]:
    """A repository with one model per mismatch class, and a 2 GiB model.onnx of zeros (sparse:
    no disk used). Returns {model: the words its refusal must hold}."""
    expect = {}
    for cls, (make, fields, words) in MISMATCHES.items():
        values = {"mbs": 8, "name": "INPUT0", "dtype": "TYPE_FP32", "dims": "4", **fields}
        (root / cls / "1").mkdir(parents=True)
        onnx.save(make(), root / cls / "1" / "model.onnx")
        (root / cls / "config.pbtxt").write_text(CONFIG.format(**values).replace('"m"', f'"{cls}"'))
        expect[cls] = words
    (root / "zeros" / "1").mkdir(parents=True)
    with open(root / "zeros" / "1" / "model.onnx", "wb") as f:
        f.truncate(2 * 1024**3)
    (root / "zeros" / "config.pbtxt").write_text(
        CONFIG.format(mbs=8, name="INPUT0", dtype="TYPE_FP32", dims="4").replace('"m"', '"zeros"'))
    expect["zeros"] = "not an ONNX model"
    return expect


def test_the_fleets_release_has_no_bf16_io():
    assert onnx_io.TRITON_TO_ONNX == R2408_CONFIG_TYPES


def test_every_mismatch_class_is_refused(tmp_path):
    expect = mismatch_repository(tmp_path)
    problems = validate_repository(tmp_path)
    for model, words in expect.items():
        mine = [str(p) for p in problems if p.model == model]
        assert any(words in p for p in mine), (model, mine)


def test_reading_a_2_gib_file_of_zeros_reads_16_bytes(tmp_path, monkeypatch):
    path = tmp_path / "model.onnx"
    with open(path, "wb") as f:
        f.truncate(2 * 1024**3)
    monkeypatch.setattr(onnx, "load", lambda *a, **k: pytest.fail("the whole file was read"))
    with pytest.raises(onnx_io.OnnxReadError, match="starts with bytes no protobuf message starts with"):
        onnx_io.read_model(path)


def test_a_check_that_cannot_run_is_reported(tmp_path, monkeypatch):
    """Without the onnx package (a broken install) the signature is reported unchecked, never
    passed in silence."""
    import builtins

    expect = mismatch_repository(tmp_path)
    real = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name == "onnx" or name.startswith("onnx."):
            raise ImportError("No module named 'onnx'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnx)
    problems = validate_repository(tmp_path)
    unchecked = {p.model for p in problems if p.rule == "unchecked"}
    assert unchecked >= set(expect) - {"zeros"}
    assert all("pip install" in p.message for p in problems if p.rule == "unchecked")
