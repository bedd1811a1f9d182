"""pyinfra's global-argument list computed once per run instead of once per operation call.

Every operation call on every host pops pyinfra's global arguments (``_sudo``, ``_env``, ...)
with ``pyinfra.api.arguments.pop_global_arguments``, which asks ``all_global_arguments()`` for
their names and types, and that evaluates ``typing.get_type_hints`` on pyinfra's argument classes
again each time: a cost that grows with hosts x operations (speed-only ``argcache``:
docs/scale.md, "Speed-only features"). The answer is fixed
for a pyinfra release (class annotations), so ``install()`` hands pyinfra a function that
returns the same list, computed on first use by pyinfra's own function.
tests/unit/pyinfra_ext/test_internals.py checks that both callers look the name up in their module at call
time, and that the cached answer is pyinfra's.
"""

from __future__ import annotations

import importlib

_arguments = importlib.import_module("pyinfra.api.arguments")
_facts = importlib.import_module("pyinfra.api.facts")
_original = _arguments.all_global_arguments
_cache: list[tuple[str, type]] = []


def all_global_arguments() -> list[tuple[str, type]]:
    """pyinfra.api.arguments.all_global_arguments, computed once (a new list each call, so a
    caller that changes it changes nothing here)."""
    if not _cache:
        _cache.extend(_original())
    return list(_cache)


# pyinfra's own function behind it (inspect, and so the check of pyinfra's internals, reads that)
all_global_arguments.__wrapped__ = _original


def install() -> None:
    """Point pyinfra's two callers (pop_global_arguments, FactBase's reserved-name check) at the cached
    function."""
    _arguments.all_global_arguments = all_global_arguments
    _facts.all_global_arguments = all_global_arguments


def uninstall() -> None:
    _arguments.all_global_arguments = _original
    _facts.all_global_arguments = _original
