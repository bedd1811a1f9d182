"""What tritonfleet changes in a pyinfra run, installed by one visible line at the top of every
deploy file (``pyinfra_patches.install()``, before the first step). Importing tritonfleet or its
steps changes nothing in pyinfra.

``install()``, called when pyinfra loads the deploy file (it has connected to every host then,
and read no fact yet):

* socket options: TCP_NODELAY and dead-link keepalives on every SSH connection, now and on every
  later one (tritonfleet.connection);
* the operation order read from frames instead of ``inspect.stack()`` (tritonfleet.oporder);
* Ctrl-C exits with status 130, not 0 (tritonfleet.interrupt; pyinfra's CLI only);
* the deploy lock on every host, one run at a time per host (tritonfleet.hostlock; pyinfra's CLI
  runs that change hosts only), taken before the deploy reads any fact;
* in a run a rollout waits for: a failure report for every host failed in an operation that has
  none of its own (tritonfleet.failure.report_operation_errors).

Each is idempotent; tests/test_pyinfra_internals.py checks the pyinfra internals they rely on.
"""

from __future__ import annotations

from . import failure, hostlock, interrupt, oporder
from .connection import tune_state


def install() -> None:
    """Tune this pyinfra run for tritonfleet's steps (see the module's docstring)."""
    tune_state()
    if hostlock.enabled():
        hostlock.acquire_all()
    oporder.install()
    interrupt.install()
    failure.report_operation_errors()
