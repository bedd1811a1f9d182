"""SSH connections tuned for many small remote commands.

paramiko never sets TCP_NODELAY, so every remote command waits out Nagle's algorithm against the
peer's delayed ACK, and a deploy runs dozens of commands per host (docs/scale.md, "Speed-only
features": why it is not behind the speed switch).

``tune_state()`` sets TCP_NODELAY on every connected SSH host of a pyinfra state and registers a
callback that does the same for every later connection (reconnects after a reboot, hosts connected
on demand).

A host that stops answering (a dropped link: packets vanish, no reset) would otherwise hang the
run for hours: the kernel's keepalive starts after 7200 s and paramiko sends nothing on an idle
connection. So every connection also gets, from the host's ``ssh_keepalive_interval`` and
``ssh_keepalive_count``: paramiko's transport keepalive (an SSH message every interval), TCP
keepalive probes at the same pace, and TCP_USER_TIMEOUT = interval x count, so data (a keepalive,
a transfer) unacknowledged that long closes the socket. paramiko then closes every channel of
the connection: the command or transfer running on it fails, naming the host, within that bound.
Every deploy file calls it through ``pyinfra_patches.install()`` (pyinfra connects to all
hosts before it loads the deploy file); ``tritonfleet.inventory.roster`` calls it for its own connections.

paramiko's transport wakes up every 0.1 s on an idle connection (a socket timeout, to see whether
it was closed and whether a keepalive is due): with hundreds of hosts connected for a whole run,
thousands of wake-ups a second in the control process, a cost that grows with hosts x run time
(speed-only ``idle_poll``: docs/scale.md, "Speed-only features"). Tuned
connections wake up every ``IDLE_POLL`` s instead; closing one still returns at once (its
transport's thread ends at its next wake-up), and keepalives (every ``ssh_keepalive_interval`` s)
are still sent on time.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import paramiko
from pyinfra.api.state import BaseStateCallback
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.context import ctx_state

from ..settings.defaults import DEFAULTS
from ..settings.table import whole_number

_MARK = "_tritonfleet_tuned"
_NODELAY_MARK = "_tritonfleet_nodelay_handshake"  # on a connector: its connects build nodelay_transport
# the package's defaults, for hosts whose data does not set them
KEEPALIVE_INTERVAL = DEFAULTS["ssh_keepalive_interval"]
KEEPALIVE_COUNT = DEFAULTS["ssh_keepalive_count"]
IDLE_POLL = 1.0  # s between an idle paramiko transport's wake-ups (paramiko's own: 0.1 s)
#: the idle poll is tuned only while paramiko's transport is the one checked (a speed-only patch:
#: tritonfleet.pyinfra_ext.compat switches it off, with a warning, when it is not)
_idle_poll = {"on": True}


def keepalive(data: Any) -> tuple[int, int]:
    """(interval, count) from a host's data (a mapping or pyinfra's HostData); the bound after
    which a silent host counts as gone is their product. Bad values raise ValueError naming the
    tunable."""
    get = data.get if hasattr(data, "get") else (lambda k, d=None: d)
    out = []
    for key, default in (("ssh_keepalive_interval", KEEPALIVE_INTERVAL), ("ssh_keepalive_count", KEEPALIVE_COUNT)):
        value = get(key)
        out.append(whole_number(default if value is None else value, key))
    return out[0], out[1]


def dead_after(data: Any) -> int:
    """Seconds after which a host that stopped answering counts as gone."""
    interval, count = keepalive(data)
    return interval * count


def tune_socket(sock: Any, interval: int = KEEPALIVE_INTERVAL, count: int = KEEPALIVE_COUNT) -> bool:
    """TCP_NODELAY, keepalive probes every ``interval`` s and TCP_USER_TIMEOUT ``interval x count``
    on a TCP socket. False for anything else (a ProxyCommand pipe, a closed socket): those are
    left alone."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", interval),
            ("TCP_KEEPINTVL", interval),
            ("TCP_KEEPCNT", count),
            ("TCP_USER_TIMEOUT", interval * count * 1000),
        ):
            if hasattr(socket, name):  # Linux; other systems keep their defaults
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError:
        return False
    return True


def transport_of(host: Any):
    """The paramiko Transport behind a pyinfra host's SSH connector (None if it has none)."""
    client = getattr(getattr(host, "connector", None), "client", None)
    get_transport = getattr(client, "get_transport", None)
    return get_transport() if get_transport else None


def tune_host(host: Any) -> bool:
    """Tune the host's current SSH connection; True when its socket now has TCP_NODELAY."""
    transport = transport_of(host)
    if transport is None:
        return False
    try:
        interval, count = keepalive(getattr(host, "data", None))
    except ValueError:  # refused, naming the host, before anything runs (tritonfleet.pyinfra_ext.hostlock)
        interval, count = KEEPALIVE_INTERVAL, KEEPALIVE_COUNT
    if hasattr(transport, "set_keepalive"):
        transport.set_keepalive(interval)
    sock = getattr(transport, "sock", None)
    tuned = tune_socket(sock, interval, count)
    poll = getattr(transport, "_active_check_timeout", None) if _idle_poll["on"] else None
    if tuned and poll is not None and sock.gettimeout() == poll:  # paramiko's own idle poll
        sock.settimeout(max(IDLE_POLL, poll))
    return tuned


def nodelay_transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport over ``sock`` with TCP_NODELAY set before the handshake (paramiko's
    ``transport_factory``): the handshake's small messages no longer wait out Nagle's algorithm
    against the server's delayed ACK (paramiko's connect on a test host: 66-71 ms, 24-27 ms with
    it; docs/scale.md). A socket that is no TCP socket (a proxy command's) is left as it is."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):
        pass
    return paramiko.Transport(sock, **kwargs)


def nodelay_from_handshake(host: Any) -> bool:
    """Make pyinfra's next connect of ``host`` (its SSH connector) build its transport with
    :func:`nodelay_transport`; called before pyinfra connects (tritonfleet.pyinfra_ext.connecting).
    A ``transport_factory`` the inventory gives (ssh_paramiko_connect_kwargs) is kept."""
    connector = getattr(host, "connector", None)
    if not isinstance(connector, SSHConnector) or getattr(connector, _NODELAY_MARK, False):
        return False
    make = connector.make_paramiko_kwargs

    def with_nodelay() -> dict:
        kwargs = make()
        extra = kwargs.get("_pyinfra_ssh_paramiko_connect_kwargs") or {}
        if "transport_factory" not in extra and "sock" not in extra:
            kwargs.setdefault("transport_factory", nodelay_transport)
        return kwargs

    connector.make_paramiko_kwargs = with_nodelay  # type: ignore[method-assign]  # this connector only
    setattr(connector, _NODELAY_MARK, True)
    return True


class _TuneOnConnect(BaseStateCallback):
    @staticmethod
    def host_connect(state, host):
        tune_host(host)


def tune_state(state: Any = None) -> int:
    """Tune every connected host of ``state`` (default: pyinfra's current state) now and every
    host that connects later. Safe to call many times. Returns how many hosts were tuned now."""
    if state is None:
        if not ctx_state.isset():
            return 0
        state = ctx_state.get()
    if not getattr(state, _MARK, False) and hasattr(state, "add_callback_handler"):
        state.add_callback_handler(_TuneOnConnect())
        setattr(state, _MARK, True)
    inventory = getattr(state, "inventory", None)
    if inventory is None:
        return 0
    return sum(1 for h in inventory if getattr(h, "connected", False) and tune_host(h))


def quiet_relaxed_host_keys() -> None:
    """pyinfra warns "No host key for <address> found in known_hosts" on every connection when
    ssh_strict_host_key_checking is "off"/"no" (its WarningPolicy): the inventory chose that on
    purpose (the testbed's hosts share one image's host keys), so the warning is dropped. Strict
    mode logs its refusal as an error and accept-new in other words: both still show. Added to
    pyinfra's logger by ``pyinfra_patches.install()`` and by tritonfleet's own fleet commands
    (tritonfleet.inventory.roster), never by importing tritonfleet."""

    class RelaxedHostKeys(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not (record.levelno == logging.WARNING and record.msg == "No host key for %s found in known_hosts")

    log = logging.getLogger("pyinfra")
    if not any(type(f).__name__ == "RelaxedHostKeys" for f in log.filters):
        log.addFilter(RelaxedHostKeys())


def set_idle_poll(on: bool) -> None:
    """Tune paramiko's idle poll on connections tuned from now on (tritonfleet.pyinfra_ext.compat)."""
    _idle_poll["on"] = bool(on)
