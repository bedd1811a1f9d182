"""tritonfleet.pyinfra_ext.quick_exit: a pyinfra CLI run's exit freezes the garbage collector's
objects (after the other exit handlers that were registered after it, before those registered
before it); outside the CLI nothing changes. Each case in its own interpreter: atexit is global."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import atexit, gc, sys
import pyinfra
from tritonfleet.pyinfra_ext import quick_exit

atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))  # runs after it
pyinfra.is_cli = {cli}
quick_exit.install()
quick_exit.install()  # once a process
print("run's output", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("cli", [True, False])
def test_a_cli_runs_exit_freezes_the_collector_and_keeps_its_output_and_status(cli):
    r = subprocess.run([sys.executable, "-c", PROGRAM.format(cli=cli)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines() == ["run's output", f"frozen at exit: {cli}"]
