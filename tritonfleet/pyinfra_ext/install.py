"""What tritonfleet changes in a pyinfra run, installed by one visible line at the top of every
deploy file (``pyinfra_patches.install()``, before the first step). Importing tritonfleet or its
steps changes nothing in pyinfra.

``install()``, called when pyinfra loads the deploy file (it has connected to every host then,
and read no fact yet):

* socket options: TCP_NODELAY and dead-link keepalives on every SSH connection, now and on every
  later one (tritonfleet.pyinfra_ext.connection);
* pyinfra's "No host key ... found" warning dropped where the inventory relaxed the host-key
  policy on purpose (tritonfleet.pyinfra_ext.connection.quiet_relaxed_host_keys);
* the operation order read from frames instead of ``inspect.stack()`` (tritonfleet.pyinfra_ext.oporder);
* pyinfra's global-argument names and types computed once, not per operation call
  (tritonfleet.pyinfra_ext.argcache);
* Ctrl-C exits with status 130, not 0 (tritonfleet.pyinfra_ext.interrupt; pyinfra's CLI only);
* the process's exit without the interpreter's last garbage collections (tritonfleet.pyinfra_ext.quick_exit;
  pyinfra's CLI only);
* the deploy lock on every host, one run at a time per host (tritonfleet.pyinfra_ext.hostlock; pyinfra's CLI
  runs that change hosts only): its holders are started here and connect while the deploy file
  goes on importing its steps (a deploy file calls install() before those imports); pyinfra's
  first command to any host (Host.run_shell_command, put_file, get_file, rsync) and the first step
  of the package (:func:`required`) wait until every host's lock is held, or stop the run there
  with nothing sent (a lock another run keeps). With pyinfra's Host changed (compat's
  ``lock_early`` off), install() itself waits, as it did before;
* in a run a rollout waits for: a failure report for every host failed in an operation that has
  none of its own (tritonfleet.core.report.report_operation_errors).

pyinfra runs the deploy file once per host, the hosts side by side (greenlets): the first call
of a run does all of it for every host, the others wait until it is done (and stop as it did).

First of all it checks the pyinfra internals these rely on (tritonfleet.pyinfra_ext.compat, in
milliseconds): a speed-only patch whose internal changed is left off, with a warning; a changed
internal a behaviour relies on stops the run before any host is changed, naming it and the
pyinfra version. ``TRITONFLEET_SPEED=off`` leaves every speed-only patch off (the operation order,
the global arguments, the idle poll, the early lock, the quick exit: tritonfleet.core.speed), so
pyinfra's own paths run. And every step of the package refuses to run in a run whose deploy file did not
call ``install()`` (:func:`required`): without it, no deploy lock would be taken.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

import pyinfra
from gevent.event import Event
from pyinfra import logger
from pyinfra.api import deploy
from pyinfra.context import ctx_host, ctx_state

from ..core import open_files, report, speed
from ..core.errors import TritonfleetError
from ..core.exits import entry_point, exit_for
from . import argcache, compat, hostlock, interrupt, memo, oporder, quick_exit
from .connection import quiet_relaxed_host_keys, set_idle_poll, tune_state

_MARK = "_tritonfleet_patches"
LINE = "pyinfra_patches.install()"


class PatchesRefused(TritonfleetError):
    """Stops the run while pyinfra loads the deploy file (before any operation ran): the error
    without a traceback (as hostlock.LockError does; tritonfleet.core.exits ends the run)."""

    def __init__(self, error: TritonfleetError):
        self.error = error
        super().__init__(f"tritonfleet: no host was changed:\n{error}")


class NotInstalled(TritonfleetError):
    """A step ran in a pyinfra run whose deploy file did not call install() first."""


class _Installing:
    """The first call of a run: done once it returned; its error, for the other hosts."""

    def __init__(self) -> None:
        self.done = Event()
        self.error: BaseException | None = None


@entry_point
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
    except compat.PyinfraChanged as e:  # pyinfra changed what tritonfleet relies on: refused
        first.error = PatchesRefused(e)
        raise first.error from e
    except BaseException as e:  # the deploy lock refused (LockError): every host stops with it
        first.error = e
        raise
    finally:
        first.done.set()


def _features() -> set[str]:
    """What a deploy relies on: everything but the fleet commands' own (--data, pyinfra's JSON, its
    inventory loader) and
    a self-converging host's run (its connector: tritonfleet converge checks it before the run);
    outside pyinfra's CLI (the Python API) neither Ctrl-C's handler nor the lock's --dry test is
    in force, and pyinfra_cli is not imported for them (importing it monkey-patches the process)."""
    features = set(compat.FEATURES) - {"cli_args", "rollout_json", "self_connector", "inventory"}
    if not pyinfra.is_cli:
        features -= {"interrupt", "dry_flag"}
    return features


def _install() -> None:
    checked = compat.check(_features())  # before anything is changed, in pyinfra or on a host
    if checked.refused:
        raise compat.PyinfraChanged(checked.refusal())
    for warning in checked.warnings():
        logger.warning(warning)
    off = checked.off | {name for name in speed.FEATURES if not speed.on(name)}  # pyinfra's or the switch
    state = ctx_state.get() if ctx_state.isset() else None
    inventory = getattr(state, "inventory", None)  # a State not initialised yet has none
    open_files.check_nofile(len(inventory) if inventory is not None else 0, "this deploy")
    quiet_relaxed_host_keys()
    set_idle_poll("idle_poll" not in off)
    tune_state()
    if hostlock.enabled():
        early = "lock_early" not in off  # the holders connect while the deploy's steps load
        hostlock.acquire_all(wait=not early)
        if early:
            hostlock.gate_host_io()  # held before the first command reaches a host
    if "oporder" not in off:
        oporder.install()
    if "argcache" not in off:
        argcache.install()
    interrupt.install()
    if "quick_exit" not in off:
        quick_exit.install()
    report.report_operation_errors()


def required(step: str, read: Callable[[], hostlock.Seen | None] | None = None) -> None:
    """Every step of the package calls this first: in a pyinfra CLI run (the runs that take the
    deploy lock) whose deploy file did not call :func:`install` before its first step, the step
    refuses, while pyinfra still loads the deploy file: nothing has run on any host. The Python
    API (tests with the @fake connector, tritonfleet's own fleet commands) takes no lock and is
    left alone. A run whose locks install() started waits here until every host's is held (or
    stops, naming the hosts whose lock another run keeps).

    ``read``: the step's first read of the host (read-only; its first command hostlock's
    ``seen_command``, whose answer, parsed, it returns): sent while the host's lock is still being
    taken where it can be, and read again under the lock unless it stands
    (hostlock.read_before_lock); else read once the locks are held."""
    _refuse_unless_installed(step)
    if read is None:
        hostlock.wait_or_exit()  # no step runs before the run holds every host's deploy lock
        return
    current = ctx_host.get()
    stands = hostlock.read_before_lock(current, read)  # every host's lock held once it returns
    if stands is False:
        memo.forget(current)  # another run held the lock in between: what it read is stale
    if not stands:
        read()


def _refuse_unless_installed(step: str) -> None:
    if not pyinfra.is_cli:
        return
    state = ctx_state.get() if ctx_state.isset() else None
    if state is not None and getattr(state, _MARK, None) is not None:
        return
    deploy = (
        getattr(state, "current_deploy_filename", None)
        or getattr(state, "current_exec_filename", None)
        or "the deploy file"
    )
    # a step is no entry point (tritonfleet.core.exits): it ends the run itself, as install() would
    raise exit_for(
        PatchesRefused(
            NotInstalled(
                f"{deploy}: the step {step!r} runs, but the deploy file did not call {LINE} before it: without it no "
                "deploy lock is held on the hosts (another run could change them at the same time), and neither the "
                "checks of pyinfra's internals nor Ctrl-C's exit status are in force. Add these two lines to the "
                f"deploy file, the call before its first step:\n    from tritonfleet import pyinfra_patches\n    {LINE}"
            )
        )
    )


def tritonfleet_step(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The decorator of every public step: pyinfra's ``@deploy(name)``, whose body first calls
    :func:`required` (the deploy file installed the patches, so the deploy lock is held). The
    step's operations, their names and their order are those of a plain ``@deploy(name)``."""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def step(*args: Any, **kwargs: Any) -> Any:
            required(name)
            return func(*args, **kwargs)

        return deploy(name)(step)

    return decorator
