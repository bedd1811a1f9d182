"""The keys under which what is derived from a model repository with Triton's schema is remembered
on the control machine (tritonfleet.model_repo.verdicts, render.apply_overrides, the warm
gate's plan in tritonfleet.serving.warmup): everything the answer depends on, so that a changed
input, validator, schema or protobuf is a new key and never a stale answer.
"""

from __future__ import annotations

import hashlib

from .. import __version__, resource
from ..core import local_cache, triton_schema


def validator_source() -> str:
    """sha256 over the validator's source: the modules of the package ``model_repo/validate`` and
    the schema loader (``core/triton_schema.py``), by name and content."""
    h = hashlib.sha256()
    for path in [*sorted(resource("model_repo", "validate").glob("*.py")), resource("core", "triton_schema.py")]:
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def remembered_key(kind: str, *parts: bytes | str) -> str:
    """The key of something derived from ``parts`` with Triton's schema: ``parts``, the
    validator's source with the schema loader, tritonfleet's version, the schema tritonclient
    ships (its file) and protobuf's version. Any of them changed is another key."""
    from google import protobuf  # the package's __init__ only: its version

    schema = triton_schema.schema_file()
    return local_cache.digest(
        kind,
        *parts,
        validator_source(),
        __version__,
        schema.read_bytes() if schema is not None else b"",
        protobuf.__version__,
    )
