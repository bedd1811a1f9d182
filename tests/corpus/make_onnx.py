"""Write the corpus's model.onnx files (``python tests/corpus/make_onnx.py``).

Each is a one-node Identity graph, ``INPUT0 [batch, 4] float -> OUTPUT0``, or a variant that
does not match its config.pbtxt on purpose; manifest.json's "onnx" section names the variant of
every file.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import TensorProto, helper

CORPUS = Path(__file__).resolve().parent

VARIANTS = {
    "identity": {},
    "input-x": {"input_name": "X"},
    "int64": {"elem_type": TensorProto.INT64},
    "dims5": {"dims": ["batch", 5]},
}


def identity_model(input_name="INPUT0", output_name="OUTPUT0", elem_type=TensorProto.FLOAT,
                   dims=("batch", 4)) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", [input_name], [output_name])],
        "identity",
        [helper.make_tensor_value_info(input_name, elem_type, list(dims))],
        [helper.make_tensor_value_info(output_name, elem_type, list(dims))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="tritonfleet-corpus")
    model.ir_version = 8  # readable by older onnxruntime releases too
    onnx.checker.check_model(model)
    return model


def main() -> None:
    files = json.loads((CORPUS / "manifest.json").read_text())["onnx"]
    for rel, variant in sorted(files.items()):
        path = CORPUS / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(identity_model(**VARIANTS[variant]), path)
        print(f"{rel} ({variant})")


if __name__ == "__main__":
    main()
