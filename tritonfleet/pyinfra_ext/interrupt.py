"""Ctrl-C during a deploy exits with status 130, not 0.

pyinfra's own handler prints "Exiting upon user request!" and exits 0, so a script or a CI job
that runs the deploy takes an interrupted run for a successful one. This handler (installed by
the deploy file's ``pyinfra_patches.install()``, in pyinfra's main thread) says what state the hosts are in and
exits 130 (128 + SIGINT), as shells do.
"""

from __future__ import annotations

import os
import signal
import sys

import pyinfra

MESSAGE = (
    "Interrupted (Ctrl-C): the operations in flight were cut. Nothing half-written goes live: a model "
    "release is switched to only once complete (a cut transfer resumes on the next run), and Triton "
    "restarts only after its image, models and unit are in place. Run the same command again to finish."
)


def _handler(signum, frame):
    sys.stderr.write(f"\n{MESSAGE}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # at once: unwinding pyinfra's greenlets from here ends in gevent's LoopExit, and its own
    # disconnect would wait for operations in flight (their SSH sessions close with the process)
    os._exit(128 + signal.SIGINT)


def install() -> bool:
    """Use this handler for SIGINT in pyinfra's CLI; False (nothing changed) elsewhere (the API,
    tests) or outside the main thread."""
    if not pyinfra.is_cli:
        return False
    try:
        signal.signal(signal.SIGINT, _handler)
    except ValueError:  # not the main thread (pyinfra runs deploy code in greenlets of it)
        return False
    return True
