"""Child processes that never outlive the process that started them.

A control machine that dies (SIGKILL, OOM, a closed laptop lid that ends the session) must not
leave its children working on the fleet without it: a pyinfra run deploying ungated after its
rollout died, an OpenSSH transfer still writing. ``die_with_parent`` (a ``preexec_fn``) asks
the kernel to SIGKILL the child when the thread that started it ends (Linux
``PR_SET_PDEATHSIG``); on other systems it does nothing. ``alive`` tells whether a process
(a rollout's, by the pid its journal recorded) still runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:  # the C library this process runs with (find_library would start `ldconfig -p` at every import)
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return libc.prctl


_PRCTL = _prctl()


def die_with_parent(parent: int | None = None):
    """A ``preexec_fn`` for subprocess: the child gets SIGKILL when its parent dies. ``parent``:
    the pid that must still be the parent (default: the caller of this function), so a parent
    that died between fork and exec is noticed too."""
    expected = os.getpid() if parent is None else parent

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != expected:  # the parent is already gone
            os._exit(1)

    return preexec


def alive(pid: int) -> bool:
    """The process runs (a zombie, e.g. one that exited but is not reaped yet, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
