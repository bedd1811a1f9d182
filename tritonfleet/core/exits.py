"""Where a ``TritonfleetError`` ends the process: the one conversion to an exit status.

Everything a person can act on is a ``TritonfleetError`` (tritonfleet.core.errors); it ends a
command or a deploy with its message and its ``exit_status``, never a traceback. Two kinds of
entry point use this: the command line (``tritonfleet.cli.main``) and the functions a deploy file
calls before the first step (pre-flight's ``run_all``/``host_layer``/``triton_layer`` and the
patches' ``install``), which pyinfra runs while it loads the deploy file: a ``SystemExit`` there
stops the run before any host is changed. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from .errors import TritonfleetError

P = ParamSpec("P")
R = TypeVar("R")


def exit_for(error: TritonfleetError, prefix: str = "") -> SystemExit:
    """The ``SystemExit`` that ends the process for ``error``: ``prefix`` and its message on
    stderr, its exit status. With status 1 the message travels in the SystemExit itself (Python
    prints it as the process ends, as it always did for pre-flight and the deploy lock)."""
    message = f"{prefix}{error}"
    if error.exit_status == 1:
        return SystemExit(message)
    print(message, file=sys.stderr, flush=True)
    return SystemExit(error.exit_status)


def entry_point(function: Callable[P, R]) -> Callable[P, R]:
    """A deploy-time entry point: a ``TritonfleetError`` it raises ends the run (``exit_for``)."""

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except TritonfleetError as e:
            raise exit_for(e) from None

    return run
