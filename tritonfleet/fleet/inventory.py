"""The fleet as the control machine sees it: an inventory loaded the way ``pyinfra`` loads it
(group data, precedence, host order), and SSH commands run on many hosts at once.

Used by the fleet commands (rollout, status, prometheus, tune); the deploys themselves run
through pyinfra.
"""

from __future__ import annotations

import copy
import fnmatch
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..core import open_files as limits
from ..core.connection_errors import CONNECTION_ERRORS
from ..core.errors import TritonfleetError
from ..pyinfra_ext.connection import quiet_relaxed_host_keys, tune_state
from ..settings.defaults import DEFAULTS
from ..settings.table import whole_number

T = TypeVar("T")


class FleetError(TritonfleetError, RuntimeError):
    pass


@dataclass
class FleetHost:
    """One inventory host: its name, groups (inventory order) and merged data."""

    name: str
    groups: list[str]
    data: dict[str, Any]
    pyinfra_host: Any = field(default=None, repr=False, compare=False)

    @property
    def address(self) -> str:
        return str(self.data.get("ssh_hostname") or self.name)

    @property
    def gpu_class(self) -> str | None:
        value = self.data.get("gpu_class")
        return str(value).upper() if value else None

    @property
    def group(self) -> str | None:
        """The host's own group (the first one that is not the inventory file's name)."""
        return self.groups[0] if self.groups else None

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def transport(self) -> Any:
        """The paramiko transport of pyinfra's SSH connection to the host, connected on demand
        (the health tunnels of tritonfleet.serving.triton_http run over it)."""
        h = self.pyinfra_host
        if not h.connected:
            h.connect(reason="tritonfleet", show_errors=False, raise_exceptions=True)
        return h.connector.client.get_transport()


def _state():
    from pyinfra.api import Config, State
    from pyinfra.context import ctx_config, ctx_state

    state = State()
    state.config = Config()
    ctx_state.set(state)
    ctx_config.set(state.config)
    return state


def load_inventory(inventory: str | os.PathLike, data: dict | None = None,
                   limit: Iterable[str] | None = None) -> list[FleetHost]:
    """Hosts of ``inventory`` in inventory order, with the data pyinfra would give them
    (``data`` plays the part of ``--data``) over the package's defaults (tritonfleet/settings/defaults.py,
    the lowest layer, as tritonfleet.settings.access reads them in a deploy; pyinfra's own connection
    settings among them, such as the host-key policy, apply to this module's connections too).
    ``limit``: host or group names (globs allowed)."""
    from pyinfra_cli.inventory import make_inventory

    path = Path(inventory)
    if not path.is_file():
        raise FleetError(f"inventory {inventory} not found")
    state = _state()
    quiet_relaxed_host_keys()  # this command's own connections (tritonfleet.pyinfra_ext.connection)
    _pyinfra_checked()
    try:
        inv = make_inventory(str(path), override_data=data or None, cwd=os.getcwd())
    except SystemExit as e:  # an inventory may refuse to load (e.g. no testbed running)
        raise FleetError(f"inventory {inventory}: {e}") from e
    inv.data = {**copy.deepcopy(DEFAULTS), **(inv.data or {})}
    state.init(inv, state.config)
    tune_state(state)  # TCP_NODELAY on every connection run() opens (tritonfleet.pyinfra_ext.connection)
    own = path.stem
    out = []
    for h in inv:
        groups = [g for g in h.groups if g != own]
        out.append(FleetHost(h.name, groups, dict(h.data.dict()), h))
    if limit:
        patterns = [p for item in limit for p in str(item).split(",") if p]
        out = [h for h in out if any(fnmatch.fnmatch(h.name, p) or any(fnmatch.fnmatch(g, p) for g in h.groups)
                                     for p in patterns)]
        if not out:
            raise FleetError(f"--limit {','.join(patterns)} matches no host of {inventory}")
    try:
        limits.check_nofile(len(out), f"reading {len(out)} host(s) of {inventory}")
    except limits.LimitError as e:
        raise FleetError(str(e)) from e
    return out


def _pyinfra_checked() -> None:
    """The pyinfra and paramiko internals the fleet's own connections rely on (pyinfra's SSH
    connector: refused when changed; paramiko's idle poll: its tuning off, with a warning)."""
    import logging

    from ..pyinfra_ext import compat
    from ..pyinfra_ext.connection import set_idle_poll

    res = compat.check({"connection", "idle_poll"})
    if res.refused:
        raise FleetError(res.refusal())
    set_idle_poll("idle_poll" not in res.off)
    for warning in res.warnings():
        logging.getLogger("pyinfra").warning(warning)


def run(fh: FleetHost, command: str, timeout: float = 60) -> tuple[bool, str]:
    """Run ``command`` on the host over pyinfra's own SSH connector (the inventory's user, key,
    host-key policy and sudo). Returns (exit status 0, stdout+stderr)."""
    h = fh.pyinfra_host
    if not h.connected:
        h.connect(reason="tritonfleet", show_errors=False, raise_exceptions=True)
    ok, out = h.run_shell_command(command, _timeout=timeout, _sudo=bool(fh.get("_sudo")),
                                  print_output=False, print_input=False)
    return ok, "\n".join(out.stdout_lines + out.stderr_lines)


def _workers(value: Any) -> int:
    try:
        return whole_number(value, "fleet_parallel")
    except ValueError as e:
        raise FleetError(str(e)) from None


def disconnect(fh: FleetHost) -> None:
    h = fh.pyinfra_host
    if h is not None and h.connected:
        try:
            h.disconnect()
        except CONNECTION_ERRORS:  # closing a dead connection is not an error
            pass


def parallel(hosts: list[FleetHost], fn: Callable[[FleetHost], T], workers: int | None = None) -> list[T]:
    """``fn(host)`` for every host at once, at most ``workers`` (default: the first host's
    ``fleet_parallel``) at a time, results in host order."""
    if not hosts:
        return []
    if workers is None:
        workers = _workers(hosts[0].get("fleet_parallel", DEFAULTS["fleet_parallel"]))
    with ThreadPoolExecutor(max_workers=min(workers, len(hosts))) as pool:
        return list(pool.map(fn, hosts))
