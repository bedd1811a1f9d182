"""Reading tunables: one accessor, passed explicitly, with errors that say where to set them.

Every function that reads tunables takes a :class:`Settings` (``settings.get(key)``) from its
caller; none reaches for the current host on its own. What can be one:

* ``current()``: the host pyinfra is deploying now (--data, host data, group data, else the
  package's default from tritonfleet/settings/defaults.py); a deploy step starts from it;
* an inventory host of the fleet commands (``tritonfleet.inventory.roster.FleetHost``: its data
  holds the package's defaults under the inventory's);
* one Triton instance of a host with ``triton_per_gpu`` (:class:`Overlay`: its unit, container,
  ports and GPU over the host's settings, tritonfleet.serving.per_gpu);
* a plain mapping (``dict.get`` semantics), in tests and facts.

``get`` below is ``current().get``, for the deploy steps' own reads.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Protocol

from pyinfra import host

from ..core.errors import UsageError
from .defaults import DEFAULTS
from .mirrored import through_mirror

_MISSING = object()


class ConfigError(UsageError, ValueError):
    pass


class Settings(Protocol):
    """Where a function reads tunables from (see the module's docstring)."""

    def get(self, key: str, default: Any = ...) -> Any:
        """The tunable ``key`` (its default when it is not set); ``default`` for a name that is
        no tunable."""


def default(key: str, fallback: Any = _MISSING) -> Any:
    """The package's default of tunable ``key`` (tritonfleet/settings/defaults.py), a copy of it; else
    ``fallback``; else ConfigError (a name that is no tunable)."""
    if key in DEFAULTS:
        return copy.deepcopy(DEFAULTS[key])
    if fallback is not _MISSING:
        return fallback
    raise ConfigError(
        f"'{key}' is not set and is no tunable of tritonfleet (tritonfleet/settings/defaults.py "
        "lists every one; `python -m tritonfleet.tunables` prints them)"
    )


def get(key: str, default_value: Any = _MISSING) -> Any:
    """The tunable ``key`` for the current host: --data, host data, group data, else the
    package's default (``default_value`` only for names that are no tunable); an image the
    hosts pull through image_mirror as they pull it (tritonfleet.settings.mirrored)."""
    value = host.data.get(key, _MISSING)
    if value is not _MISSING:
        return through_mirror(key, value, _CURRENT)
    try:
        return through_mirror(key, default(key, default_value), _CURRENT)
    except ConfigError as e:
        raise ConfigError(f"{host.name}: {e}") from None


class CurrentHost:
    """The settings of the host pyinfra is deploying now (``get`` above)."""

    def get(self, key: str, default: Any = _MISSING) -> Any:
        return get(key, default)

    def __repr__(self) -> str:
        return "<the current host's settings>"


_CURRENT = CurrentHost()


def current() -> CurrentHost:
    """The current host's settings, to pass to a function that takes a :class:`Settings`."""
    return _CURRENT


class Overlay:
    """``base`` with some settings replaced (one per-GPU Triton instance of a host: its unit,
    container, ports and GPU)."""

    def __init__(self, base: Settings, over: Mapping[str, Any]):
        self.base, self.over = base, dict(over)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.over:
            return self.over[key]
        return self.base.get(key) if default is _MISSING else self.base.get(key, default)

    def __repr__(self) -> str:
        return f"<{self.base!r} with {self.over!r}>"
