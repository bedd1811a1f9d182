"""The rules of a model's files: version directories, the model file each backend loads,
files a configuration names, Python models that compile, and an ONNX model's signature against
its inputs and outputs."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

from ...core.triton_schema import mc
from .. import onnx_io
from .model_dirs import ModelEntry, list_version_dirs, versions_to_load
from .tables import (
    ENSEMBLE,
    MODEL_DIRECTORY_VAR,
    MODEL_FILE,
    PLATFORM_FILE,
    TYPE_BYTES,
)


class FileRules:
    """The file rules of :class:`tritonfleet.model_repo.validate.checker.Checker`."""

    # what the checker (tritonfleet.model_repo.validate.checker.Checker) provides
    repo: Path | None
    gpus: int | None
    backends: frozenset[str]
    onnx_signatures: bool
    entries: dict[str, ModelEntry]
    add: Callable[[str, str, int | None, str, str], None]

    # -- files on disk -------------------------------------------------------------------------
    def _files(self, entry: ModelEntry, p) -> None:
        cfg, model, model_dir = entry.cfg, entry.name, entry.dir
        versions, odd = list_version_dirs(model_dir)
        for name, why in odd:
            self.add(model, name, None, "version-dir", why)
        load, absent = versions_to_load(cfg, versions)
        for v in absent:
            p("version-policy", f"version_policy names version {v}, but there is no {v}/ directory", "version_policy")
        entry.loaded_versions = tuple(load)
        if not load:
            if not versions:
                self.add(
                    model,
                    "",
                    None,
                    "version-missing",
                    "no version directory: add 1/ with the model file in it"
                    + (
                        " (an ensemble needs an empty 1/ too; keep a placeholder file in it under git)"
                        if entry.platform == ENSEMBLE
                        else ""
                    ),
                )
            elif not absent:
                p("version-policy", "the version_policy selects no version", "version_policy")
        dmf = cfg.default_model_filename
        if dmf and (os.path.isabs(dmf) or ".." in Path(dmf).parts or "/" in dmf):
            p(
                "unsafe-path",
                f'default_model_filename "{dmf}" must be a plain file name in the version directory',
                "default_model_filename",
            )
            return
        self._referenced_files(entry, p, [versions[v] for v in load])
        if entry.platform == ENSEMBLE:
            return
        if dmf and entry.backend == "python" and not dmf.endswith(".py"):
            p(
                "model-file",
                f'default_model_filename "{dmf}": the python backend loads only a file whose name ends with .py',
                "default_model_filename",
            )
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
                    self.add(
                        model,
                        f"{versions[v]}/{name}",
                        None,
                        "model-file",
                        f"version {v} has no {name} (the {entry.backend or entry.platform} backend loads it)",
                    )
                    continue
                if kind == "file" and not path.is_file():
                    self.add(
                        model, f"{versions[v]}/{name}", None, "model-file", f"{name} must be a file, not a directory"
                    )
                    continue
                if kind == "dir" and not path.is_dir():
                    self.add(
                        model, f"{versions[v]}/{name}", None, "model-file", f"{name} must be a directory (a SavedModel)"
                    )
                    continue
            if entry.backend == "openvino" and wanted and wanted[0].endswith(".xml"):
                bin_path = vdir / (wanted[0][:-4] + ".bin")
                if not bin_path.exists():
                    self.add(
                        model,
                        f"{versions[v]}/{bin_path.name}",
                        None,
                        "model-file",
                        f"OpenVINO needs {bin_path.name} next to {wanted[0]}",
                    )
            if entry.backend == "python" and wanted and wanted[0].endswith(".py"):
                self._python_source(model, versions[v], vdir / wanted[0])
            if entry.backend == "onnxruntime" and self.onnx_signatures and wanted:
                onnx_path = vdir / wanted[0]
                if onnx_path.is_dir():
                    onnx_path = onnx_path / "model.onnx"
                self._onnx_signature(entry, f"{versions[v]}/{wanted[0]}", onnx_path, p)

    def _referenced_files(self, entry: ModelEntry, p, version_dirs: list[str]) -> None:
        """Files the configuration names by name: Triton opens each when it loads the model and
        refuses the model when one is missing (labels: Model::Init; warmup data: the instance's
        warmup; cc_model_filenames and EXECUTION_ENV_PATH: the backend)."""
        cfg, model, model_dir = entry.cfg, entry.name, entry.dir

        def inside(rel: str, what: str, *at) -> Path | None:
            path = Path(os.path.normpath(model_dir / rel))
            if os.path.isabs(rel) or (path != model_dir and model_dir not in path.parents):
                p("unsafe-path", f'{what} "{rel}" must name a file inside the model directory', *at)
                return None
            return path

        def missing(path: Path, rel: str, what: str, *at) -> bool:
            if path.is_file() or path.is_dir():
                return False
            self.add(
                model,
                rel,
                lines_of(*at),
                "referenced-file",
                f"{what} names {rel}, which is not in the model directory: add the file or remove the setting",
            )
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
                        self.add(
                            model,
                            rel,
                            lines_of(*at),
                            "referenced-file",
                            f"warmup '{w.name}' input '{name}' needs {need} bytes "
                            f"({type_name}, dims {list(inp.dims)}); {rel} has {have}",
                        )
        for cc, name in sorted(cfg.cc_model_filenames.items()):
            for vname in version_dirs if entry.platform != ENSEMBLE else ():
                rel = f"{vname}/{name}"
                path = inside(rel, f'cc_model_filenames["{cc}"]', "cc_model_filenames")
                if path is not None:
                    missing(
                        path,
                        rel,
                        f'cc_model_filenames["{cc}"] (the file for GPUs of compute capability {cc})',
                        "cc_model_filenames",
                    )
        env = cfg.parameters.get("EXECUTION_ENV_PATH")
        if env is not None and entry.backend == "python":
            value = env.string_value
            if value.startswith(MODEL_DIRECTORY_VAR):
                rel = value[len(MODEL_DIRECTORY_VAR) :].lstrip("/")
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
            self.add(
                model,
                f"{vname}/{path.name}",
                e.lineno,
                "python-syntax",
                f"the python backend cannot import it: {e.msg}",
            )
        except ValueError as e:
            self.add(model, f"{vname}/{path.name}", None, "python-syntax", str(e))

    def _onnx_signature(self, entry: ModelEntry, rel: str, path: Path, p) -> None:
        """Inputs and outputs against the ONNX model, as the onnxruntime backend checks them at
        load (tritonfleet.model_repo.onnx_io: CompareDimsSupported, ValidateInputs,
        ValidateOutputs, the sequence controls). Without the ``onnx`` package (a dependency of
        tritonfleet: a broken install) the check cannot run, and that is reported."""
        if not path.is_file():
            self.add(entry.name, rel, None, "model-file", f"{path.name} not found")
            return
        try:
            io = onnx_io.read_model(path)
        except ImportError as e:
            self.add(
                entry.name,
                rel,
                None,
                "unchecked",
                f"cannot compare the config with {path.name}: {e} (install tritonfleet with its "
                "dependencies: pip install tritonfleet, or pip install onnx)",
            )
            return
        except onnx_io.OnnxReadError as e:
            self.add(entry.name, rel, None, "onnx-model", str(e))
            return
        except OSError as e:
            self.add(entry.name, rel, None, "onnx-model", f"cannot read it: {e.strerror}")
            return
        for m in onnx_io.check(entry.cfg, io, rel):
            p("onnx-signature", m.message, *m.at)
