"""Triton's model configuration schema (``ModelConfig``, model_config.proto) as the protobuf module
tritonclient ships (tritonclient/grpc/model_config_pb2.py), loaded without the rest of
``tritonclient.grpc``: that package's ``__init__`` imports grpc, numpy and ml_dtypes for its
client, about 0.2 s of CPU in every deploy run that reads a config.pbtxt (measured with
time.process_time after pyinfra's own imports: 0.20 s for ``import tritonclient.grpc``), while the
schema module imports only google.protobuf.

The module is registered under its own name, so a later ``import tritonclient.grpc`` (the load
test's client) uses this one and protobuf's descriptor pool sees model_config.proto once.
``from tritonfleet.core.triton_schema import mc`` gives it under the name the validator's modules
use (loaded then, not when this module is imported). It sits in ``core`` because the GPU
placement (``gpu.placement``) and the model repository's modules both parse configs with it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

NAME = "tritonclient.grpc.model_config_pb2"


def schema_file() -> Path | None:
    """tritonclient's ``grpc/model_config_pb2.py`` (the schema), found without running any of
    tritonclient's code; None in another layout."""
    spec = importlib.util.find_spec("tritonclient")  # finds the package, runs none of its code
    if spec is None:
        return None
    path = Path(next(iter(spec.submodule_search_locations or [""]), "")) / "grpc" / "model_config_pb2.py"
    return path if path.is_file() else None


def model_config() -> ModuleType:
    """The ``model_config_pb2`` module."""
    mod = sys.modules.get(NAME)
    if mod is not None:
        return mod
    path = schema_file()
    if path is None:  # another layout: the package's own import
        from tritonclient.grpc import model_config_pb2

        return model_config_pb2
    own = importlib.util.spec_from_file_location(NAME, path)
    mod = importlib.util.module_from_spec(own)
    sys.modules[NAME] = mod
    try:
        own.loader.exec_module(mod)
    except BaseException:
        del sys.modules[NAME]
        raise
    return mod


if TYPE_CHECKING:  # the checker reads the module tritonclient ships (its types: mc.ModelConfig ...)
    from tritonclient.grpc import model_config_pb2 as mc  # noqa: F401 - what ``import mc`` gives the checker
else:

    def __getattr__(name: str) -> ModuleType:
        """``mc``: the schema module, loaded on first use (importing this module loads nothing)."""
        if name == "mc":
            return model_config()
        raise AttributeError(name)
