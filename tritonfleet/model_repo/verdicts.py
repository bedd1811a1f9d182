"""Model repositories already found valid, remembered by their content: a deploy's pre-flight
validates the operator's repository (and each host's rendered copy) on every run, but an
unchanged repository gets the same verdict, and the validator's imports and its reading of the
ONNX models cost about as much as the rest of a converged host's no-op (docs/scale.md).

What a run derives from a config.pbtxt by parsing it with Triton's schema is remembered the same
way (:func:`remembered_key`): a host's rendered config (render.apply_overrides), the TensorRT
engines each model declares per compute capability (:func:`plan_cc_filenames`), the warm
gate's view of a config (tritonfleet.serving.warmup). A converged host's no-op then does not
import protobuf and the schema at all (speed-only ``local_cache``, docs/scale.md; off with
``TRITONFLEET_SPEED=off``: validated and parsed again).

A verdict is kept only for a repository without problems, keyed by everything the validator's
answer depends on: the files (names, sizes, sha256: tritonfleet.model_repo.render.manifest,
which reads only what changed since its last look), the GPU count it was validated for, the
validator's own source (tritonfleet/model_repo/validate/ and the schema loader), tritonfleet's
version, and whether the ``onnx`` package is there (the model signature check runs only with
it). Anything else changed is a new key: validated again, from scratch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from .. import __version__
from ..core import local_cache, speed
from . import render
from .derived import remembered_key, validator_source
from .render import RepositoryError, manifest


def plan_cc_filenames(repo: Path, man: dict | None = None) -> dict[str, dict[str, str]]:
    """validate.tensorrt_cc_model_filenames(repo), remembered by the repository's content (its
    manifest, ``man`` where the caller has it) as a verdict is."""
    try:
        content = json.dumps(manifest(repo) if man is None else man, sort_keys=True)
        path = render.CACHE_DIR / "plans" / f"{remembered_key('plans', content)}.json"
    except (RepositoryError, OSError, ValueError):  # unreadable as a release: read as it is
        path = None
    text = local_cache.read(path) if path is not None else None
    if text is not None:
        return json.loads(text)
    from .validate import tensorrt_cc_model_filenames

    out = tensorrt_cc_model_filenames(repo)
    if path is not None:
        local_cache.write(path, json.dumps(out, sort_keys=True))
    return out


def _key(repo: Path, gpus: int | None) -> str:
    validator = validator_source()
    onnx = importlib.util.find_spec("onnx") is not None
    blob = json.dumps([manifest(repo), gpus, __version__, validator, onnx], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def validate_repository(repo: Path, gpus: int | None = None) -> list:
    """tritonfleet.model_repo.validate.validate_repository's problems for ``repo`` ([] when it is
    valid), answered from an earlier run's verdict when nothing it depends on changed."""
    try:
        marker = render.CACHE_DIR / "validated" / _key(repo, gpus)
    except (RepositoryError, OSError, ValueError):  # unreadable as a release: the validator says why
        marker = None
    if not speed.on("local_cache"):
        marker = None
    if marker is not None and marker.is_file():
        return []
    from .validate import validate_repository as validate

    problems = validate(repo, gpus=gpus)
    if not problems and marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"{repo}\n")
        except OSError:  # a read-only cache directory only costs the next run the validation
            pass
    return problems
