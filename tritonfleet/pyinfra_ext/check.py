"""Verifications as pyinfra operations that are never planned as changes (the rule that tells
them by name, ``is_check``: tritonfleet.core.checks).

``check`` runs a Python function on the control machine while the operations execute (like
``python.call``), but yields nothing while pyinfra plans: ``pyinfra --dry`` on a converged host
lists no change, and a check cannot make a plan look as if it would touch a host. Every check's
name starts with ``check:`` (``-y --json`` lists it under ``success`` when it ran and passed).

``will_change`` decides at planning time whether a follow-up operation is needed at all
(``apt update`` after a source changed, a restart after a unit changed). A follow-up that is
added only when an earlier operation will change is planned as a plain change, never as a
"conditional change" on a converged host.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FunctionCommand, operation
from pyinfra.context import state

from ..core.report import reported


@operation(is_idempotent=False)
def check(function, *args, **kwargs):
    """Run ``function(*args, **kwargs)`` when the operations execute. It fails the host by raising
    ``tritonfleet.core.report.HostFailure`` (the report is printed, no traceback); anything else it
    raises is reported as a bug (tritonfleet.core.report.reported).

    + function: the check, called with the remaining arguments when the operations run

    Changes: nothing by itself: a verification.

    Tunables: none.

    **Example:**

    .. code:: python

        check(name="check: Triton ready", function=gate, timeout=60)
    """
    if not state.is_executing:
        host.noop("verification: runs with the operations, never a planned change")
        return
    yield FunctionCommand(reported, (function, args, kwargs), {})


@operation(is_idempotent=False, _set_in_op=False)
def check_with_steps(function, *args, **kwargs):
    """``check`` whose function may run operations itself (executed at once, nested, as pyinfra's
    python.call allows): the health gate's auto_rollback.

    + function: the check, which may run operations itself

    Changes: what the function's operations change (the health gate's rollback).

    Tunables: none.

    **Example:**

    .. code:: python

        check_with_steps(name="check: health gate", function=gate_or_roll_back)
    """
    if not state.is_executing:
        host.noop("verification: runs with the operations, never a planned change")
        return
    yield FunctionCommand(reported, (function, args, kwargs), {})


def will_change(*ops) -> bool:
    """True when any of ``ops`` (operation results, or lists of them) plans a change."""
    for op in ops:
        if isinstance(op, (list, tuple)):
            if will_change(*op):
                return True
        elif op is not None and op.will_change:
            return True
    return False
