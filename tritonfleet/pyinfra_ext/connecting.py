"""The deploy lock taken while pyinfra connects: a repository's ``config.py`` calls :func:`lock_on_connect`.

pyinfra's command line runs the ``config.py`` of the directory it runs in before it loads the
inventory and connects (``pyinfra_cli.cli._set_config``; pyinfra's docs: "config.py"), then
initialises its State (``State.init``, which sets up the state callbacks: a callback added before
is dropped, so one is added right after it) and connects; its ``Host.connect`` calls each state
callback's ``host_before_connect`` first. Started there, the hosts'
lock holders (tritonfleet.pyinfra_ext.hostlock: an OpenSSH client each) connect while pyinfra's own
connection does and while the deploy file imports its steps, instead of after both: measured on a
converged test host, the deploy then waits 0.00-0.02 s for its lock instead of 0.10-0.12 s
(docs/scale.md, "A converged host's no-op"). Nothing else changes: the deploy file's
``pyinfra_patches.install()`` still gates every command until every lock is held (it adopts the
holders started here and starts any that were not), and a lock another run keeps still stops the
run before its first command.

Only a run that would take the lock anyway starts holders here: pyinfra's command line (not
``--dry``), running deploy files of which at least one calls ``pyinfra_patches.install()`` (read
from the files' syntax, not run). ``pyinfra inventories/prod.py exec -- uptime``, ``fact`` and
``--dry`` runs from the same directory take no lock, as before. A host pyinfra then cannot connect
to has its holder ended (``host_connect_error``): the run leaves it alone, as pyinfra does.
Speed-only (``lock_connecting``, tritonfleet.core.speed): ``TRITONFLEET_SPEED=off``, or a pyinfra
whose connect no longer calls the callbacks this relies on (tritonfleet.pyinfra_ext.compat), leaves
the holders to ``install()``, as before.
"""

from __future__ import annotations

import ast
from pathlib import Path

import click
from pyinfra import logger
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state

from ..core import speed
from . import compat, hostlock

FEATURE = "lock_connecting"
_STARTED = "_tritonfleet_lock_on_connect_started"  # on the State: the holders were started


def installs(path: Path) -> bool:
    """Whether the deploy file at ``path`` calls ``pyinfra_patches.install()`` (at any depth of
    its syntax; a file that cannot be read or parsed: False, and pyinfra will say why)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "install":
            if isinstance(func.value, ast.Name) and func.value.id == "pyinfra_patches":
                return True
    return False


def deploy_files(operations) -> list[Path]:
    """The deploy files of pyinfra's command line (its ``operations`` argument), or [] when the run
    is not one of deploy files (``exec``, ``fact``, an operation by name): pyinfra's own rule, every
    operation ending in ``.py``."""
    ops = [str(op) for op in operations or ()]
    if not ops or not all(op.endswith(".py") for op in ops):
        return []
    return [Path(op) for op in ops]


class _LockOnConnect(BaseStateCallback):
    """Starts every host's holder as pyinfra begins to connect to the first of them (one heartbeat
    process for all of them, as install() starts them); ends a host's holder when pyinfra cannot
    connect to it."""

    @staticmethod
    def host_before_connect(state, host) -> None:
        if getattr(state, _STARTED, False):
            return
        setattr(state, _STARTED, True)
        hosts = [h for h in state.inventory if state.is_host_in_limit(h)]  # as pyinfra's connect_all
        try:
            hostlock.start_connecting(hosts)
        except OSError as e:  # a holder could not be spawned: install() starts (and reports) them as before
            logger.debug(f"tritonfleet: the deploy lock was not started while connecting ({e}); install() starts it")

    @staticmethod
    def host_connect_error(state, host, error) -> None:
        hostlock.forget(host)


def lock_on_connect() -> bool:
    """From a repository's ``config.py``: start the deploy lock's holders as pyinfra connects, for a
    run that takes the lock (see the module's docstring). Returns whether it will."""
    if not hostlock.enabled() or not speed.on(FEATURE) or not ctx_state.isset():
        return False
    ctx = click.get_current_context(silent=True)
    files = deploy_files(ctx.params.get("operations") if ctx is not None else None)
    if not any(installs(f) for f in files):
        return False
    if compat.check({FEATURE}).mismatches:  # speed only: the plain path (install()) is always right
        return False
    state = ctx_state.get()
    if getattr(state, "initialised", False):
        state.add_callback_handler(_LockOnConnect())
        return True
    init = state.init  # State.init sets up the callback handlers (and drops any added before)

    def init_then_lock(*args, **kwargs):
        init(*args, **kwargs)
        state.add_callback_handler(_LockOnConnect())

    state.init = init_then_lock  # this State only: pyinfra's CLI calls it once, before it connects
    return True
