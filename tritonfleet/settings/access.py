"""Reading tunables from host data: one place, with errors that say where to set them."""

from __future__ import annotations

import copy

from pyinfra import host

from ..core.errors import UsageError
from .defaults import DEFAULTS

_MISSING = object()


class ConfigError(UsageError, ValueError):
    pass


def default(key: str, fallback=_MISSING):
    """The package's default of tunable ``key`` (tritonfleet/settings/defaults.py), a copy of it; else
    ``fallback``; else ConfigError (a name that is no tunable)."""
    if key in DEFAULTS:
        return copy.deepcopy(DEFAULTS[key])
    if fallback is not _MISSING:
        return fallback
    raise ConfigError(f"'{key}' is not set and is no tunable of tritonfleet (tritonfleet/settings/defaults.py "
                      "lists every one; `python -m tritonfleet.settings.table` prints them)")


def get(key: str, default_value=_MISSING):
    """The tunable ``key`` for the current host: --data, host data, group data, else the
    package's default (``default_value`` only for names that are no tunable)."""
    value = host.data.get(key, _MISSING)
    if value is not _MISSING:
        return value
    try:
        return default(key, default_value)
    except ConfigError as e:
        raise ConfigError(f"{host.name}: {e}") from None
