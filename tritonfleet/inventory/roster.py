"""The fleet as the control machine sees it: an inventory loaded the way ``pyinfra`` loads it
(group data, precedence, host order), and SSH commands run on many hosts at once.

Used by the fleet commands (rollout, status, prometheus, tune); the deploys themselves run
through pyinfra.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import logging
import os
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pyinfra.api import Config, State
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_config, ctx_state

from ..core import open_files
from ..core.connection_errors import CONNECTION_ERRORS
from ..core.errors import TritonfleetError, UsageError
from ..gpu.rules import GPU_CLASSES

# the model origin stores fill the table the settings check reads model_origin's URL rules from
from ..model_repo import origin as _origin_stores  # noqa: F401
from ..pyinfra_ext import compat
from ..pyinfra_ext.connection import quiet_relaxed_host_keys, set_idle_poll, tune_state
from ..settings import check as settings_check
from ..settings import mirrored
from ..settings.defaults import DEFAULTS
from ..settings.table import whole_number

T = TypeVar("T")


class FleetError(TritonfleetError, RuntimeError):
    """A fleet command could not do its work (exit status 1)."""


class InventoryError(FleetError, UsageError):
    """The inventory, its group data, --data or --limit cannot be used as given (exit status 2)."""


#: What running an inventory or group data file (Python, the operator's own) can raise for a
#: mistake in it: named here so the mistake is reported as one line naming the file and line,
#: never as a traceback. pyinfra's own inventory errors are added in load_inventory.
FILE_ERRORS = (
    SyntaxError,
    NameError,
    ImportError,
    AttributeError,
    TypeError,
    ValueError,
    LookupError,
    ArithmeticError,
    AssertionError,
    OSError,
    RecursionError,
)

#: Imports that make a file a deploy (steps, operations), not an inventory.
DEPLOY_MODULES = (
    "pyinfra.operations",
    "tritonfleet.steps",
    "tritonfleet.preflight",
    "tritonfleet.pyinfra_ext.install",
    "pyinfra.api.deploy",
)


def deploy_imports(path: str | os.PathLike) -> list[str]:
    """The modules of steps or operations that the Python file ``path`` imports (a deploy file
    does; an inventory does not). Raises InventoryError for a file that is not Python."""
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=str(path))
    except SyntaxError as e:
        raise InventoryError(
            f"{path}:{e.lineno or '?'}: {e.msg}: not a Python file pyinfra can read "
            "(fix the line, or give another file)"
        ) from None
    except (OSError, ValueError) as e:
        raise InventoryError(f"{path}: cannot be read: {e}") from None
    found = []
    for node in tree.body:
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [f"{node.module}"] + [f"{node.module}.{a.name}" for a in node.names]
            if isinstance(node, ast.ImportFrom) and node.module
            else []
        )
        for name in names:
            if name.startswith(DEPLOY_MODULES) and name not in found:
                found.append(name)
    return found


def check_deploy_file(deploy: str | os.PathLike) -> None:
    """A deploy file that is not there is refused before anything runs, naming the directory it
    was looked for in (a command run from outside the repository), not left to pyinfra (whose
    "No deploy file" ends as hosts that failed)."""
    path = Path(deploy)
    if not path.is_file():
        raise InventoryError(
            f"deploy {deploy} not found in {Path.cwd()}"
            + (
                " (a directory: give the deploy file in it, e.g. deploys/triton.py)"
                if path.is_dir()
                else ": run tritonfleet from the repository's root, or give the deploy's path"
            )
        )


def looks_like_inventory(path: str | os.PathLike) -> bool:
    """Whether the Python file ``path`` reads as an inventory: it assigns a list (a host group)
    at its top level to a name pyinfra takes as a group, and imports no steps or operations."""
    if deploy_imports(path):
        return False
    tree = ast.parse(Path(path).read_bytes(), filename=str(path))  # deploy_imports parsed it
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.ListComp, ast.Tuple)):
            if any(isinstance(t, ast.Name) and not t.id.startswith("_") for t in node.targets):
                return True
    return False


def _file_error(filename: str, e: BaseException) -> str:
    """One line for a mistake in the inventory or a group data file: file:line, the error."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}: {type(e).__name__}: {e.msg}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == filename]
    where = f"{filename}:{frames[-1].lineno}" if frames else filename
    return f"{where}: {type(e).__name__}: {e}"


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
    state = State()
    state.config = Config()
    ctx_state.set(state)
    ctx_config.set(state.config)
    return state


def load_inventory(
    inventory: str | os.PathLike, data: dict | None = None, limit: Iterable[str] | None = None
) -> list[FleetHost]:
    """Hosts of ``inventory`` in inventory order, with the data pyinfra would give them
    (``data`` plays the part of ``--data``) over the package's defaults (tritonfleet/settings/defaults.py,
    the lowest layer, as tritonfleet.settings.access reads them in a deploy; pyinfra's own connection
    settings among them, such as the host-key policy, apply to this module's connections too).
    ``limit``: host or group names (globs allowed). Every setting of the hosts ``limit`` selects
    is checked (tritonfleet.settings.check); a mistake in the inventory, its group data, --data or
    --limit raises InventoryError or SettingsError (exit status 2), naming the file and line."""
    from pyinfra_cli.exceptions import CliError, UnexpectedExternalError
    from pyinfra_cli.inventory import make_inventory

    path = Path(inventory)
    if not path.is_file():
        raise InventoryError(
            f"inventory {inventory} not found"
            + (" (a directory: give the inventory file in it, e.g. inventories/prod.py)" if path.is_dir() else "")
        )
    steps = deploy_imports(path)
    if steps:
        raise InventoryError(
            f"{inventory} is a deploy file, not an inventory (it imports {steps[0]}): give the "
            "inventory (e.g. inventories/prod.py) here, and the deploy where the command "
            "takes one (tritonfleet rollout INVENTORY DEPLOY)"
        )
    state = _state()
    quiet_relaxed_host_keys()  # this command's own connections (tritonfleet.pyinfra_ext.connection)
    _pyinfra_checked()
    try:
        inv = make_inventory(str(path), override_data=data or None, cwd=os.getcwd())
    except SystemExit as e:  # an inventory may refuse to load (e.g. no testbed running)
        raise InventoryError(f"inventory {inventory}: {e}") from e
    except UnexpectedExternalError as e:  # a mistake in the inventory or a group data file (pyinfra's wrapper)
        raise InventoryError(f"inventory {inventory}: {_file_error(e.filename, e.exception)}") from None
    except (PyinfraError, CliError) as e:
        raise InventoryError(f"inventory {inventory}: {e}") from None
    except FILE_ERRORS as e:  # compiling them: syntax errors are not wrapped
        raise InventoryError(f"inventory {inventory}: {_file_error(str(inventory), e)}") from None
    if not len(inv):
        raise InventoryError(
            f"inventory {inventory} has no hosts: a group is a list of host names or "
            '(name, data) pairs, e.g. t4 = [("triton-t4-01", {"ssh_hostname": "10.0.0.11"})]'
        )
    check_groups(inv, str(inventory))
    targets = select(list(inv), limit, str(inventory))
    settings_check.check_hosts(
        targets, settings_check.ValueSources(inv, str(inventory), settings_check.group_dirs(str(path))), GPU_CLASSES
    )
    inv.data = {**copy.deepcopy(DEFAULTS), **(inv.data or {})}
    state.init(inv, state.config)
    tune_state(state)  # TCP_NODELAY on every connection run() opens (tritonfleet.pyinfra_ext.connection)
    own = path.stem
    out = []
    for h in targets:
        groups = [g for g in h.groups if g != own]
        out.append(FleetHost(h.name, groups, mirrored.apply(dict(h.data.dict())), h))
    try:
        open_files.check_nofile(len(out), f"reading {len(out)} host(s) of {inventory}")
    except open_files.LimitError as e:
        raise FleetError(str(e)) from e
    return out


def check_groups(inv, inventory: str) -> None:
    """A host listed twice in one group (pyinfra would keep the later entry's data, silently), or
    in groups whose data set different GPU classes (its class would be whichever group pyinfra
    merges last) is refused at load, naming the groups; the host's own data may settle the class."""
    problems = []
    for h in inv:
        # (pyinfra lists a connector host's groups twice, "@local" among them: not the operator's doing)
        twice = sorted({g for g in h.groups if h.groups.count(g) > 1}) if not h.name.startswith("@") else []
        if twice:
            problems.append(
                f"{h.name} is listed more than once in group {', '.join(twice)}: list it once (its data in one entry)"
            )
        if "gpu_class" in (inv.get_host_data(h.name) or {}):
            continue
        classes: dict[str, list[str]] = {}
        for g in dict.fromkeys(h.groups):
            value = (inv.get_group_data(g) or {}).get("gpu_class")
            if value is not None:
                classes.setdefault(str(value).upper(), []).append(g)
        if len(classes) > 1:
            shown = "; ".join(f"{', '.join(gs)}: gpu_class {c!r}" for c, gs in classes.items())
            problems.append(
                f"{h.name} is in groups with different GPU classes ({shown}): keep it in one of them, "
                "or set gpu_class in its own data"
            )
    problems += _conflicting_entries(inventory)
    if problems:
        raise InventoryError(f"inventory {inventory}: " + "; ".join(problems))


def _conflicting_entries(inventory: str) -> list[str]:
    """Hosts written twice, in groups of literal (name, data) entries, with a key set to two
    values: pyinfra merges the entries and one value wins, silently. Groups the file computes
    (comprehensions, calls) are not read here: running the operator's code again is not worth it."""
    try:
        tree = ast.parse(Path(inventory).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    seen: dict[str, list[tuple[str, dict]]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        group, value = node.targets[0].id, node.value
        if isinstance(value, ast.Tuple) and len(value.elts) == 2:  # (hosts, group data)
            value = value.elts[0]
        if group.startswith("_") or not isinstance(value, (ast.List, ast.Tuple)):
            continue
        for elt in value.elts:
            try:
                entry = ast.literal_eval(elt)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if (
                isinstance(entry, tuple)
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], dict)
            ):
                seen.setdefault(entry[0], []).append((group, entry[1]))
    out = []
    for name, entries in seen.items():
        for i, (g1, d1) in enumerate(entries):
            clash = next(
                ((g2, k, d2[k]) for g2, d2 in entries[i + 1 :] for k in d1 if g2 != g1 and k in d2 and d1[k] != d2[k]),
                None,
            )
            if clash:
                g2, key, other = clash
                out.append(
                    f"{name} is listed in groups {g1} and {g2} with different {key} ({d1[key]!r} and "
                    f"{other!r}): give its data in one entry"
                )
                break
    return out


def select(hosts: list, limit: Iterable[str] | None, inventory: str) -> list:
    """The pyinfra hosts ``limit`` (host or group names, globs; comma-separated too) selects."""
    if not limit:
        return hosts
    patterns = [p for item in limit for p in str(item).split(",") if p]
    out = [
        h
        for h in hosts
        if any(fnmatch.fnmatch(h.name, p) or any(fnmatch.fnmatch(g, p) for g in h.groups) for p in patterns)
    ]
    if not out:
        raise InventoryError(f"--limit {','.join(patterns)} matches no host of {inventory}")
    return out


def _pyinfra_checked() -> None:
    """The pyinfra and paramiko internals the fleet's own inventory and connections rely on
    (pyinfra's inventory loader, its context and SSH connector: refused when changed; paramiko's
    idle poll: its tuning off, with a warning)."""

    res = compat.check({"connection", "idle_poll", "inventory", "context"})
    if res.refused:
        raise FleetError(res.refusal())
    set_idle_poll("idle_poll" not in res.off)
    for warning in res.warnings():
        logging.getLogger("pyinfra").warning(warning)


def run(fh: FleetHost, command: str, timeout: float = 60) -> tuple[bool, str]:
    """Run ``command`` on the host over pyinfra's own SSH connector (the inventory's user, key,
    host-key policy and sudo). Returns (exit status 0, stdout+stderr)."""
    h = fh.pyinfra_host
    stale = h.connected  # a connection from before: the host may have rebooted since (a driver change)
    if not h.connected:
        h.connect(reason="tritonfleet", show_errors=False, raise_exceptions=True)
    try:
        ok, out = h.run_shell_command(
            command, _timeout=timeout, _sudo=bool(fh.get("_sudo")), print_output=False, print_input=False
        )
    except CONNECTION_ERRORS:
        if not stale:
            raise
        disconnect(fh)  # that connection died with the host's reboot: one new one, once
        h.connect(reason="tritonfleet", show_errors=False, raise_exceptions=True)
        ok, out = h.run_shell_command(
            command, _timeout=timeout, _sudo=bool(fh.get("_sudo")), print_output=False, print_input=False
        )
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
