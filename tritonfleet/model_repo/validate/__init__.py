"""Validate a Triton model repository the way tritonserver loads it, before any host sees it.

Every ``config.pbtxt`` is parsed with Triton's own schema (``inference.ModelConfig`` from
tritonclient's ``model_config_pb2``, read by ``google.protobuf.text_format`` as the server's
parser reads it), then the repository and configuration rules of the server apply as it runs
on the hosts: ``--strict-model-config=true`` (no backend auto-complete), ``--exit-on-error``.

The rules follow Triton's core (model_repository_manager, model_lifecycle, model_config_utils
ValidateModelConfig / ValidateInstanceGroup / ValidateIOShape, ensemble_utils) and were checked
against a real tritonserver 2.51 (tests/unit/model_repo/test_validate.py). Where the server's behaviour is
plainly a trap the validator is stricter and says so in the message (a symlink out of the
repository, a duplicate tensor name, an instance count below zero, a version directory with
leading zeros that Triton silently skips).

Public API: :class:`Problem`, :func:`validate_repository`, :func:`validate_config_text`,
:func:`parse_config`, :func:`list_models`.

The package, one module a seam: ``tables`` (what Triton accepts, every rule id, ``Problem``),
``lines`` (parsing, and the line of each field), ``repository`` (the model directories, the entry
points), ``checker`` (one repository's check) with its rules in ``config_rules``, ``files`` and
``ensemble``.
"""

from __future__ import annotations

from .lines import parse_config
from .repository import (
    list_models,
    tensorrt_cc_model_filenames,
    validate_config_text,
    validate_repository,
)
from .tables import KNOWN_BACKENDS, NEWER_FIELDS, RULES, Problem

__all__ = [
    "KNOWN_BACKENDS",
    "NEWER_FIELDS",
    "RULES",
    "Problem",
    "list_models",
    "parse_config",
    "tensorrt_cc_model_filenames",
    "validate_config_text",
    "validate_repository",
]
