#!/usr/bin/env python3
"""Generate the small stand-in ONNX models of files/model_repository.

    python files/make_models.py [MODEL_REPOSITORY]     (default: files/model_repository)

Both models have the names, types and shapes of the runbook's config.pbtxt files, a dynamic
batch dimension, and fixed weights drawn from a seeded generator: running this script again
writes byte-identical files (tests/test_models.py checks that). They are real ONNX graphs that
any ONNX Runtime executes, small enough to live in git (about 16 KiB and 66 KiB).

  resnet50_onnx/1/model.onnx
      input  "input"  FP32 [batch, 3, 224, 224]
      GlobalAveragePool -> Flatten -> MatMul(3 x 1000) -> Add(1000)
      output "output" FP32 [batch, 1000]

  text_classifier_onnx/1/model.onnx
      input  "input_ids"      INT64 [batch, 128]
      input  "attention_mask" INT64 [batch, 128]
      Mod(ids, 1024) -> Gather(embedding 1024 x 16) -> mean over the masked tokens
      -> MatMul(16 x 2) -> Add(2) -> Softmax
      output "probabilities"  FP32 [batch, 2]

The real exported ResNet-50 / RoBERTa models drop in over these files: see files/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240801
# ONNX Runtime 1.18 (Triton 24.08's onnxruntime backend) reads IR <= 9 and opset <= 20.
OPSET = 17
IR_VERSION = 8
PRODUCER = "tritonfleet make_models.py"

VOCAB_BUCKETS = 1024
EMBED_DIM = 16
SEQ_LEN = 128


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        producer_version="1",
    )
    model.ir_version = IR_VERSION
    model.model_version = 1
    onnx.checker.check_model(model, full_check=True)
    return model


def resnet50_stand_in(rng: np.random.Generator) -> onnx.ModelProto:
    weight = (rng.standard_normal((3, 1000)) * 0.5).astype(np.float32)
    bias = (rng.standard_normal(1000) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("GlobalAveragePool", ["input"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["features"], name="flatten", axis=1),
        helper.make_node("MatMul", ["features", "fc_weight"], ["logits_nobias"], name="fc"),
        helper.make_node("Add", ["logits_nobias", "fc_bias"], ["output"], name="fc_bias_add"),
    ]
    graph = helper.make_graph(
        nodes,
        "resnet50_stand_in",
        inputs=[helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        outputs=[helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1000])],
        initializer=[
            numpy_helper.from_array(weight, "fc_weight"),
            numpy_helper.from_array(bias, "fc_bias"),
        ],
    )
    return _model(graph)


def text_classifier_stand_in(rng: np.random.Generator) -> onnx.ModelProto:
    embedding = (rng.standard_normal((VOCAB_BUCKETS, EMBED_DIM)) * 0.5).astype(np.float32)
    weight = rng.standard_normal((EMBED_DIM, 2)).astype(np.float32)
    bias = (rng.standard_normal(2) * 0.1).astype(np.float32)
    const = numpy_helper.from_array
    nodes = [
        # token ids of any vocabulary hash into VOCAB_BUCKETS embedding rows
        helper.make_node("Mod", ["input_ids", "vocab_buckets"], ["bucket"], name="hash", fmod=0),
        helper.make_node("Gather", ["embedding", "bucket"], ["tokens"], name="embed", axis=0),
        # masked mean over the sequence
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], name="mask_cast", to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axis_last"], ["mask_3d"], name="mask_unsqueeze"),
        helper.make_node("Mul", ["tokens", "mask_3d"], ["masked"], name="mask_apply"),
        helper.make_node("ReduceSum", ["masked", "axis_seq"], ["summed"], name="sum", keepdims=0),
        helper.make_node("ReduceSum", ["mask_f", "axis_seq"], ["count"], name="count", keepdims=1),
        helper.make_node("Max", ["count", "one"], ["count_safe"], name="count_min1"),
        helper.make_node("Div", ["summed", "count_safe"], ["pooled"], name="mean"),
        helper.make_node("MatMul", ["pooled", "cls_weight"], ["logits_nobias"], name="classifier"),
        helper.make_node("Add", ["logits_nobias", "cls_bias"], ["logits"], name="classifier_bias"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "text_classifier_stand_in",
        inputs=[
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", SEQ_LEN]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", SEQ_LEN]),
        ],
        outputs=[helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 2])],
        initializer=[
            const(np.array(VOCAB_BUCKETS, dtype=np.int64), "vocab_buckets"),
            const(embedding, "embedding"),
            const(np.array([-1], dtype=np.int64), "axis_last"),
            const(np.array([1], dtype=np.int64), "axis_seq"),
            const(np.array(1.0, dtype=np.float32), "one"),
            const(weight, "cls_weight"),
            const(bias, "cls_bias"),
        ],
    )
    return _model(graph)


def write_models(repository: Path) -> list[Path]:
    """Write both model.onnx files under ``repository``; return their paths."""
    rng = np.random.default_rng(SEED)
    written = []
    for name, build in (
        ("resnet50_onnx", resnet50_stand_in),
        ("text_classifier_onnx", text_classifier_stand_in),
    ):
        path = repository / name / "1" / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(build(rng).SerializeToString(deterministic=True))
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    repository = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent / "model_repository"
    for path in write_models(repository):
        print(f"{path}  {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
