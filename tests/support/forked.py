"""Run a function in a forked child of the test process, for tests that load inventories
in-process (tritonfleet.inventory.roster.load_inventory, a fleet command through click's CliRunner).

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
    blocked (measured: even for ``lambda: 42``). The child then starts with a hub of its own
    (below)."""
    from gevent import monkey

    if not monkey.is_module_patched("os"):
        return os.fork()
    pid = monkey.get_original("os", "fork")()
    if pid == 0:
        _leave_the_parents_greenlets()
    return pid


_PARKED: list = []


def _leave_the_parents_greenlets() -> None:
    """In the child: a new gevent hub, the parent's greenlets left parked on the old one.

    Patched for gevent, the test process's threads are greenlets of its one OS thread, and a fork
    copies every one of them: a receiver's HTTP server and worker a test runs in a thread went on
    running in the child too, accepted the child's own request on the listening socket they share
    and answered it from the child's copy of their state (tests/integration/fleet/test_quarantine.py's
    hold went to the child's receiver and was gone from the parent's: it failed most runs alone).
    Resuming them is never wanted, nor unwinding them (their ``finally`` would shut servers down
    from the child): they are kept referenced, so never collected, and their hub is dropped; the
    child's own I/O gets a fresh hub and loop. The child leaves with os._exit."""
    import gc

    import gevent
    from greenlet import getcurrent, greenlet

    me = getcurrent()
    _PARKED.extend(g for g in gc.get_objects() if isinstance(g, greenlet) and g is not me and not g.dead)
    hub = gevent.get_hub()
    _PARKED.append(hub)
    hub.destroy(destroy_loop=True)


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
    data, status = _collect(r, pid)
    assert os.waitstatus_to_exitcode(status) == 0 and data, f"{fn.__name__} failed in the child (its traceback above)"
    return pickle.loads(data)


def _collect(r: int, pid: int) -> tuple[bytes, int]:
    """What the child wrote to ``r`` and its wait status. Not "read to the end of the pipe":
    a process the child started and left running (a lock holder, a helper forked without exec)
    can inherit the pipe's write end and keep it open after the child exits, and a read to the
    end then blocks for ever (seen once in the fast tier, at the first forked test). So read
    what there is while the child lives, and once it has exited, what is left unread."""
    import select

    chunks: list[bytes] = []
    status = None
    try:
        while True:
            readable, _, _ = select.select([r], [], [], 0.2)
            if readable:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                continue
            done, st = _waitpid(pid, os.WNOHANG)
            if done:
                status = st
                os.set_blocking(r, False)
                while True:  # what the child wrote before it exited
                    try:
                        chunk = os.read(r, 1 << 16)
                    except BlockingIOError:
                        break
                    if not chunk:
                        break
                    chunks.append(chunk)
                break
    finally:
        os.close(r)
    if status is None:
        _, status = _waitpid(pid, 0)
    data = b"".join(chunks)
    if status == REAPED:  # the child writes its result only when fn returned: that is its status
        status = 0 if data else 1 << 8
    return data, status


REAPED = -1  # _waitpid's status for a child another part of this process reaped first


def _waitpid(pid: int, options: int) -> tuple[int, int]:
    """os.waitpid, where a child reaped by someone else is (pid, REAPED): patched for gevent, the
    test process's event loop reaps every child that exits while it runs (libev's SIGCHLD handler
    waits for any child), a raw-forked one too, and its status is gone (seen once in the
    integration tier: ``ChildProcessError: [Errno 10] No child processes``)."""
    try:
        return os.waitpid(pid, options)
    except ChildProcessError:
        return pid, REAPED
