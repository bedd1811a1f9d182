"""The rules of an ensemble (ensemble_utils): each step names a model of the repository at a
version it loads, tensors mapped between steps of consistent type and shape, data reaching
every output, and no ensemble that depends on itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...core.triton_schema import mc
from .model_dirs import ModelEntry
from .tables import ENSEMBLE


class EnsembleRules:
    """The ensemble rules of :class:`tritonfleet.model_repo.validate.checker.Checker`."""

    # what the checker (tritonfleet.model_repo.validate.checker.Checker) provides
    repo: Path | None
    gpus: int | None
    backends: frozenset[str]
    onnx_signatures: bool
    entries: dict[str, ModelEntry]
    add: Callable[[str, str, int | None, str, str], None]

    # -- ensembles -----------------------------------------------------------------------------
    def check_ensemble(self, entry: ModelEntry) -> None:
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
            tensors[t.name] = (t.data_type, list(t.reshape.shape if t.HasField("reshape") else t.dims), mbs > 0, model)
        for t in cfg.output:
            tensors.setdefault(
                t.name, (t.data_type, list(t.reshape.shape if t.HasField("reshape") else t.dims), mbs > 0, model)
            )
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
                    p(
                        "ensemble-tensor",
                        f"{label} writes '{t}', which step {producers[t] + 1} writes already",
                        *at,
                        "output_map",
                    )
                producers.setdefault(t, i)
            edges.append((set(step.input_map.values()), set(step.output_map.values())))
            written |= set(step.output_map.values())
            target = self.entries.get(step.model_name)
            if target is None:
                p(
                    "ensemble-step",
                    f"{label}: there is no model '{step.model_name}' in the repository",
                    *at,
                    "model_name",
                )
                continue
            tcfg = target.cfg
            if tcfg is None:
                continue  # its own problems are reported for it
            if step.model_version != -1 and step.model_version not in target.loaded_versions:
                unset = " (0 is what an unset model_version means)" if step.model_version == 0 else ""
                p(
                    "ensemble-step",
                    f"{label}: version {step.model_version} of '{step.model_name}' is "
                    f"not loaded{unset}: use model_version: -1 for its latest",
                    *at,
                    "model_version",
                )
            if tcfg.max_batch_size and tcfg.max_batch_size < mbs:
                p(
                    "ensemble-step",
                    f"the ensemble's max_batch_size {mbs} exceeds {step.model_name}'s {tcfg.max_batch_size}",
                    "max_batch_size",
                )
            t_batch = tcfg.max_batch_size > 0
            t_inputs = {t.name: t for t in tcfg.input}
            t_outputs = {t.name: t for t in tcfg.output}
            for key, value in step.input_map.items():
                if key not in t_inputs:
                    p(
                        "ensemble-tensor",
                        f"{label}: '{step.model_name}' has no input '{key}' (its "
                        f"inputs: {', '.join(t_inputs) or 'none'})",
                        *at,
                        "input_map",
                    )
                    continue
                self._consistent(tensors, value, t_inputs[key], t_batch, step.model_name, label, p, at)
            for name, t in t_inputs.items():
                if name not in step.input_map and not t.optional:
                    p(
                        "ensemble-tensor",
                        f"{label}: input '{name}' of '{step.model_name}' is not mapped",
                        *at,
                        "input_map",
                    )
            for key, value in step.output_map.items():
                if key not in t_outputs:
                    p(
                        "ensemble-tensor",
                        f"{label}: '{step.model_name}' has no output '{key}' (its "
                        f"outputs: {', '.join(t_outputs) or 'none'})",
                        *at,
                        "output_map",
                    )
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
                p(
                    "ensemble-tensor",
                    f"ensemble output '{t.name}' is never computed: a step before it reads a tensor no one writes",
                    "output",
                    i,
                )
        outputs = {t.name for t in cfg.output}
        for name in sorted((read | written) - outputs - {t.name for t in cfg.input}):
            if name not in written:
                p(
                    "ensemble-tensor",
                    f"'{name}' is read by a step but written by none (not an ensemble input either)",
                    "ensemble_scheduling",
                )
            elif name not in read:
                p(
                    "ensemble-tensor",
                    f"'{name}' is written by a step but read by none (not an ensemble output either)",
                    "ensemble_scheduling",
                )

    @staticmethod
    def _consistent(tensors, name, t, batching, who, label, p, at) -> None:
        dims = list(t.dims)
        if name not in tensors:
            tensors[name] = (t.data_type, dims, batching, who)
            return
        dtype, odims, obatch, owho = tensors[name]
        if dtype != t.data_type:
            p(
                "ensemble-tensor",
                f"{label}: '{name}' is {mc.DataType.Name(dtype)} in {owho} but "
                f"{mc.DataType.Name(t.data_type)} in {who}",
                *at,
            )
            return

        def same(a, b):
            return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))

        full_a = ([-1] if obatch else []) + odims
        full_b = ([-1] if batching else []) + dims
        if not same(odims, dims) and not same(full_a, full_b):
            p("ensemble-tensor", f"{label}: '{name}' has shape {full_a} in {owho} but {full_b} in {who}", *at)

    def check_cycles(self) -> None:
        graph = {
            n: [s.model_name for s in e.cfg.ensemble_scheduling.step]
            for n, e in self.entries.items()
            if e.cfg is not None and e.platform == ENSEMBLE
        }
        state: dict[str, int] = {}

        def visit(n, trail):
            state[n] = 1
            for m in graph.get(n, []):
                if state.get(m) == 1:
                    cycle = trail[trail.index(m) :] + [m] if m in trail else [n, m]
                    e = self.entries[n]
                    self.add(
                        n,
                        "config.pbtxt",
                        e.lines.line("ensemble_scheduling"),
                        "ensemble-cycle",
                        f"ensembles depend on each other in a circle: {' -> '.join(cycle)}",
                    )
                elif m in graph and state.get(m) is None:
                    visit(m, trail + [m])
            state[n] = 2

        for n in sorted(graph):
            if state.get(n) is None:
                visit(n, [n])
