"""Every speed-only feature of tritonfleet in one table, and the one switch that turns them off.

A speed-only feature replaces a plain path (pyinfra's own code, plain jinja2, ``json.dumps``, work
done again instead of remembered) with a faster one that gives the same result: the same commands
sent to every host, byte for byte, the same files and answers. ``TRITONFLEET_SPEED=off`` in the
environment of a run turns all of them off, so the plain paths run (to tell a bug in a shortcut
from a bug elsewhere, or to check that a shortcut still changes nothing:
``bench/run.py replay-check --speed both``). What each saves, and when it was measured:
docs/scale.md, "Speed-only features".

Not here, because they change what a host is sent: the facts' memo and batched reads
(tritonfleet.pyinfra_ext.memo: fewer, combined commands). Not switched either: TCP_NODELAY, set
with the dead-link keepalives (tritonfleet.pyinfra_ext.connection, a behaviour), and the model
repository's stat-cached manifest (tritonfleet.model_repo.render).

A feature whose pyinfra internal changed is off for the run too (tritonfleet.pyinfra_ext.compat,
``SPEED`` features): :func:`on` answers for the switch; compat's check answers for pyinfra.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "TRITONFLEET_SPEED"
OFF_VALUES = ("off", "0", "no", "false")


@dataclass(frozen=True)
class Feature:
    name: str
    replaces: str  # the plain path that runs when it is off
    where: str  # the module that asks :func:`on`


FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "oporder",
            "pyinfra's get_operation_order_from_stack (inspect.stack())",
            "tritonfleet.pyinfra_ext.oporder, installed by pyinfra_ext.install",
        ),
        Feature(
            "argcache",
            "pyinfra's all_global_arguments computed on every call",
            "tritonfleet.pyinfra_ext.argcache, installed by pyinfra_ext.install",
        ),
        Feature(
            "idle_poll",
            "paramiko's 0.1 s idle poll of a connection",
            "tritonfleet.pyinfra_ext.connection.set_idle_poll, from pyinfra_ext.install",
        ),
        Feature(
            "lock_early",
            "install() waiting for every host's deploy lock before the deploy's steps load",
            "tritonfleet.pyinfra_ext.hostlock.gate_host_io, from pyinfra_ext.install",
        ),
        Feature(
            "connect_early",
            "the deploy lock's holders started by install() once pyinfra has connected, TCP_NODELAY set "
            "after the handshake",
            "tritonfleet.pyinfra_ext.connecting.connect_early",
        ),
        Feature(
            "read_while_locking",
            "pre-flight's first read of a host (its one batch of facts) sent once the host's deploy lock is held",
            "tritonfleet.pyinfra_ext.hostlock.read_before_lock, from pre-flight's run_all",
        ),
        Feature(
            "posix_spawn",
            "subprocess.Popen (a fork) for the deploy lock's holders and heartbeat process",
            "tritonfleet.pyinfra_ext.children.Child",
        ),
        Feature(
            "quick_exit", "the interpreter's last garbage collections at exit", "tritonfleet.pyinfra_ext.quick_exit"
        ),
        Feature(
            "jinja_bytecode",
            "compiling the unit template in every process (no bytecode cache)",
            "tritonfleet.serving.unit._templates",
        ),
        Feature("json_repeated", "json.dumps of the warm gate's request body", "tritonfleet.serving.warmup.encode"),
        Feature(
            "local_cache",
            "deriving again what a run derives from the model repository: the validator's "
            "verdicts, the TensorRT plan names, rendered configs, the warm gate's plan",
            "tritonfleet.core.local_cache, tritonfleet.model_repo.verdicts",
        ),
    )
}


def switched_off() -> bool:
    """``TRITONFLEET_SPEED`` says off (read on every call: a test or a child process may set it)."""
    return os.environ.get(ENV, "").strip().lower() in OFF_VALUES


def on(name: str) -> bool:
    """Whether the speed-only feature ``name`` runs (a name not in the table is a bug: KeyError)."""
    FEATURES[name]  # noqa: B018 - a misspelt name fails loudly, not silently "on"
    return not switched_off()
