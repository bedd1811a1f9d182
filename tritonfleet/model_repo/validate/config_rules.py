"""The rules of one model's configuration, as the server applies them (ValidateModelConfig,
ValidateIOShape, ValidateInstanceGroup): batching, sequence batching, inputs and outputs and
their reshapes, instance groups on the host's GPUs, warmup."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ...core.triton_schema import mc
from .model_dirs import ModelEntry
from .tables import ENSEMBLE


class ConfigRules:
    """The configuration rules of :class:`tritonfleet.model_repo.validate.checker.Checker`."""

    # what the checker (tritonfleet.model_repo.validate.checker.Checker) provides
    repo: Path | None
    gpus: int | None
    backends: frozenset[str]
    onnx_signatures: bool
    entries: dict[str, ModelEntry]
    add: Callable[[str, str, int | None, str, str], None]

    def _batching(self, cfg, p) -> None:
        mbs = cfg.max_batch_size
        if cfg.HasField("dynamic_batching"):
            db = cfg.dynamic_batching
            if mbs == 0:
                p(
                    "dynamic-batching",
                    "dynamic_batching needs max_batch_size > 0 (with 0 the model never batches)",
                    "dynamic_batching",
                )
            for size in db.preferred_batch_size:
                if size <= 0 or size > mbs:
                    p(
                        "preferred-batch-size",
                        f"preferred_batch_size {size} must be > 0 and <= max_batch_size {mbs}",
                        "dynamic_batching",
                        0,
                        "preferred_batch_size",
                    )
            levels = db.priority_levels
            if levels:
                if not 1 <= db.default_priority_level <= levels:
                    p(
                        "priority",
                        f"default_priority_level must be in [1, {levels}]",
                        "dynamic_batching",
                        0,
                        "default_priority_level",
                    )
                for level in db.priority_queue_policy:
                    if not 1 <= level <= levels:
                        p(
                            "priority",
                            f"priority_queue_policy level {level} must be in [1, {levels}]",
                            "dynamic_batching",
                            0,
                            "priority_queue_policy",
                        )
            if db.preserve_ordering:
                if levels > 1:
                    p(
                        "priority",
                        "preserve_ordering allows one priority level only",
                        "dynamic_batching",
                        0,
                        "preserve_ordering",
                    )
                policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
                if any(
                    q.default_timeout_microseconds and q.timeout_action == mc.ModelQueuePolicy.DELAY for q in policies
                ):
                    p(
                        "priority",
                        "preserve_ordering does not allow the DELAY timeout action",
                        "dynamic_batching",
                        0,
                        "preserve_ordering",
                    )
        if cfg.HasField("sequence_batching"):
            self._sequence(cfg, p)

    def _sequence(self, cfg, p) -> None:
        sb = cfg.sequence_batching
        where = ("sequence_batching", 0)
        if cfg.response_cache.enable:
            p(
                "response-cache",
                "the response cache does not work with sequence batching: disable response_cache",
                "response_cache",
            )
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
                lists = [n for n in ("int32_false_true", "fp32_false_true", "bool_false_true") if len(getattr(c, n))]
                if c.kind == K.CONTROL_SEQUENCE_CORRID:
                    if lists:
                        p("sequence-control", f"{kind} takes data_type, not {lists[0]}", *at)
                    if c.data_type not in (
                        mc.TYPE_UINT64,
                        mc.TYPE_INT64,
                        mc.TYPE_UINT32,
                        mc.TYPE_INT32,
                        mc.TYPE_STRING,
                    ):
                        p(
                            "sequence-control",
                            f"{kind} data_type must be TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING",
                            *at,
                        )
                elif not lists:
                    p(
                        "sequence-control",
                        f"{kind} needs one of int32_false_true, fp32_false_true, bool_false_true",
                        *at,
                    )
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
                    p(
                        "preferred-batch-size",
                        f"sequence oldest preferred_batch_size {size} must be "
                        f"> 0 and <= max_batch_size {cfg.max_batch_size}",
                        *where,
                        "oldest",
                        0,
                        "preferred_batch_size",
                    )
        if sb.HasField("direct"):
            u = sb.direct.minimum_slot_utilization
            if u < 0.0 or u > 1.0:
                p(
                    "sequence-batching",
                    f"minimum_slot_utilization {u:g} must be in (0, 1]",
                    *where,
                    "direct",
                    0,
                    "minimum_slot_utilization",
                )

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
                    p(f"{kind}-duplicate", f"{kind} '{t.name}' is declared twice: tensor names are unique", *at, "name")
                if t.name:
                    names.setdefault(t.name, kind)
                if t.data_type == mc.TYPE_INVALID:
                    p(f"{kind}-data-type", f"{label} needs data_type (e.g. TYPE_FP32)", *at)
                if not t.dims:
                    p(
                        f"{kind}-dims",
                        f"{label} needs dims (without the batch dimension, which max_batch_size implies)",
                        *at,
                    )
                for d in t.dims:
                    if d < 1 and d != -1:
                        p(
                            f"{kind}-dims",
                            f"{label} has dim {d}: each dim is >= 1, or -1 for a variable size",
                            *at,
                            "dims",
                        )
                        break
                if t.HasField("reshape"):
                    self._reshape(t, label, kind, mbs, p, at)
                if (
                    kind == "input"
                    and t.format in (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW)
                    and len(t.dims) != 3
                ):
                    p(
                        "input-format",
                        f"{label}: format {mc.ModelInput.Format.Name(t.format)} needs 3 dims",
                        *at,
                        "format",
                    )
                if t.is_shape_tensor and platform != "tensorrt_plan":
                    p(
                        f"{kind}-shape-tensor",
                        f"{label}: shape tensors are for TensorRT models only",
                        *at,
                        "is_shape_tensor",
                    )
                if t.is_non_linear_format_io:
                    if platform != "tensorrt_plan":
                        p(
                            f"{kind}-format",
                            f"{label}: non-linear IO format is for TensorRT models only",
                            *at,
                            "is_non_linear_format_io",
                        )
                    elif len(t.dims) != 3:
                        p(f"{kind}-format", f"{label}: non-linear IO format needs 3 dims", *at, "dims")
        if platform != ENSEMBLE and not cfg.output:
            p("output-missing", "no output: a model answers with its configured outputs only; add output [ ... ]")
        inputs = {t.name for t in cfg.input}
        outputs = {t.name for t in cfg.output}
        for i, b in enumerate(cfg.batch_input):
            at = ("batch_input", i)
            if len(b.source_input) != 1:
                p(
                    "batch-input",
                    f"batch_input {b.target_name or i}: expects 1 source_input, got {len(b.source_input)}",
                    *at,
                )
            if b.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
                p("batch-input", f"batch_input {b.target_name or i}: data_type must be TYPE_INT32 or TYPE_FP32", *at)
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
            p(f"{kind}-reshape", f"{label}: an empty reshape (a scalar) needs max_batch_size > 0", *at, "reshape")
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
            p(
                f"{kind}-reshape",
                f"{label}: reshape {shape} holds a different number of elements than dims {dims}",
                *at,
                "reshape",
            )

    def _instance_groups(self, cfg, p, platform) -> None:
        G = mc.ModelInstanceGroup
        for i, g in enumerate(cfg.instance_group):
            at = ("instance_group", i)
            label = f"instance group {g.name or i + 1}"
            kind = g.kind
            if g.count < 0:
                p("instance-count", f"{label}: count {g.count} must be >= 0 (Triton quietly runs 1)", *at, "count")
            if any(d < 0 for d in g.gpus):
                p("instance-gpus", f"{label}: gpu ids are >= 0", *at, "gpus")
            if kind == G.KIND_AUTO:
                # Triton resolves KIND_AUTO to KIND_GPU when GPUs exist (and all listed ones do)
                if self.gpus is not None and (self.gpus == 0 or any(d >= self.gpus for d in g.gpus)):
                    kind = G.KIND_CPU
                elif self.gpus is not None:
                    kind = G.KIND_GPU
            if kind in (G.KIND_CPU, G.KIND_MODEL) and g.gpus:
                p(
                    "instance-gpus",
                    f"{label}: {G.Kind.Name(kind)} lists gpus"
                    + (" (KIND_AUTO on a host without those GPUs)" if g.kind == G.KIND_AUTO else "")
                    + ": remove gpus, or use KIND_GPU",
                    *at,
                    "gpus",
                )
            if kind == G.KIND_GPU and self.gpus is not None:
                if self.gpus == 0:
                    p("instance-gpus", f"{label}: KIND_GPU, but the host has no GPU", *at, "kind")
                for d in g.gpus:
                    if d >= self.gpus:
                        p(
                            "instance-gpus",
                            f"{label}: gpu {d} does not exist on a host with {self.gpus} GPU(s)",
                            *at,
                            "gpus",
                        )
            if g.profile:
                if platform != "tensorrt_plan":
                    p("instance-profile", f"{label}: profile is for TensorRT models only", *at, "profile")
                for prof in g.profile:
                    if not re.fullmatch(r"\s*[+]?[0-9]+.*", prof):
                        p(
                            "instance-profile",
                            f"{label}: profile '{prof}' must be a non-negative integer",
                            *at,
                            "profile",
                        )

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
                    p(
                        "warmup",
                        f"warmup '{w.name}' input '{name}' dims {dims}: every dimension must be given (no -1)",
                        *at,
                    )
                elif t.data_type != wi.data_type:
                    p(
                        "warmup",
                        f"warmup '{w.name}' input '{name}' is {mc.DataType.Name(wi.data_type)}, "
                        f"the input is {mc.DataType.Name(t.data_type)}",
                        *at,
                    )
                elif len(dims) != len(t.dims) or any(c not in (-1, d) for c, d in zip(t.dims, dims, strict=True)):
                    p(
                        "warmup",
                        f"warmup '{w.name}' input '{name}' dims {dims} do not fit the input's dims {list(t.dims)}",
                        *at,
                    )
            for name, t in inputs.items():
                if name not in w.inputs and not t.optional:
                    p("warmup", f"warmup '{w.name}' does not feed input '{name}'", *at)
            if cfg.max_batch_size and w.batch_size > cfg.max_batch_size:
                p("warmup", f"warmup '{w.name}' batch_size {w.batch_size} > max_batch_size {cfg.max_batch_size}", *at)
