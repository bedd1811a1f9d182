"""The validator against the real tritonserver on generated repositories.

Variants of the corpus' valid repositories (tests/corpus/good) are generated with hypothesis:
fields mutated (batch sizes, dims, instance counts, version policy, an ensemble's step), files
and directories dropped, settings added that name files (label_filename, warmup
input_data_file, default_model_filename, cc_model_filenames, EXECUTION_ENV_PATH) with the file
there, missing, or too short. Each variant goes through the validator; each one the validator
accepts is then loaded by the tritonserver 2.51 of the nvidia-pytriton wheel (strict model
config, exit on error, no GPU), all of an example's at once; they stop in the background while
the next example runs. The test fails on any repository Triton
refuses that the validator accepts: a repository the validator refuses cannot be one, so it
needs no server. (Where the validator is stricter on purpose: tests/unit/model_repo/test_validate.py.)
Disagreements found this way are kept as corpus cases (tests/corpus/manifest.json:
bad/python-filename-not-py, bad/warmup-dims).
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import triton_to_np_dtype

from tritonfleet.model_repo.validate import list_models, validate_repository
from tritonfleet_testbed.localtriton import LocalTriton
from tritonfleet_testbed.standin_images import backend_model_py

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
BASES = ["good/ensemble", "good/referenced-files", "good/default-filename", "good/versions", "good/python"]
BATCH = 6  # variants per generated example, loaded by as many servers at once

idx = st.integers(0, 7)
mutation = st.one_of(
    st.tuples(st.just("drop-file"), idx),
    st.tuples(st.just("drop-dir"), idx),
    st.tuples(st.just("label"), idx, st.sampled_from(["labels.txt", "1/labels.txt", "other.txt"]), st.booleans()),
    st.tuples(st.just("warmup"), idx, st.sampled_from([None, -4, -1, 0, 4])),
    st.tuples(st.just("default-filename"), idx, st.sampled_from(["model.py", "net.py", "model.onnx"]), st.booleans()),
    st.tuples(st.just("cc"), idx, st.sampled_from(["model.py", "model_t4.py"])),
    st.tuples(st.just("env"), idx),
    st.tuples(st.just("field"), idx, st.sampled_from([
        ("max_batch_size", 0), ("max_batch_size", 2), ("max_batch_size", 16),
        ("input_dims", [2, 2]), ("input_dims", [-1]), ("input_dims", [5]),
        ("output_dims", [4]), ("output_dims", [0]),
        ("count", 0), ("count", 2), ("preferred", [4]), ("preferred", [16]),
        ("policy", [1]), ("policy", [2]), ("policy", [3]), ("latest", 2),
    ])),
    st.tuples(st.just("step"), st.sampled_from(["identity", "nosuch", "pipeline"]), st.sampled_from([-1, 1, 2])),
)
variant = st.tuples(st.sampled_from(BASES), st.lists(mutation, min_size=1, max_size=3))


def _models(repo: Path) -> list[Path]:
    return sorted(d for d in repo.iterdir() if (d / "config.pbtxt").is_file())


def _edit(model: Path, change) -> None:
    cfg = mc.ModelConfig()
    text_format.Parse((model / "config.pbtxt").read_text(), cfg)
    change(cfg)
    (model / "config.pbtxt").write_text(text_format.MessageToString(cfg))


def apply(repo: Path, m: tuple) -> None:
    """One mutation of the repository ``repo`` (see ``mutation``)."""
    kind = m[0]
    models = _models(repo)
    if kind == "drop-file":
        files = sorted(p for p in repo.rglob("*") if p.is_file())
        if files:
            files[m[1] % len(files)].unlink()
        return
    if kind == "drop-dir":
        dirs = sorted(p for p in repo.rglob("*") if p.is_dir())
        if dirs:
            shutil.rmtree(dirs[m[1] % len(dirs)])
        return
    if kind == "step":
        for model in models:
            def step(cfg, name=m[1], version=m[2]):
                for s in cfg.ensemble_scheduling.step:
                    s.model_name, s.model_version = name, version
            _edit(model, step)
        return
    if not models:
        return
    model = models[m[1] % len(models)]
    if kind == "label":
        _, _, name, create = m

        def label(cfg):
            if cfg.output:
                cfg.output[0].label_filename = name
        _edit(model, label)
        if create:
            (model / name).parent.mkdir(parents=True, exist_ok=True)
            (model / name).write_text("a\nb\nc\nd\n")
    elif kind == "warmup":
        delta = m[2]
        cfg = mc.ModelConfig()
        text_format.Parse((model / "config.pbtxt").read_text(), cfg)
        if not cfg.input:
            return
        inp = cfg.input[0]
        dims = [d if d > 0 else 1 for d in inp.dims]

        def warmup(cfg):
            w = cfg.model_warmup.add(name="generated", batch_size=1)
            value = w.inputs[inp.name]
            value.data_type, value.input_data_file = inp.data_type, "in0.bin"
            value.dims.extend(dims)
        _edit(model, warmup)
        if delta is not None:
            need = np.dtype(triton_to_np_dtype(mc.DataType.Name(inp.data_type)[5:])).itemsize
            for d in dims:
                need *= d
            (model / "warmup").mkdir(exist_ok=True)
            (model / "warmup/in0.bin").write_bytes(b"\0" * max(0, need + delta))
    elif kind == "default-filename":
        _, _, name, rename = m
        _edit(model, lambda cfg: setattr(cfg, "default_model_filename", name))
        if rename:
            for vdir in model.iterdir():
                for f in vdir.glob("*.py") if vdir.is_dir() else []:
                    f.rename(vdir / name)
    elif kind == "cc":
        _edit(model, lambda cfg: cfg.cc_model_filenames.__setitem__("7.5", m[2]))
    elif kind == "env":
        _edit(model, lambda cfg: cfg.parameters["EXECUTION_ENV_PATH"].__setattr__(
            "string_value", "$$TRITON_MODEL_DIRECTORY/env.tar.gz"))
    elif kind == "field":
        field, value = m[2]

        def change(cfg):
            if field == "max_batch_size":
                cfg.max_batch_size = value
            elif field in ("input_dims", "output_dims"):
                tensors = cfg.input if field == "input_dims" else cfg.output
                if tensors:
                    del tensors[0].dims[:]
                    tensors[0].dims.extend(value)
            elif field == "count":
                for g in cfg.instance_group:
                    g.count = value
            elif field == "preferred" and cfg.HasField("dynamic_batching"):
                del cfg.dynamic_batching.preferred_batch_size[:]
                cfg.dynamic_batching.preferred_batch_size.extend(value)
            elif field == "policy":
                cfg.version_policy.specific.versions[:] = value
            elif field == "latest":
                cfg.version_policy.latest.num_versions = value
        _edit(model, change)


class Stopper:
    """Servers stop in the background (a stop is ~3 s of waiting for Triton to exit) while the
    next example runs; their repositories are removed once every server has stopped."""

    def __init__(self, pool: ThreadPoolExecutor):
        self.pool, self.stops, self.dirs = pool, [], []

    def stop(self, triton: LocalTriton) -> None:
        self.stops.append(self.pool.submit(triton.stop))

    def remove_later(self, path: Path) -> None:
        self.dirs.append(path)


@pytest.fixture(scope="module")
def stopper():
    with ThreadPoolExecutor(BATCH) as pool:
        s = Stopper(pool)
        try:
            yield s
        finally:
            for f in s.stops:
                f.result()
            for d in s.dirs:
                shutil.rmtree(d, ignore_errors=True)


def triton_accepts(repo: Path, stopper: Stopper) -> tuple[bool, str]:
    triton = LocalTriton(repo, strict_model_config=True, exit_on_error=True,
                         python_based_backends={"onnxruntime": backend_model_py()},
                         ready_timeout=60, require_ready=False)
    try:
        triton.start()
        return triton.ready and all(triton.model_ready(m) for m in list_models(repo)), triton.log
    finally:
        stopper.stop(triton)


def build(work: Path, i: int, v) -> Path:
    base, mutations = v
    repo = work / f"v{i}"
    shutil.copytree(CORPUS / base, repo, symlinks=True)
    for m in mutations:
        apply(repo, m)
    return repo


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(variant, min_size=BATCH, max_size=BATCH))
def test_no_generated_repository_triton_refuses_passes_the_validator(stopper, variants):
    tmp = Path(tempfile.mkdtemp(prefix="tritonfleet-diff-"))
    stopper.remove_later(tmp)  # after its servers have stopped
    repos = [build(tmp, i, v) for i, v in enumerate(variants)]
    accepted = [r for r in repos if not validate_repository(r, gpus=0)]
    # a repository the validator refuses cannot be a false accept: only the others need a server
    with ThreadPoolExecutor(BATCH) as pool:  # all at once
        verdicts = dict(zip(accepted, pool.map(lambda r: triton_accepts(r, stopper), accepted), strict=True))
    false_accepts = {
        f"{variants[repos.index(r)]}": "\n".join(line for line in log.splitlines() if "E1" in line)[-1500:]
        for r, (ok, log) in verdicts.items() if not ok
    }
    assert not false_accepts, false_accepts
