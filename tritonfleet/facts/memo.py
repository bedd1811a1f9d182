"""Facts read once per host per run, for as long as nothing on the host changed.

pyinfra 3 runs a fact's command every time it is asked for, so four package operations read
``dpkg`` four times on a host where nothing changes. ``fact()`` keeps the answer on the host
object and forgets everything the host's answers as soon as an operation on that host changed
something (or failed): the next read runs the command again. Facts read while pyinfra prepares
the deploy (before any operation runs) are exact for the start of the execution as well.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host, ctx_state

_ATTR = "_tritonfleet_fact_memo"
_HANDLER = "_tritonfleet_fact_memo_handler"


def _memo(host) -> dict:
    memo = getattr(host, _ATTR, None)
    if memo is None:
        memo = {"facts": {}, "last_op": None}
        setattr(host, _ATTR, memo)
    return memo


def _op_changed_or_failed(state, host, op_hash) -> bool:
    try:
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
    except (KeyError, AttributeError):
        return True
    if not meta.is_complete():
        return True
    return not meta.did_succeed(False) or meta.did_change()


class _ForgetOnChange(BaseStateCallback):
    """Before an operation starts on a host: if the previous one changed it, forget its facts."""

    @staticmethod
    def operation_host_start(state, host, op_hash):
        memo = _memo(host)
        last = memo["last_op"]
        if last is not None and _op_changed_or_failed(state, host, last):
            memo["facts"].clear()
        if op_hash in state.ops.get(host, {}):
            memo["last_op"] = op_hash

    @staticmethod
    def operation_host_error(state, host, op_hash, *args, **kwargs):
        _memo(host)["facts"].clear()


def _freeze(value: Any):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def forget(host=None) -> None:
    """Drop every remembered fact of ``host`` (default: the current host)."""
    _memo(host or ctx_host.get())["facts"].clear()


def fact(cls, **kwargs):
    """``host.get_fact(cls, **kwargs)`` for the current host, read once while nothing changes."""
    state = ctx_state.get()
    host = ctx_host.get()
    if not getattr(state, _HANDLER, False):
        state.add_callback_handler(_ForgetOnChange())
        setattr(state, _HANDLER, True)
    facts = _memo(host)["facts"]
    key = (cls, _freeze(kwargs))
    if key not in facts:
        facts[key] = host.get_fact(cls, **kwargs)
    return facts[key]
