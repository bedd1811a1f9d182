"""What each probe of tritonfleet.pyinfra_ext.compat asserts about an internal of pyinfra (or
paramiko, jinja2): a probe returns "" when the internal still behaves as tritonfleet relies on,
else what differs, in words for the refusal or the warning. compat's table (``INTERNALS``) names
which internal each probe checks and which feature relies on it.
"""

from __future__ import annotations

import inspect
import io
import marshal
import pickle
import re
from collections.abc import Callable

from jinja2.bccache import bc_magic
from paramiko.packet import Packetizer
from pyinfra.context import ContextManager


def has_dry_flag(cli) -> str:
    """pyinfra's command has a ``--dry`` flag named ``dry`` (hostlock reads it from sys.argv)."""
    opts = [p for p in getattr(cli, "params", []) if getattr(p, "name", None) == "dry"]
    if not opts or opts[0].opts != ["--dry"] or not getattr(opts[0], "is_flag", False):
        return "its command has no flag spelled exactly --dry"
    return ""


def inner_takes(*params: str) -> Callable[[object], str]:
    def probe(inner) -> str:
        have = set(inspect.signature(inner).parameters)
        missing = sorted(set(params) - have)
        return f"its parameters lost {', '.join(missing)}" if missing else ""

    return probe


def context_manager(obj) -> str:
    """``pyinfra.context.ctx_*``: a ContextManager (its source is recorded on its own) with the
    methods tritonfleet calls."""
    if not isinstance(obj, ContextManager):
        return f"it is a {type(obj).__name__}, not a pyinfra.context.ContextManager"
    missing = [m for m in ("get", "set", "isset", "use") if not callable(getattr(obj, m, None))]
    return f"it has no {', '.join(missing)}" if missing else ""


def argument_names(keys) -> str:
    """``CONNECTOR_ARGUMENT_KEYS``: the names of the global arguments that reach the connector,
    each one a ``_``-prefixed string (tritonfleet.pyinfra_ext.stream hands them on by name)."""
    if not isinstance(keys, (list, tuple, set, frozenset)) or not all(
        isinstance(k, str) and k.startswith("_") for k in keys
    ):
        return "it is no longer a collection of the connector arguments' names"
    return "" if {"_sudo", "_sudo_user", "_env", "_chdir"} <= set(keys) else "it lost _sudo, _sudo_user, _env or _chdir"


def paramiko_idle_poll(transport_cls) -> str:
    """paramiko's transport sets its socket's timeout to ``_active_check_timeout`` once, in
    ``__init__``, and its packetizer sends keepalives from the read loop's timeouts: so a longer
    timeout means fewer idle wake-ups and keepalives still on time (tritonfleet.pyinfra_ext.connection)."""
    if not isinstance(getattr(transport_cls, "_active_check_timeout", None), (int, float)):
        return "Transport has no _active_check_timeout"
    if "self.sock.settimeout(self._active_check_timeout)" not in inspect.getsource(transport_cls.__init__):
        return "Transport.__init__ no longer sets its socket's timeout to _active_check_timeout"
    read_all = inspect.getsource(Packetizer.read_all)
    if "socket.timeout" not in read_all or "_check_keepalive" not in read_all:
        return "Packetizer.read_all no longer sends keepalives from its read timeouts"
    return ""


def host_io_only(host_cls) -> str:
    """pyinfra's Host reaches its host through four methods, each handing its arguments to the
    connector (hostlock.gate_host_io makes those wait for the deploy lock): none other calls one."""
    from .hostlock import HOST_IO

    for name in HOST_IO:
        method = inspect.unwrap(getattr(host_cls, name, None) or (lambda: None))
        if f"self.connector.{name}(" not in inspect.getsource(method):
            return f"Host.{name} no longer hands its arguments to self.connector.{name}"
    allowed = {*HOST_IO, "connect", "disconnect", "check_can_rsync"}
    calls = set(re.findall(r"self\.connector\.(\w+)\(", inspect.getsource(inspect.getmodule(host_cls))))
    other = sorted(calls - allowed)
    return f"Host calls its connector's {', '.join(other)} too" if other else ""


def calls_before_connect(connect) -> str:
    """``Host.connect`` calls the state callbacks' ``host_before_connect`` before its connector
    connects, and ``host_connect_error`` when that fails (tritonfleet.pyinfra_ext.connecting)."""
    src = inspect.getsource(connect)
    before, at = src.find('trigger_callbacks("host_before_connect", self)'), src.find("self.connector.connect(")
    if before < 0 or at < 0 or before > at:
        return "it no longer calls host_before_connect before its connector connects"
    return "" if 'trigger_callbacks("host_connect_error", self' in src else "it no longer calls host_connect_error"


def connects_limit(connect_all) -> str:
    """``connect_all`` connects the inventory's hosts in the run's limit (the hosts whose holders
    tritonfleet.pyinfra_ext.connecting starts)."""
    src = inspect.getsource(connect_all)
    if "state.is_host_in_limit(host)" not in src or "host.connect" not in src:
        return "it no longer connects the inventory's hosts in the run's limit"
    return ""


def inits_then_connects(main) -> str:
    """pyinfra's command initialises its State (``state.init``, looked up on the instance) after it
    ran config.py and before it connects (tritonfleet.pyinfra_ext.connecting adds its callback
    right after that call)."""
    src = inspect.getsource(main)
    config, init, connect = src.find("_set_config("), src.find("state.init("), src.find("connect_all(state)")
    if min(config, init, connect) < 0 or not config < init < connect:
        return "it no longer runs config.py, then state.init, then connect_all, in that order"
    return ""


def has_operations(cli) -> str:
    """pyinfra's command takes its deploy files as the argument named ``operations``."""
    if not any(getattr(p, "name", None) == "operations" for p in getattr(cli, "params", [])):
        return "its command has no argument named operations"
    return ""


def jinja_bytecode_format(bucket_cls) -> str:
    """jinja2 writes a cache entry as its magic, the template's checksum pickled (protocol 2), then
    the code marshalled: tritonfleet.serving.unit reads that prefix back without unpickling."""
    bucket = bucket_cls(None, "k", "checksum")
    bucket.code = compile("x = 1", "<check>", "exec")
    f = io.BytesIO()
    try:
        bucket.write_bytecode(f)
    except (AttributeError, TypeError, ValueError, OSError, pickle.PickleError) as e:  # a changed bucket
        return f"Bucket.write_bytecode failed ({type(e).__name__}: {e})"
    data, head = f.getvalue(), bc_magic + pickle.dumps("checksum", 2)
    if not data.startswith(head):
        return "a cache entry no longer begins with bc_magic and the checksum pickled with protocol 2"
    try:
        code = marshal.loads(data[len(head) :])
    except (EOFError, ValueError, TypeError):
        code = None
    return "" if code == bucket.code else "a cache entry's code is no longer the marshalled code after that"


def takes_transport_factory(connect) -> str:
    """paramiko's ``SSHClient.connect`` takes ``transport_factory`` (paramiko 3.2 and later)."""
    return "" if "transport_factory" in inspect.signature(connect).parameters else "it takes no transport_factory"


def connects_with_own_kwargs(connect) -> str:
    """pyinfra's ``SSHConnector._connect`` connects with what its ``make_paramiko_kwargs`` returns."""
    src = inspect.getsource(connect)
    if "self.make_paramiko_kwargs()" not in src or "self.client.connect(hostname, **kwargs)" not in src:
        return "it no longer connects with what make_paramiko_kwargs returns"
    return ""


def hands_kwargs_on(connect) -> str:
    """pyinfra's ``SSHClient.connect`` puts its keyword arguments into what it hands to paramiko."""
    src = inspect.getsource(connect)
    if "config.update(kwargs)" not in src or "super().connect(hostname, **config)" not in src:
        return "it no longer hands its keyword arguments on to paramiko's connect"
    return ""
