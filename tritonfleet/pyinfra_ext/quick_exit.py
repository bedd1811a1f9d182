"""The end of a pyinfra run without the interpreter's last garbage collections.

When a run's work is done (its results printed, the deploy locks released by their exit handler,
files closed by their ``with`` blocks), Python tears the process down: it clears every module and
runs the cyclic garbage collector over every object still alive several times while it does,
after the run's last line was printed (speed-only ``quick_exit``: docs/scale.md, "Speed-only
features"; off with ``TRITONFLEET_SPEED=off``).

``install()`` registers ``gc.freeze`` as an exit handler of a pyinfra CLI run: the objects alive
at that point are left out of the collections that follow, and go with the process. Objects no
longer referenced are still freed as they always are (reference counts); only objects in
reference cycles are no longer searched for one last time, and Python never promised that those
are finalised at exit (``object.__del__``: "It is not guaranteed that __del__() methods are
called for objects that still exist when the interpreter exits"). The other exit handlers (the
deploy lock's release, logging's flush) run before or after it alike: none of them needs a
collection. The Python API (tests, tritonfleet's own commands in-process) is left alone.
"""

from __future__ import annotations

import atexit
import gc

import pyinfra

_installed = {"on": False}


def install() -> None:
    """Freeze the garbage collector's objects at exit (once a process; pyinfra's CLI only)."""
    if _installed["on"] or not pyinfra.is_cli:
        return
    atexit.register(gc.freeze)
    _installed["on"] = True
