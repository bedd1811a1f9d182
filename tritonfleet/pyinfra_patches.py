"""What tritonfleet changes in a pyinfra run, installed by one visible line at the top of every
deploy file (``pyinfra_patches.install()``, before the first step). Importing tritonfleet or its
steps changes nothing in pyinfra.

``install()``, called when pyinfra loads the deploy file (it has connected to every host then,
and read no fact yet):

* socket options: TCP_NODELAY and dead-link keepalives on every SSH connection, now and on every
  later one (tritonfleet.connection);
* the operation order read from frames instead of ``inspect.stack()`` (tritonfleet.oporder);
* pyinfra's global-argument names and types computed once, not per operation call
  (tritonfleet.argcache);
* Ctrl-C exits with status 130, not 0 (tritonfleet.interrupt; pyinfra's CLI only);
* the deploy lock on every host, one run at a time per host (tritonfleet.hostlock; pyinfra's CLI
  runs that change hosts only), taken before the deploy reads any fact;
* in a run a rollout waits for: a failure report for every host failed in an operation that has
  none of its own (tritonfleet.failure.report_operation_errors).

pyinfra runs the deploy file once per host, the hosts side by side (greenlets): the first call
of a run does all of it for every host, the others wait until it is done (and stop as it did).
tests/test_pyinfra_internals.py checks the pyinfra internals these rely on.
"""

from __future__ import annotations

from gevent.event import Event
from pyinfra.context import ctx_state

from . import argcache, failure, hostlock, interrupt, limits, oporder
from .connection import quiet_relaxed_host_keys, tune_state

_MARK = "_tritonfleet_patches"


class _Installing:
    """The first call of a run: done once it returned; its error, for the other hosts."""

    def __init__(self) -> None:
        self.done = Event()
        self.error: BaseException | None = None


def install() -> None:
    """Tune this pyinfra run for tritonfleet's steps (see the module's docstring)."""
    state = ctx_state.get() if ctx_state.isset() else None
    first = getattr(state, _MARK, None)
    if first is not None:  # another host's run of the deploy file installs them, or did
        first.done.wait()
        if first.error is not None:
            raise first.error
        return
    first = _Installing()
    if state is not None:
        setattr(state, _MARK, first)
    try:
        _install()
    except BaseException as e:  # the deploy lock refused (LockError): every host stops with it
        first.error = e
        raise
    finally:
        first.done.set()


def _install() -> None:
    state = ctx_state.get() if ctx_state.isset() else None
    inventory = getattr(state, "inventory", None)  # a State not initialised yet has none
    limits.check_nofile(len(inventory) if inventory is not None else 0, "this deploy")
    quiet_relaxed_host_keys()
    tune_state()
    if hostlock.enabled():
        hostlock.acquire_all()
    oporder.install()
    argcache.install()
    interrupt.install()
    failure.report_operation_errors()
