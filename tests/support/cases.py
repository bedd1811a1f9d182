"""Operations and facts tested from data files, the way pyinfra tests its own
(tests/operations/<module>.<op>/<case>.json, tests/facts/<module>.<Fact>/<case>.json).

An operation case, ``tests/unit/<domain>/op_cases/<module>.<op>/<case>.json`` (``<module>``: the
module's dotted path under ``tritonfleet.<domain>``, e.g. ``host/op_cases/ops.converged.put``)::

    {"doc": "what the case shows", "args": {...}, "content": "file text (an op's src)",
     "responses": {"a command's substring": ["its output lines"]},
     "state": {"module:dict": {key: value}}, "env": {"NAME": "value"}, "patch": {"module:name": ...},
     "dry": false, "commands": ["...", ...], "planned": ["..."], "uploads": {"remote path": "text"},
     "noop_description": "...", "failed": ["@fake/gpu1"], "raises": "Type: message"}

The operation runs once on pyinfra's @fake connector with ``-y`` (no change detection before
execution, so every fact is read where a real run reads it), or with ``"dry": true`` is only
planned (``pyinfra --dry``; its ``planned`` commands are listed).

- ``commands``: the exact shell commands the host received, fact reads included, in order; a
  Python callback the operation yields (``FunctionCommand``) is listed as
  ``python: <function>(<arguments>)`` and is not run (its own module tests it);
- ``uploads``: the files sent; ``failed``: the hosts that failed; ``raises``: the error the run
  stopped with (``"Type: message"``), where one does;
- ``noop_description``: what the operation said when it had nothing to do (null when it changed
  something).

Inputs besides ``args`` and ``responses``: an argument written ``{"$ref": "module:name"}`` is
that Python object; ``state`` sets, for the case only, entries of a module's per-host dict
(``"@host"``: the fake host's name); ``env`` sets environment variables on the control machine;
``patch`` replaces a module's attribute (``{"module:name": {"$ref": "tests.support.cases:yes"}}``),
only where the @fake host cannot be what the path needs (an SSH host).

A fact case, ``tests/unit/<domain>/fact_cases/<module>.<Fact>/<case>.json``::

    {"doc": "...", "args": {...}, "command": "...", "output": ["lines"], "fact": ...}

checks the fact's ``command`` given ``args`` exactly and that ``process(output)`` is ``fact``
(compared as JSON: tuples are lists, dataclasses dicts).

To write a new case, write it without ``commands`` (or ``command``/``fact``) and run
``python -m tests.support.cases <case.json> ...``: it prints the case completed with what the
operation or fact did (``--write``: into the file). Read every command before keeping it: the
file is what a reviewer reads.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import os
import pkgutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra.api import FactBase, FunctionCommand, deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.connectors.fake import FakeConnector
from pyinfra.context import ctx_host, ctx_state

import tritonfleet
from tests.support.fakehost import run_fake
from tritonfleet.core.errors import TritonfleetError

OPERATION_MODULE = importlib.import_module("pyinfra.api.operation")  # what @operation wraps with
UNIT = Path(__file__).resolve().parents[1] / "unit"
HOST = "@fake/gpu1"
# pyinfra's own lookup of the host's temporary directory (its TmpDir fact) is read or not
# depending on what earlier runs in this process left in pyinfra's context: not the operation's
TMPDIR_FACT = 'if [ -n "$TMPDIR" ]'
# every case's pyinfra State stays referenced: tables the package keys by id(state) (the drains
# planned in a run, tritonfleet.serving.ops.lb) never see its id again in a later test's run
_STATES: list = []
# files of the package that are not modules to import (they run as pyinfra reads them)
NOT_MODULES = {"tritonfleet.fleet.pull.local_inventory"}  # the inventory of `tritonfleet converge`


# --------------------------------------------------------------------------- finding cases

def case_files(kind: str, domain: str | None = None) -> list[Path]:
    """Every case file of ``kind`` ("op_cases" or "fact_cases"), of one domain or all."""
    root = UNIT / domain if domain else UNIT
    pattern = f"{kind}/*/*.json" if domain else f"*/{kind}/*/*.json"
    return sorted(root.glob(pattern))


def target_of(path: Path) -> str:
    """``tritonfleet.<domain>.<module>:<name>`` of a case file."""
    domain, target = path.parents[2].name, path.parent.name
    module, _, name = target.rpartition(".")
    return f"tritonfleet.{domain}.{module}:{name}"


def case_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _made_by(function: Any, module: Any) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and Path(code.co_filename) == Path(module.__file__)


@functools.cache
def package_targets() -> tuple[set[str], set[str]]:
    """(every operation, every fact class) the package defines, as ``module:name``, found by
    importing each of its modules: a new one without cases is seen."""
    ops, facts = set(), set()
    for info in pkgutil.walk_packages(tritonfleet.__path__, "tritonfleet."):
        if info.name in NOT_MODULES:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != info.name:
                continue
            if inspect.isclass(obj) and issubclass(obj, FactBase) and obj is not FactBase:
                facts.add(f"{info.name}:{name}")
            elif callable(obj) and hasattr(obj, "_inner") and _made_by(obj, OPERATION_MODULE):
                ops.add(f"{info.name}:{name}")
    return ops, facts


# --------------------------------------------------------------------------- operations

def _args(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$ref"}:
            return resolve(value["$ref"])
        return {k: _args(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_args(v) for v in value]
    return value


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def _command_text(command: Any) -> str:
    if isinstance(command, FunctionCommand):
        return _function_text(command)
    return command.get_masked_value() if hasattr(command, "get_masked_value") else str(command)


def _function_text(command: FunctionCommand) -> str:
    from tritonfleet.core.report import reported

    function, args, kwargs = command.function, list(command.args), dict(command.kwargs)
    if function is reported:  # the wrapper every check uses: name what it runs
        function, args, kwargs = args[0], list(args[1]), dict(args[2])
    shown = json.dumps([args, kwargs] if kwargs else args, default=_name, sort_keys=True)
    return f"python: {_name(function)}({shown[1:-1]})"


@contextmanager
def _recording(noops: list[str], connectors: list) -> Iterator[None]:
    """Python callbacks are listed in the host's commands instead of run; noops and the fake
    connectors made are kept."""
    execute, noop, init = FunctionCommand.execute, Host.noop, FakeConnector.__init__

    def record(self, state, host, connector_arguments):
        host.connector.executed_commands.append(_function_text(self))
        return True

    def keep(self, description):
        noops.append(description)
        return noop(self, description)

    def made(self, *args, **kwargs):
        init(self, *args, **kwargs)
        connectors.append(self)

    FunctionCommand.execute, Host.noop, FakeConnector.__init__ = record, keep, made  # type: ignore[method-assign]
    try:
        yield
    finally:
        FunctionCommand.execute, Host.noop, FakeConnector.__init__ = execute, noop, init  # type: ignore[method-assign]


def yes(*args: Any, **kwargs: Any) -> bool:
    """A stand-in that says yes (``"patch"``: e.g. the SSH test of a transfer on the @fake host)."""
    return True


@contextmanager
def _case_state(case: dict) -> Iterator[None]:
    patched = []
    for ref, value in case.get("patch", {}).items():
        module, _, name = ref.partition(":")
        owner = importlib.import_module(module)
        patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, _args(value))
    saved_env = {k: os.environ.get(k) for k in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    touched = []
    for ref, entries in case.get("state", {}).items():
        table = resolve(ref)
        for key, value in entries.items():
            key = HOST if key == "@host" else key
            touched.append((table, key))
            table[key] = value
    try:
        yield
    finally:
        for owner, name, value in patched:
            setattr(owner, name, value)
        for table, key in touched:
            table.pop(key, None)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_operation(path: Path, case: dict) -> dict:
    """What the operation of ``path`` did with ``case``: commands, uploads, noop_description and
    the hosts that failed."""
    op = resolve(target_of(path))
    args = _args(dict(case.get("args", {})))
    if "content" in case:
        args["src"] = StringIO(case["content"])

    @deploy(path.parent.name)
    def one():
        op(name=case.get("doc", path.parent.name), **args)

    noops: list[str] = []
    connectors: list[FakeConnector] = []
    dry, raised, planned, failed = bool(case.get("dry")), None, [], []
    with _case_state(case), _recording(noops, connectors):
        try:
            host, _, state = run_fake(one, case.get("responses", {}), yes=not dry, dry=dry)
        except (PyinfraError, TritonfleetError, OSError, ValueError, RuntimeError) as e:  # what pyinfra lets
            # through to its command line: the case names it
            raised = f"{type(e).__name__}: {e}"
        else:
            _STATES.append(state)
            failed = sorted(h.name for h in state.failed_hosts)
            with ctx_state.use(state), ctx_host.use(host):
                planned = [_command_text(c) for op_hash in state.get_op_order() if dry
                           for c in state.get_op_data_for_host(host, op_hash).command_generator()]
    connector = connectors[-1]
    return {
        "commands": [str(c) for c in connector.executed_commands if not str(c).startswith(TMPDIR_FACT)],
        "planned": planned,
        "uploads": dict(getattr(connector, "uploads", {})),
        "noop_description": noops[0] if noops else None,
        "failed": failed,
        "raises": raised,
    }


def check_operation(path: Path) -> None:
    case = json.loads(path.read_text())
    did = run_operation(path, case)
    where = f"{path.relative_to(UNIT)}: {case.get('doc')}"
    assert did["raises"] == case.get("raises"), where
    assert did["failed"] == case.get("failed", []), where
    assert did["commands"] == case["commands"], where
    assert did["planned"] == case.get("planned", []), where
    assert did["uploads"] == case.get("uploads", {}), where
    assert did["noop_description"] == case.get("noop_description"), where


# --------------------------------------------------------------------------- facts

def _plain(value: Any) -> Any:
    def default(o):
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return dataclasses.asdict(o)
        raise TypeError(type(o).__name__)

    return json.loads(json.dumps(value, default=default))


def run_fact(path: Path, case: dict) -> dict:
    fact = resolve(target_of(path))()
    args = case.get("args", {})
    command = fact.command(**args)
    command = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
    return {"command": command, "fact": _plain(fact.process(list(case.get("output", []))))}


def check_fact(path: Path) -> None:
    case = json.loads(path.read_text())
    did = run_fact(path, case)
    where = f"{path.relative_to(UNIT)}: {case.get('doc')}"
    assert did["command"] == case["command"], where
    assert did["fact"] == case["fact"], where


# --------------------------------------------------------------------------- writing a case

def completed(path: Path) -> dict:
    """The case of ``path`` with what its operation or fact did filled in."""
    case = json.loads(path.read_text())
    if path.parent.parent.name == "fact_cases":
        case.update(run_fact(path, case))
        return case
    did = run_operation(path, case)
    case["commands"] = did["commands"]
    for key in ("planned", "uploads", "failed", "raises"):
        if did[key]:
            case[key] = did[key]
        else:
            case.pop(key, None)
    case["noop_description"] = did["noop_description"]
    return case


if __name__ == "__main__":
    write = "--write" in sys.argv[1:]
    for name in (a for a in sys.argv[1:] if a != "--write"):
        text = json.dumps(completed(Path(name).resolve()), indent=1, ensure_ascii=False) + "\n"
        if write:
            Path(name).write_text(text)
        print(f"# {name}\n{text}")
