"""Every pyinfra (and paramiko) internal tritonfleet relies on, in one list, checked at run time.

tritonfleet patches or leans on parts of pyinfra that are not its public API (wherever in the
package they are used: tests/unit/pyinfra_ext/test_internals.py fails on one not listed here): the operation order,
the global-argument list, the Ctrl-C handler, state callbacks, the inner generators of three
operations, its CLI's ``--data`` parser and ``--dry`` flag, its JSON results, paramiko's idle poll.
Each is listed in :data:`INTERNALS` with the tritonfleet feature it serves (:data:`FEATURES`) and
what tritonfleet assumes of it. :data:`RECORD` (``internals.json`` next to this module) holds the
sha256 of each one's source in every pyinfra release it was checked against, and the sha256 of
each module file that holds one.

:func:`check` compares the installed pyinfra with that record (a module file whose bytes are a
checked release's holds checked internals; only a file that differs has its internals' sources
read: bench/pyinfra_compat.py measures it). ``pyinfra_patches.install()`` runs it before
it changes anything:

* a **speed-only** feature (the faster operation order, the cached global arguments, paramiko's
  slower idle poll, jinja2's bytecode read back; all of them: tritonfleet.core.speed) whose internal differs is switched off for the run, with a warning naming the
  internal and the pyinfra version: the run gives the same result, using more CPU;
* a **behaviour** feature (Ctrl-C's exit status, the deploy lock's ``--dry`` test, the facts'
  memo and its callbacks, the converged operations, the failure reports, the ``--data`` parser,
  the rollout's reading of pyinfra's JSON, the fleet commands' inventory loader, pyinfra's
  context objects, the reboot's askpass file) whose internal differs refuses the run before any host
  is changed, naming the internal, the pyinfra version and the releases it was checked against.

A pyinfra release that is not in the record therefore runs only when everything tritonfleet relies
on is unchanged (then it is the checked code) or with the speed patches off. To add a release:
re-check the internals :func:`check` names against it, then record it with
``.venv/bin/python -m tritonfleet.pyinfra_ext.compat --record`` (in an environment that has it
installed; tests/unit/pyinfra_ext/test_releases.py installs every release pyproject.toml allows) and
widen the pin in pyproject.toml.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..core.errors import TritonfleetError
from . import probes

RECORD = Path(__file__).with_name("internals.json")

SPEED, BEHAVIOUR = "speed", "behaviour"

#: feature -> (kind, what it is); a feature is off (speed) or refused (behaviour) when any of its
#: internals differs
FEATURES: dict[str, tuple[str, str]] = {
    "oporder": (SPEED, "the operation order read from frames (tritonfleet.pyinfra_ext.oporder)"),
    "argcache": (SPEED, "pyinfra's global-argument list computed once a run (tritonfleet.pyinfra_ext.argcache)"),
    "idle_poll": (SPEED, "paramiko's idle poll every 1 s instead of 0.1 s (tritonfleet.pyinfra_ext.connection)"),
    "lock_early": (
        SPEED,
        "the deploy lock taken while the deploy's steps load, pyinfra's first command to a "
        "host waiting for it (tritonfleet.pyinfra_ext.hostlock; off: install() waits for it)",
    ),
    "connect_early": (
        SPEED,
        "as pyinfra connects, from a repository's config.py: the deploy lock's holders started, "
        "TCP_NODELAY before the handshake (tritonfleet.pyinfra_ext.connecting; off: install() "
        "starts the holders, TCP_NODELAY is set after the handshake)",
    ),
    "jinja_bytecode": (
        SPEED,
        "the unit template's compiled code kept between runs in jinja2's bytecode "
        "cache, read without unpickling (tritonfleet.serving.unit)",
    ),
    "interrupt": (BEHAVIOUR, "Ctrl-C exits with status 130 (tritonfleet.pyinfra_ext.interrupt)"),
    "dry_flag": (
        BEHAVIOUR,
        "the deploy lock is taken unless pyinfra's --dry is given (tritonfleet.pyinfra_ext.hostlock)",
    ),
    "connection": (
        BEHAVIOUR,
        "dead-link bounds and TCP settings on pyinfra's SSH connections, the deploy "
        "lock's and the tunnels' use of them (tritonfleet.pyinfra_ext.connection, hostlock, "
        "tritonfleet.serving.triton_http)",
    ),
    "memo": (
        BEHAVIOUR,
        "facts read in batches and remembered, forgotten when an operation changes the "
        "host (tritonfleet.pyinfra_ext.memo)",
    ),
    "failure": (BEHAVIOUR, "a failure report for every failed host (tritonfleet.core.report)"),
    "converged": (
        BEHAVIOUR,
        "files, packages and services compared before pyinfra's operations run (tritonfleet.host.ops.converged)",
    ),
    "stream": (BEHAVIOUR, "the model transfer on the operation's connection (tritonfleet.pyinfra_ext.stream)"),
    "cli_args": (BEHAVIOUR, "--data values parsed as pyinfra parses them (tritonfleet.cli.fleet)"),
    "rollout_json": (
        BEHAVIOUR,
        "the rollout's and a self-converging host's reading of `pyinfra -y --json` "
        "(tritonfleet.fleet.rollout, tritonfleet.fleet.pull.host_run)",
    ),
    "self_connector": (
        BEHAVIOUR,
        "a self-converging host's run through pyinfra's local connector under its own "
        "inventory name (tritonfleet.pyinfra_ext.self_connector)",
    ),
    "inventory": (
        BEHAVIOUR,
        "the fleet commands load an inventory as pyinfra's command line does: its hosts, "
        "groups, data and errors (tritonfleet.inventory.roster)",
    ),
    "context": (
        BEHAVIOUR,
        "pyinfra's current state, host and config (pyinfra.context) read and set outside an "
        "operation: the failure reports, pre-flight, the fleet commands' own State, the "
        "connection tuning, the deploy lock and the patches' install",
    ),
    "reboot": (
        BEHAVIOUR,
        "the reboot operation forgets the host's sudo askpass file, which the reboot removes, "
        "as pyinfra's own server.reboot does (tritonfleet.host.ops.reboot)",
    ),
}


@dataclass(frozen=True)
class Internal:
    """``name``: ``module:attribute.path``. Checked by the sha256 of its source (recorded per
    release), or, where ``probe`` is given, by that: it returns what differs ("" when nothing)."""

    name: str
    feature: str
    assumes: str
    probe: Callable[[object], str] | None = field(default=None, compare=False)

    @property
    def package(self) -> str:
        top = self.name.split(":", 1)[0].split(".", 1)[0]
        return "pyinfra" if top == "pyinfra_cli" else top


INTERNALS: tuple[Internal, ...] = (
    Internal(
        "pyinfra.api.util:get_operation_order_from_stack",
        "oporder",
        "tritonfleet/pyinfra_ext/oporder.py computes the same line numbers from frames (deploy file, "
        "current_op_file_number in CLI mode, frames outside PYINFRA_INSTALL_DIR)",
    ),
    Internal(
        "pyinfra.api.operation:solve_operation_consistency",
        "oporder",
        "tritonfleet/pyinfra_ext/oporder.py replaces get_operation_order_from_stack in pyinfra.api.operation's "
        "namespace, where solve_operation_consistency looks it up in CLI mode",
    ),
    Internal(
        "pyinfra.api.arguments:all_global_arguments",
        "argcache",
        "argcache.py caches its answer for the run: it must depend on nothing but pyinfra's classes",
    ),
    Internal(
        "pyinfra.api.arguments:pop_global_arguments",
        "argcache",
        "tritonfleet/pyinfra_ext/argcache.py replaces all_global_arguments in pyinfra.api.arguments' "
        "namespace, where this "
        "looks it up on every call",
    ),
    Internal(
        "pyinfra.api.facts:FactBase.__init_subclass__",
        "argcache",
        "tritonfleet/pyinfra_ext/argcache.py replaces all_global_arguments in pyinfra.api.facts' "
        "namespace, where this looks "
        "it up for every fact class",
    ),
    Internal(
        "paramiko.transport:Transport",
        "idle_poll",
        "tritonfleet/pyinfra_ext/connection.py raises a tuned connection's socket timeout from "
        "_active_check_timeout to 1 s",
        probe=probes.paramiko_idle_poll,
    ),
    Internal(
        "pyinfra.api.host:Host",
        "lock_early",
        "tritonfleet/pyinfra_ext/hostlock.py gate_host_io: every command, upload, download and rsync of a run "
        "goes through Host.run_shell_command, put_file, get_file and rsync",
        probe=probes.host_io_only,
    ),
    Internal(
        "pyinfra.api.host:Host.connect",
        "connect_early",
        "tritonfleet/pyinfra_ext/connecting.py starts the holders from host_before_connect and ends "
        "a host's from host_connect_error",
        probe=probes.calls_before_connect,
    ),
    Internal(
        "pyinfra.api.connect:connect_all",
        "connect_early",
        "tritonfleet/pyinfra_ext/connecting.py starts the holders of the hosts connect_all connects",
        probe=probes.connects_limit,
    ),
    Internal(
        "pyinfra_cli.cli:_main",
        "connect_early",
        "tritonfleet/pyinfra_ext/connecting.py adds its callback right after the State's init, "
        "which the command calls after config.py and before it connects",
        probe=probes.inits_then_connects,
    ),
    Internal(
        "paramiko.client:SSHClient.connect",
        "connect_early",
        "tritonfleet/pyinfra_ext/connection.py nodelay_from_handshake: paramiko's connect builds its "
        "transport with the transport_factory it is given",
        probe=probes.takes_transport_factory,
    ),
    Internal(
        "pyinfra.connectors.ssh:SSHConnector._connect",
        "connect_early",
        "tritonfleet/pyinfra_ext/connection.py nodelay_from_handshake: the connector's connect passes "
        "what its make_paramiko_kwargs returns to its client's connect",
        probe=probes.connects_with_own_kwargs,
    ),
    Internal(
        "pyinfra.connectors.sshuserclient.client:SSHClient.connect",
        "connect_early",
        "tritonfleet/pyinfra_ext/connection.py nodelay_from_handshake: pyinfra's SSH client hands its "
        "keyword arguments on to paramiko's connect",
        probe=probes.hands_kwargs_on,
    ),
    Internal(
        "pyinfra_cli.cli:cli",
        "connect_early",
        "tritonfleet/pyinfra_ext/connecting.py reads the deploy files from the command's operations",
        probe=probes.has_operations,
    ),
    Internal(
        "jinja2.bccache:Bucket",
        "jinja_bytecode",
        "tritonfleet/serving/unit.py _bytecode_cache reads an entry as bc_magic, the checksum pickled "
        "with protocol 2, the code marshalled",
        probe=probes.jinja_bytecode_format,
    ),
    Internal(
        "pyinfra_cli.main:main",
        "interrupt",
        "tritonfleet/pyinfra_ext/interrupt.py: pyinfra installs its SIGINT handler (exits 0) before it loads the "
        "deploy code, so the handler installed then (exit 130) is the one in force",
    ),
    Internal(
        "pyinfra_cli.cli:cli",
        "dry_flag",
        "tritonfleet/pyinfra_ext/hostlock.py: enabled() takes no lock when `--dry` is in sys.argv: pyinfra's flag for a run that "
        "executes nothing",
        probe=probes.has_dry_flag,
    ),
    Internal(
        "pyinfra_cli.cli:_main",
        "dry_flag",
        "tritonfleet/pyinfra_ext/hostlock.py: enabled(): a run given --dry executes no operation (print_run_json(dry=True), exit)",
    ),
    Internal(
        "pyinfra.connectors.ssh:SSHConnector.connect",
        "connection",
        "tritonfleet/pyinfra_ext/connection.py, transfer.py and hostlock.py, tritonfleet/inventory/roster.py "
        "(the fleet commands' tunnels: metrics, load test, performance gate), fleet/rollout/engine.py and "
        "serving/health.py (the gate's tunnels, tritonfleet/core/tunnel.py): connector.client is a "
        "paramiko SSHClient whose transport's socket is the TCP socket",
    ),
    Internal(
        "pyinfra.api.state:BaseStateCallback",
        "memo",
        "tritonfleet/pyinfra_ext/memo.py, pyinfra_ext/connection.py and core/report.py: host_connect, "
        "operation_host_start(state, host, "
        "op_hash) and operation_host_error(state, host, op_hash, ...) are called with these arguments",
    ),
    Internal(
        "pyinfra.api.state:State.add_callback_handler",
        "memo",
        "tritonfleet/pyinfra_ext/memo.py, pyinfra_ext/connection.py, core/report.py register callbacks",
    ),
    Internal(
        "pyinfra.api.state:State.get_op_meta",
        "memo",
        "tritonfleet/pyinfra_ext/memo.py and core/report.py read .names of an operation",
    ),
    Internal(
        "pyinfra.api.state:State.get_op_data_for_host",
        "memo",
        "tritonfleet/pyinfra_ext/memo.py and core/report.py read .operation_meta",
    ),
    Internal(
        "pyinfra.api.operation:OperationMeta",
        "memo",
        "tritonfleet/pyinfra_ext/memo.py (is_complete, did_succeed, did_change), pyinfra_ext/check.py "
        "(will_change), core/report.py "
        "(stderr_lines, stdout_lines of a failed operation, complete once the run ends)",
    ),
    Internal(
        "pyinfra.api.facts:FactBase.requires_command",
        "memo",
        "tritonfleet/pyinfra_ext/memo.py prefetch leaves facts with a required command to pyinfra",
    ),
    Internal("pyinfra.api.host:Host.get_fact", "memo", "tritonfleet/pyinfra_ext/memo.py reads facts through it"),
    Internal(
        "pyinfra.api.operations:run_host_op",
        "failure",
        "tritonfleet/core/report.py: a FunctionCommand's False fails the host; an exception it raises is printed with "
        "its traceback and fails the host (a bug, said as one)",
    ),
    Internal(
        "pyinfra.operations.files:put._inner",
        "converged",
        "tritonfleet/host/ops/converged.py put() hands src, dest, user, group, mode and the rest to it",
    ),
    Internal(
        "pyinfra.operations.files:put._inner",
        "converged",
        "its parameters",
        probe=probes.inner_takes("src", "dest", "user", "group", "mode"),
    ),
    Internal(
        "pyinfra.operations.apt:packages._inner",
        "converged",
        "tritonfleet/host/ops/converged.py packages() hands packages, present, latest, update, upgrade to it "
        "and wraps each command it yields (strings) for the apt lock",
    ),
    Internal(
        "pyinfra.operations.apt:packages._inner",
        "converged",
        "its parameters",
        probe=probes.inner_takes("packages", "present", "latest", "update", "upgrade"),
    ),
    Internal(
        "pyinfra.operations.systemd:service._inner",
        "converged",
        "tritonfleet/host/ops/converged.py service() hands service, running, enabled, restarted to it",
    ),
    Internal(
        "pyinfra.operations.systemd:service._inner",
        "converged",
        "its parameters",
        probe=probes.inner_takes("service", "running", "enabled", "restarted"),
    ),
    Internal(
        "pyinfra.api.arguments:ConnectorArguments",
        "stream",
        "tritonfleet/pyinfra_ext/stream.py passes the connector arguments of the current operation on",
    ),
    Internal(
        "pyinfra.api.arguments:CONNECTOR_ARGUMENT_KEYS",
        "stream",
        "tritonfleet/pyinfra_ext/stream.py wrapped(): the current operation's global arguments that are "
        "connector arguments, by name",
        probe=probes.argument_names,
    ),
    Internal(
        "pyinfra.connectors.util:make_unix_command",
        "stream",
        "tritonfleet/pyinfra_ext/stream.py wrapped(): its keyword parameters are the arguments it takes",
    ),
    Internal(
        "pyinfra.connectors.util:make_unix_command_for_host",
        "stream",
        "tritonfleet/pyinfra_ext/stream.py wrapped(): (state, host, command, **connector arguments) -> the "
        "command as pyinfra would run it (sudo, su, env, shell)",
    ),
    Internal(
        "pyinfra_cli.util:parse_cli_arg",
        "cli_args",
        "tritonfleet/cli/fleet.py parses `--data key=value` with it, so status and rollout read the values the "
        "pyinfra runs they start read",
    ),
    Internal(
        "pyinfra_cli.prints:build_results_json",
        "rollout_json",
        "tritonfleet/fleet/runner/pyinfra_run.py reads `-y --json`: results.operations[] (name, success, error, no_change) and "
        "results.failed_hosts; tritonfleet/fleet/pull/host_run.py reads results.operations[] (name, success)",
    ),
    Internal(
        "pyinfra.connectors.local:LocalConnector",
        "self_connector",
        "tritonfleet/pyinfra_ext/self_connector.py subclasses it and overrides only the static "
        "make_names_data(name) (yielding (name, data, groups)): the rest runs commands on this machine as @local",
    ),
    Internal(
        "pyinfra.api.connectors:get_all_connectors",
        "self_connector",
        "tritonfleet/pyinfra_ext/self_connector.py is found through the `pyinfra.connectors` entry point group "
        "(pyproject.toml), by the entry point's name",
    ),
    Internal(
        "pyinfra.api.inventory:Inventory.make_hosts_and_groups",
        "self_connector",
        "`@tritonfleet-self/<name>` in an inventory: the connector named before the slash gets the rest as "
        "make_names_data's argument, and the host takes the name it yields",
    ),
    Internal(
        "pyinfra_cli.inventory:make_inventory",
        "inventory",
        "tritonfleet/inventory/roster.py load_inventory: make_inventory(path, override_data=, cwd=) returns the "
        "Inventory pyinfra's command line would run (group data files, precedence, host order)",
    ),
    Internal(
        "pyinfra_cli.exceptions:CliError",
        "inventory",
        "tritonfleet/inventory/roster.py: a mistake pyinfra's command line reports while it loads an inventory",
    ),
    Internal(
        "pyinfra_cli.exceptions:UnexpectedExternalError",
        "inventory",
        "tritonfleet/inventory/roster.py: an error raised by the inventory's or a group data file's own code, "
        "with .filename and .exception",
    ),
    Internal(
        "pyinfra.context:ContextManager",
        "context",
        "get/set/isset/use of the current state, host and config (the ctx_* objects below)",
    ),
    Internal(
        "pyinfra.context:ctx_state",
        "context",
        "tritonfleet/core/report.py, preflight.py, inventory/roster.py (its own State), pyinfra_ext/connection.py, "
        "hostlock.py and install.py read (or set) the current State",
        probe=probes.context_manager,
    ),
    Internal(
        "pyinfra.context:ctx_config",
        "context",
        "tritonfleet/core/report.py (a failure's rollback command under a copy of the config) and "
        "inventory/roster.py (its own Config)",
        probe=probes.context_manager,
    ),
    Internal(
        "pyinfra.context:ctx_host",
        "context",
        "tritonfleet/core/report.py: the rollback command built with the failed host as the current one",
        probe=probes.context_manager,
    ),
    Internal(
        "pyinfra.context:ContextObject",
        "context",
        "tritonfleet/core/report.py: a nested operation is handed pyinfra's host proxy, a ContextObject, "
        "whose real host is found through it",
    ),
    Internal(
        "pyinfra.context:ContextObject._get_module",
        "context",
        "the object behind pyinfra's host or state proxy: tritonfleet/core/report.py (the failed host), "
        "serving/ops/lb.py and gpu_guard.py (one run's State, as a key of what it already did)",
    ),
    Internal(
        "pyinfra.connectors.util:remove_any_sudo_askpass_file",
        "reboot",
        "tritonfleet/host/ops/reboot.py, before the reboot (as pyinfra's server.reboot): the askpass file "
        "is removed while the host is still reachable",
    ),
    Internal(
        "pyinfra.connectors.util:clear_askpass_cache",
        "reboot",
        "tritonfleet/host/ops/reboot.py, after the reboot (as pyinfra's server.reboot): the next sudo "
        "command uploads the askpass file again",
    ),
    Internal(
        "pyinfra.connectors.util:CommandOutput",
        "failure",
        "tritonfleet/host/ops/aptlock.py: a failed apt command returns (False, CommandOutput([])), as a "
        "connector's run_shell_command does, once its report holds apt's lines",
    ),
)


class PyinfraChanged(TritonfleetError):
    """An internal a behaviour feature relies on is not one tritonfleet was checked against."""


@dataclass
class InternalMismatch:
    internal: Internal
    why: str  # "its source differs", "it is gone (...)", or the probe's words

    @property
    def kind(self) -> str:
        return FEATURES[self.internal.feature][0]


@dataclass
class CheckResult:
    versions: dict[str, str]  # package -> installed version
    checked: dict[str, list[str]]  # package -> releases recorded
    mismatches: list[InternalMismatch]
    seconds: float = 0.0

    @property
    def off(self) -> set[str]:
        """The speed features switched off for this run."""
        return {m.internal.feature for m in self.mismatches if m.kind == SPEED}

    @property
    def refused(self) -> list[InternalMismatch]:
        return [m for m in self.mismatches if m.kind == BEHAVIOUR]

    def _release(self, package: str) -> str:
        have = self.versions.get(package) or _version(package)
        known = self.checked.get(package) or []
        return f"{package} {have}" + (
            "" if have in known else f" (tritonfleet was checked against {', '.join(known) or 'no release'})"
        )

    def warnings(self) -> list[str]:
        out = []
        for feature in sorted(self.off):
            ms = [m for m in self.mismatches if m.internal.feature == feature]
            out.append(
                f"tritonfleet: {self._release(ms[0].internal.package)}: "
                + "; ".join(f"{m.internal.name}: {m.why}" for m in ms)
                + f". The speed-only patch {feature} ({FEATURES[feature][1]}) is off for this run: "
                "the same result, more CPU on this machine"
            )
        return out

    def refusal(self) -> str:
        lines = [
            f"tritonfleet refuses to run with {self._release(self.refused[0].internal.package)}: what "
            "tritonfleet relies on changed there:"
        ]
        for m in self.refused:
            lines.append(
                f"  {m.internal.name}: {m.why} ({FEATURES[m.internal.feature][1]}; tritonfleet assumes: "
                f"{m.internal.assumes})"
            )
        known = self.checked.get("pyinfra") or []
        lines.append(
            "Install a pyinfra tritonfleet was checked against (pip install "
            + " or ".join(f"'pyinfra=={v}'" for v in known)
            + "), or a tritonfleet release that supports this one"
        )
        return "\n".join(lines)


def resolve(name: str):
    module, _, attrs = name.partition(":")
    obj = importlib.import_module(module)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


def source_hash(obj) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


def load_record(path: Path = RECORD) -> dict:
    return json.loads(path.read_text())


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def installed_versions() -> dict[str, str]:
    return {package: _version(package) for package in ("pyinfra", "paramiko")}


def _defined_in(obj, module: str) -> bool:
    """``obj`` is still the one its module's file defines (not a copy put there at run time)."""
    path = getattr(sys.modules.get(module), "__file__", None)
    obj = inspect.unwrap(obj) if callable(obj) else obj
    code = getattr(obj, "__code__", None)
    if code is not None:
        return path is not None and code.co_filename == path
    return getattr(obj, "__module__", None) == module


def file_hash(module: str) -> str:
    """sha256 of the file a module was imported from ("" when it has none)."""
    path = getattr(importlib.import_module(module), "__file__", None)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""


def check(features: set[str] | None = None, record: dict | None = None) -> CheckResult:
    """The installed pyinfra against the record: every internal of ``features`` (None: all)."""
    t0 = time.perf_counter()
    record = load_record() if record is None else record
    sources: dict[str, list[str]] = record.get("sources", {})
    files: dict[str, list[str]] = record.get("files", {})
    same_file: dict[str, bool] = {}
    mismatches = []
    for internal in INTERNALS:
        if features is not None and internal.feature not in features:
            continue
        try:
            obj = resolve(internal.name)
        except (ImportError, AttributeError) as e:
            mismatches.append(InternalMismatch(internal, f"it is gone ({type(e).__name__}: {e})"))
            continue
        module = internal.name.split(":", 1)[0]
        if module not in same_file:
            try:
                same_file[module] = file_hash(module) in files.get(module, [])
            except OSError:
                same_file[module] = False
        if same_file[module] and _defined_in(obj, module):  # a checked release's bytes: checked internals
            continue
        try:
            if internal.probe is not None:
                why = internal.probe(obj)
            else:
                why = "" if source_hash(obj) in sources.get(internal.name, []) else "its source differs"
        except (OSError, TypeError) as e:  # no source to read (a compiled or generated object)
            why = f"its source cannot be read ({type(e).__name__}: {e})"
        if why:
            mismatches.append(InternalMismatch(internal, why))
    return CheckResult(installed_versions(), record.get("checked", {}), mismatches, time.perf_counter() - t0)


def ensure(*features: str) -> CheckResult:
    """Raise PyinfraChanged when an internal of a behaviour feature among ``features`` differs."""
    res = check(set(features))
    if res.refused:
        raise PyinfraChanged(res.refusal())
    return res


def current_record(base: dict | None = None) -> dict:
    """The record with the installed release and its hashes added (``--record``)."""
    out = {
        "checked": {k: list(v) for k, v in (base or {}).get("checked", {}).items()},
        "sources": {k: list(v) for k, v in (base or {}).get("sources", {}).items()},
        "files": {k: list(v) for k, v in (base or {}).get("files", {}).items()},
    }
    problems = check(record={"checked": {}, "sources": {}, "files": {}}).mismatches
    probed = [m for m in problems if m.internal.probe is not None or m.why != "its source differs"]
    if probed:
        raise PyinfraChanged("not recorded: " + "; ".join(f"{m.internal.name}: {m.why}" for m in probed))
    for package, v in installed_versions().items():
        releases = out["checked"].setdefault(package, [])
        if v not in releases:
            releases.append(v)
            releases.sort(key=lambda s: [int(p) if p.isdigit() else p for p in s.split(".")])
    for internal in INTERNALS:
        module = internal.name.split(":", 1)[0]
        h = file_hash(module)
        if h not in out["files"].setdefault(module, []):
            out["files"][module].append(h)
        if internal.probe is not None:
            continue
        hashes = out["sources"].setdefault(internal.name, [])
        h = source_hash(resolve(internal.name))
        if h not in hashes:
            hashes.append(h)
    return out


def main(argv: list[str]) -> int:
    if "--record" in argv:
        record = current_record(load_record() if RECORD.exists() else None)
        RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        print(f"recorded pyinfra {installed_versions()['pyinfra']} in {RECORD}")
        return 0
    res = check()
    print(
        json.dumps(
            {
                "versions": res.versions,
                "checked": res.checked,
                "seconds": round(res.seconds, 4),
                "off": sorted(res.off),
                "refused": [m.internal.name for m in res.refused],
                "mismatches": [[m.internal.name, m.why] for m in res.mismatches],
            },
            indent=1,
        )
    )
    return 1 if res.mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
