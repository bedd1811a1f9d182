"""A faster way for pyinfra to name an operation call by its place in the deploy code.

pyinfra (CLI mode) identifies every operation call by the line numbers of the call stack below
the deploy file. It gets them from ``inspect.stack()`` and ``inspect.getframeinfo()``, which look
up every frame's module by scanning all of ``sys.modules``, and never find the deploy file (it is
executed, not imported), so they scan again for every frame of every operation call on every
host: a cost that grows with the hosts (speed-only ``oporder``: docs/scale.md, "Speed-only features").

``install()`` replaces that function in pyinfra with one that reads the same line numbers
straight from the frames. It is installed only when pyinfra's function and its caller are the ones
checked (tritonfleet.pyinfra_ext.compat hashes both; otherwise the run keeps pyinfra's own, with a
warning), or when ``TRITONFLEET_SPEED=off``; tests/unit/pyinfra_ext/test_memo.py compares both
answers on generated call stacks (no comparison at run time: the hash already pins it).
"""

from __future__ import annotations

import importlib
import sys

import pyinfra

# the modules (pyinfra.api exports functions of the same names)
_operation = importlib.import_module("pyinfra.api.operation")
_util = importlib.import_module("pyinfra.api.util")

_original = _util.get_operation_order_from_stack


def operation_order(state, _skip: int = 1) -> list[int]:
    """pyinfra.api.util.get_operation_order_from_stack, from frame attributes."""
    frames = []
    f = sys._getframe(_skip)
    while f is not None:
        frames.append(f)
        f = f.f_back
    frames.reverse()  # outermost first, as reversed(inspect.stack())
    i = 0
    if state.current_deploy_filename:
        for i, frame in enumerate(frames):  # noqa: B007 - i is used after the loop
            if frame.f_code.co_filename == state.current_deploy_filename:
                break
    numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    install_dir = _util.PYINFRA_INSTALL_DIR
    numbers += [frame.f_lineno for frame in frames[i:] if not frame.f_code.co_filename.startswith(install_dir)]
    return numbers


def _fast_order(state):
    return operation_order(state, _skip=2)


# pyinfra's own function behind it (inspect, and so the check of pyinfra's internals, reads that)
_fast_order.__wrapped__ = _original


def install() -> None:
    """Use the fast operation order in pyinfra (idempotent)."""
    if _operation.get_operation_order_from_stack is not _fast_order:
        _operation.get_operation_order_from_stack = _fast_order


def uninstall() -> None:
    _operation.get_operation_order_from_stack = _original
