"""Run a function in a forked child of the test process, for tests that load inventories
in-process (tritonfleet.fleet.inventory.load_inventory, a fleet command through click's CliRunner).

Loading an inventory imports pyinfra_cli, whose ``__init__`` monkey-patches the whole process for
gevent (sockets, threads, time.sleep). In the test process that would change every later test:
timing-bound ones (tests/unit/pyinfra_ext/test_connection.py's idle connection, tests/unit/serving/test_drain.py's request in
flight) failed under it. The child takes the patch with it; a fork costs milliseconds, where a new
interpreter costs seconds on the test machine.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback


def _raw_fork() -> int:
    """os.fork as the standard library has it: where an earlier test left the process patched for
    gevent, gevent's fork (which watches the child from its event loop) left the read below
    blocked (measured: even for ``lambda: 42``). The child then starts gevent's hub afresh, as
    gevent's own fork does (gevent.reinit)."""
    import gevent
    from gevent import monkey

    if not monkey.is_module_patched("os"):
        return os.fork()
    pid = monkey.get_original("os", "fork")()
    if pid == 0:
        gevent.reinit()
    return pid


def forked(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run in a forked child; its (picklable) result. An exception in the
    child is printed there (pytest captures the inherited stderr) and fails the caller."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = _raw_fork()
    if pid == 0:  # the child: never returns into the test run
        os.close(r)
        status = 1
        try:
            data = pickle.dumps(fn(*args, **kwargs))
            with os.fdopen(w, "wb") as out:
                out.write(data)
            status = 0
        finally:
            if status:
                traceback.print_exc()
                sys.stderr.flush()
            os._exit(status)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, f"{fn.__name__} failed in the child (its traceback above)"
    return pickle.loads(data)
