"""A Python-based Triton backend named ``onnxruntime``: ONNX models served by ONNX Runtime.

Triton maps ``platform: "onnxruntime_onnx"`` to the backend ``onnxruntime``. The testbed's
stand-in Triton image has no C++ onnxruntime backend; it installs this file as
``/opt/tritonserver/backends/onnxruntime/model.py``, and Triton then runs it through the
Python backend (``backends/python/libtriton_python.so``) for every model of that backend. So
the runbook's model repository is served unmodified: same config.pbtxt, same
``<model>/<version>/model.onnx``.

What it does, like the real backend as far as the testbed needs:
  * loads ``<model dir>/<version>/<default_model_filename or model.onnx>`` with ONNX Runtime
    (CUDA execution provider for KIND_GPU instances when that provider exists, else CPU);
  * checks the configured inputs and outputs against the model (names and data types) at load;
  * serves every batch Triton's dynamic batcher hands to ``execute()`` with ONE session run:
    the requests' inputs are concatenated along the batch dimension and the outputs split back;
  * reads the model config parameters ``intra_op_thread_count`` / ``inter_op_thread_count``;
  * a batch whose session run fails is answered with the error and counted by Triton as failed
    requests (``nv_inference_request_failure``), as the real backend's failed runs are.

A test switch, not a feature of the real backend: while the file ``<fault dir>/<model name>``
exists (``$TRITONFLEET_TESTBED_FAULT_DIR``, default ``/tmp/tritonfleet-testbed-faults``: inside
the container, its own /tmp), every request of that model fails while the model stays READY, the
"ready but broken" host of the GPU health tests (``docker exec <container> touch ...``); the
failure is raised from ``execute()`` (counted by Triton as failed requests), never returned as
error responses, which crashed the Python backend under contention (docs/testbed.md).
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from onnxruntime.capi import onnxruntime_pybind11_state as _ort_state

#: what onnxruntime raises from a run (its C++ errors, each its own Exception subclass: Fail,
#: InvalidArgument, RuntimeException, ...), with numpy's ValueError and TypeError for inputs it
#: cannot take: reported to the client as the request's error. Anything else is a bug here.
RUN_ERRORS = (*(v for v in vars(_ort_state).values() if isinstance(v, type) and issubclass(v, Exception)),
              ValueError, TypeError)

# ONNX Runtime's type strings -> numpy
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.object_,
}


FAULT_DIR = os.environ.get("TRITONFLEET_TESTBED_FAULT_DIR", "/tmp/tritonfleet-testbed-faults")


def _parameter(config: dict, key: str, default: str | None = None) -> str | None:
    value = config.get("parameters", {}).get(key)
    if isinstance(value, dict):
        return value.get("string_value", default)
    return default


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.max_batch_size = int(self.config.get("max_batch_size", 0))
        filename = self.config.get("default_model_filename") or "model.onnx"
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        if os.path.isdir(path):
            path = os.path.join(path, "model.onnx")
        if not os.path.isfile(path):
            raise pb_utils.TritonModelException(f"model file {path} not found")

        options = ort.SessionOptions()
        for key, attr in (
            ("intra_op_thread_count", "intra_op_num_threads"),
            ("inter_op_thread_count", "inter_op_num_threads"),
        ):
            value = _parameter(self.config, key)
            if value:
                setattr(options, attr, int(value))

        providers: list = ["CPUExecutionProvider"]
        kind = args.get("model_instance_kind", "CPU")
        if kind == "GPU":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                device = int(args.get("model_instance_device_id", "0"))
                providers = [
                    ("CUDAExecutionProvider", {"device_id": device}),
                    "CPUExecutionProvider",
                ]
            else:
                pb_utils.Logger.log_warn(
                    f"{self.name}: KIND_GPU instance, but this ONNX Runtime has no CUDA "
                    "execution provider; running on CPU"
                )
        self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        self._check_io(path)
        self.output_dtypes = {
            o["name"]: pb_utils.triton_string_to_numpy(o["data_type"])
            for o in self.config.get("output", [])
        }
        pb_utils.Logger.log_info(
            f"{self.name}: loaded {path} with {self.session.get_providers()[0]}, "
            f"max_batch_size {self.max_batch_size}"
        )

    def _check_io(self, path: str) -> None:
        model_inputs = {i.name: i for i in self.session.get_inputs()}
        model_outputs = {o.name: o for o in self.session.get_outputs()}
        for section, provided in (("input", model_inputs), ("output", model_outputs)):
            for entry in self.config.get(section, []):
                name = entry["name"]
                if name not in provided:
                    raise pb_utils.TritonModelException(
                        f"unable to load model '{self.name}', configuration expects {section} "
                        f"'{name}', model {path} provides {sorted(provided)}"
                    )
                want = pb_utils.triton_string_to_numpy(entry["data_type"])
                have = _ORT_TYPES.get(provided[name].type)
                if have is not None and np.dtype(have) != np.dtype(want):
                    raise pb_utils.TritonModelException(
                        f"unable to load model '{self.name}', configuration expects datatype "
                        f"{entry['data_type']} for {section} '{name}', model provides "
                        f"{provided[name].type}"
                    )
        for name, info in model_inputs.items():
            if name not in {i["name"] for i in self.config.get("input", [])}:
                raise pb_utils.TritonModelException(
                    f"unable to load model '{self.name}', model input '{name}' "
                    f"({info.type} {info.shape}) is not in the configuration"
                )
        self.input_names = [i["name"] for i in self.config.get("input", [])]

    def execute(self, requests):
        switch = os.path.join(FAULT_DIR, self.name)
        if os.path.exists(switch):  # the test switch (see the module's docstring)
            # raised, not returned as error responses: a batch of error responses returned from
            # execute() crashed the Python backend's library (signal 11 in
            # TRITONBACKEND_ModelInstanceExecute) within a second under CPU contention
            # (tests/integration/testbed_tooling/test_backend_switch.py); a raised exception is how a
            # failed run is reported, and Triton counts the requests as failed
            raise pb_utils.TritonModelException(f"testbed fault: inference of {self.name} switched to fail ({switch})")
        responses: list = [None] * len(requests)
        # requests whose inputs have the same per-item shapes run as one batch
        groups: dict = {}
        for index, request in enumerate(requests):
            try:
                arrays = {}
                for name in self.input_names:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is None:
                        raise pb_utils.TritonModelException(f"input '{name}' missing")
                    arrays[name] = tensor.as_numpy()
                wanted = list(request.requested_output_names()) or list(self.output_dtypes)
            # a missing input (TritonModelException: the stub adds it to pb_utils once loaded, not
            # at import), a tensor numpy cannot take: reported to the client
            except (pb_utils.TritonModelException, ValueError, TypeError) as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
                continue
            if self.max_batch_size > 0:
                key = tuple((n, a.shape[1:], a.dtype.str) for n, a in arrays.items())
            else:
                key = ("request", index)
            groups.setdefault(key, []).append((index, arrays, wanted))

        failed = []
        for members in groups.values():
            try:
                self._run(members, responses)
            except RUN_ERRORS as exc:  # reported to the client
                failed.append(f"onnxruntime: {exc}")
                for index, _, _ in members:
                    responses[index] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"onnxruntime: {exc}")
                    )
        whole = len(groups) == 1 and len(next(iter(groups.values()))) == len(requests)
        if failed and whole:
            # The whole execution failed in ONNX Runtime: raise, as the real backend's failed run
            # is reported. Triton then answers every request with the error AND counts them in
            # nv_inference_request_failure (the real onnxruntime backend reports a request whose
            # response failed as not successful: triton-inference-server/onnxruntime_backend#91);
            # error responses returned from execute() would be counted as successes by the Python
            # backend (triton-inference-server/server#7713).
            raise pb_utils.TritonModelException(failed[0])
        return responses

    def _run(self, members, responses) -> None:
        names = sorted({n for _, _, wanted in members for n in wanted})
        if len(members) == 1:
            feed = members[0][1]
        else:
            feed = {n: np.concatenate([m[1][n] for m in members], axis=0) for n in self.input_names}
        results = dict(zip(names, self.session.run(names, feed), strict=True))
        offset = 0
        for index, arrays, wanted in members:
            size = arrays[self.input_names[0]].shape[0] if self.max_batch_size > 0 else None
            outputs = []
            for name in wanted:
                value = results[name]
                if size is not None:
                    value = value[offset : offset + size]
                outputs.append(
                    pb_utils.Tensor(name, np.ascontiguousarray(value, self.output_dtypes[name]))
                )
            if size is not None:
                offset += size
            responses[index] = pb_utils.InferenceResponse(output_tensors=outputs)

    def finalize(self):
        self.session = None
