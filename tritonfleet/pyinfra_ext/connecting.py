"""What a repository's ``config.py`` starts as pyinfra connects (:func:`connect_early`): the deploy
lock's holders, and TCP_NODELAY from the handshake on.

pyinfra's command line runs the ``config.py`` of the directory it runs in before it loads the
inventory and connects (``pyinfra_cli.cli._set_config``; pyinfra's docs: "config.py"), then
initialises its State (``State.init``, which sets up the state callbacks: a callback added before
is dropped, so one is added right after it) and connects; its ``Host.connect`` calls each state
callback's ``host_before_connect`` first. There:

* the hosts' lock holders (tritonfleet.pyinfra_ext.hostlock: an OpenSSH client each) start as
  pyinfra begins to connect, and connect while pyinfra's own connection does and while the
  deploy file imports its steps, instead of after both (the deploy's wait for its lock on a
  converged host's no-op: 0.12 s to 0.03 s). ``pyinfra_patches.install()`` still gates every
  command until every lock is held (it adopts the holders started here and starts any that were
  not), and a lock another run keeps still stops the run before its first command;
* pyinfra's connection gets TCP_NODELAY before its handshake, not after it
  (tritonfleet.pyinfra_ext.connection.nodelay_from_handshake: 66-71 ms to 24-27 ms a connect).

Only a run of deploy files of which at least one calls ``pyinfra_patches.install()`` (read from
the files' syntax, not run) is touched, and only one that takes the lock (pyinfra's command line,
not ``--dry``) starts holders. ``pyinfra inventories/prod.py exec -- uptime``, ``fact`` and
``--dry`` runs from the same directory take no lock, as before. A host pyinfra then cannot
connect to has its holder ended (``host_connect_error``): the run leaves it alone, as pyinfra
does. Speed-only (``connect_early``, tritonfleet.core.speed): ``TRITONFLEET_SPEED=off``, or a
pyinfra or paramiko whose connect no longer works as this relies on (tritonfleet.pyinfra_ext.compat),
leaves the holders to ``install()`` and TCP_NODELAY to after the handshake, as before.
"""

from __future__ import annotations

import ast
from pathlib import Path

import click
import pyinfra
from pyinfra import logger
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state

from ..core import speed
from . import compat, connection, hostlock

FEATURE = "connect_early"
_EARLY = "_tritonfleet_connect_early"  # on the State: {"lock": the run takes it, "started": holders started}


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


class _OnConnect(BaseStateCallback):
    """As pyinfra connects to each host: TCP_NODELAY from its handshake on; the deploy lock's holders
    of every host started as it begins with the first (one heartbeat process for all of them, as
    install() starts them); a host pyinfra cannot connect to has its holder ended."""

    @staticmethod
    def host_before_connect(state, host) -> None:
        connection.nodelay_from_handshake(host)
        early = getattr(state, _EARLY, {})
        if not early.get("lock") or early.get("started"):
            return
        early["started"] = True
        hosts = [h for h in state.inventory if state.is_host_in_limit(h)]  # as pyinfra's connect_all
        try:
            hostlock.start_connecting(hosts)
        except OSError as e:  # a holder could not be spawned: install() starts (and reports) them as before
            logger.debug(f"tritonfleet: the deploy lock was not started while connecting ({e}); install() starts it")

    @staticmethod
    def host_connect_error(state, host, error) -> None:
        hostlock.forget(host)


def connect_early() -> bool:
    """From a repository's ``config.py``: for a run of deploy files that call
    ``pyinfra_patches.install()``, tune each connection as pyinfra makes it and, where the run takes
    the deploy lock, start the lock's holders as pyinfra connects (see the module's docstring).
    Returns whether it will."""
    if not pyinfra.is_cli or not speed.on(FEATURE) or not ctx_state.isset():
        return False
    ctx = click.get_current_context(silent=True)
    files = deploy_files(ctx.params.get("operations") if ctx is not None else None)
    if not any(installs(f) for f in files):
        return False
    if compat.check({FEATURE}).mismatches:  # speed only: the plain path (install()) is always right
        return False
    state = ctx_state.get()
    setattr(state, _EARLY, {"lock": hostlock.enabled(), "started": False})
    init = state.init  # State.init sets up the callback handlers (and drops any added before)

    def init_then_register(*args, **kwargs):
        init(*args, **kwargs)
        state.add_callback_handler(_OnConnect())

    state.init = init_then_register  # this State only: pyinfra's CLI calls it once, before it connects
    return True
