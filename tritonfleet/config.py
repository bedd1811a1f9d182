"""Reading tunables from host data: one place, with errors that say where to set them."""

from __future__ import annotations

from pyinfra import host

_MISSING = object()


class ConfigError(ValueError):
    pass


def get(key: str, default=_MISSING):
    """The tunable ``key`` for the current host (inventory, group_data, --data)."""
    value = host.data.get(key, _MISSING)
    if value is _MISSING:
        if default is not _MISSING:
            return default
        raise ConfigError(
            f"{host.name}: tunable '{key}' is not set; every tunable has its default in "
            "inventories/group_data/all.py (run pyinfra next to that group_data directory, "
            "or copy the file next to your inventory)"
        )
    return value
