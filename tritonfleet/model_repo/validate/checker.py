"""One repository's check: each model's configuration loaded and checked (the rules:
config_rules, files, ensemble), the problems collected."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from google.protobuf import text_format

from .config_rules import ConfigRules
from .ensemble import EnsembleRules
from .files import FileRules
from .lines import Lines, newer_fields, parse_config
from .model_dirs import ModelEntry, autocomplete
from .tables import ENSEMBLE, PLATFORM_BACKEND, RULES, TYPED_BACKENDS, Problem


class Checker(ConfigRules, FileRules, EnsembleRules):
    """Checks the models of one repository (or one configuration): ``load`` parses a
    config.pbtxt, ``check`` applies every rule of one model, ``problems`` collects what they
    found."""

    def __init__(self, repo: Path | None, gpus: int | None, backends: frozenset[str], onnx_signatures: bool):
        self.repo = repo
        self.gpus = gpus
        self.backends = backends
        self.onnx_signatures = onnx_signatures
        self.problems: list[Problem] = []
        self.entries: dict[str, ModelEntry] = {}

    def add(self, model: str, file: str, line: int | None, rule: str, message: str) -> None:
        if rule not in RULES:  # every rule is listed (and documented) in RULES
            raise ValueError(f"unknown validator rule {rule!r}")
        self.problems.append(Problem(model, file, line, rule, message))

    # -- parsing -------------------------------------------------------------------------------
    def load(self, name: str, model_dir: Path | None, text: str | bytes | None) -> ModelEntry:
        entry = ModelEntry(name, model_dir)
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
            self.add(name, "config.pbtxt", e.GetLine() or None, "parse", (m.group(3) if m else msg).strip())
            return entry
        entry.cfg, entry.lines = cfg, Lines(text)
        return entry

    # -- one model -----------------------------------------------------------------------------
    def check(self, entry: ModelEntry) -> None:
        cfg, lines, model = entry.cfg, entry.lines, entry.name
        if cfg is None or lines is None:  # the caller checks only a model whose config parsed
            raise ValueError(f"{model}: check() needs a parsed config")
        cf = "config.pbtxt"

        def p(rule, message, *path):
            self.add(model, cf, lines.line(*path) if path else None, rule, message)

        for field, line in newer_fields(cfg, lines):
            self.add(
                model,
                cf,
                line,
                "newer-field",
                f"'{field}' is newer than the fleet's Triton, which refuses the whole file "
                '("has no field named"): remove it',
            )
        if cfg.name and cfg.name != model:
            p("name", f'name "{cfg.name}" must equal the directory name "{model}" (or leave name out)', "name")

        platform, backend, err = autocomplete(cfg, entry.dir, model)
        entry.platform, entry.backend = platform, backend
        if err:
            p("platform", err)
        elif platform == ENSEMBLE:
            if backend:
                p("platform-backend", f'an ensemble has no backend (found backend "{backend}"): remove it', "backend")
        elif not backend:
            p(
                "platform",
                f'unknown platform "{platform}" (known: {", ".join([*PLATFORM_BACKEND, ENSEMBLE])}); or name a backend',
                "platform",
            )
        elif backend in TYPED_BACKENDS and PLATFORM_BACKEND.get(platform) != backend:
            want = [k for k, v in PLATFORM_BACKEND.items() if v == backend]
            p(
                "platform-backend",
                f'platform "{platform}" does not go with backend "{backend}" '
                f"(use platform {' or '.join(want)}, or drop platform)",
                "platform",
            )
        elif backend not in self.backends:
            p(
                "backend",
                f'backend "{backend}" is not in the Triton image (it has {", ".join(sorted(self.backends))})',
                "backend",
            )

        if cfg.max_batch_size < 0:
            p(
                "max-batch-size",
                f"max_batch_size {cfg.max_batch_size} must be >= 0 (0: the model does not batch)",
                "max_batch_size",
            )
        self._batching(cfg, p)
        is_ensemble = platform == ENSEMBLE
        if cfg.HasField("ensemble_scheduling") and not is_ensemble:
            p("ensemble", 'ensemble_scheduling is only for platform "ensemble"', "ensemble_scheduling")
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
            p(
                "response-cache",
                "the response cache does not work with a decoupled model: disable response_cache",
                "response_cache",
            )
        self._warmup(cfg, p)
        if entry.dir is not None:
            self._files(entry, p)
