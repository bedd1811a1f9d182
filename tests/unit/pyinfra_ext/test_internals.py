"""pyinfra's internals that tritonfleet patches or relies on are the ones it was checked against.

tritonfleet replaces pyinfra's operation-order function (tritonfleet/pyinfra_ext/oporder.py) and its Ctrl-C
handler (interrupt.py) when a deploy file calls pyinfra_patches.install() (tests/unit/test_structure.py
checks that importing the steps alone changes nothing), hands work to the inner generators of three pyinfra operations
(ops/converged.py), watches operation results through state callbacks (facts/memo.py,
connection.py) and reaches paramiko through pyinfra's SSH connector. None of that is pyinfra's
public API, so pyproject.toml pins pyinfra to the minor version it was checked against, and this
test compares the source of every such piece with the hash recorded when it was checked
(tests/fixtures/pyinfra/internals.json). When pyinfra is upgraded and a hash differs, the
message names the piece and what to re-check in tritonfleet; after re-checking, record the new
hashes with `.venv/bin/python tests/unit/pyinfra_ext/test_internals.py --record` and widen the pin.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

RECORD = Path(__file__).parents[2] / "fixtures" / "pyinfra" / "internals.json"
PYPROJECT = Path(__file__).parents[3] / "pyproject.toml"

# dotted name (module:attribute path) -> what tritonfleet assumes of it, and where
INTERNALS = {
    "pyinfra.api.util:get_operation_order_from_stack":
        "tritonfleet/pyinfra_ext/oporder.py computes the same line numbers from frames (deploy file, "
        "current_op_file_number in CLI mode, frames outside PYINFRA_INSTALL_DIR)",
    "pyinfra.api.operation:solve_operation_consistency":
        "tritonfleet/pyinfra_ext/oporder.py replaces get_operation_order_from_stack in pyinfra.api.operation's "
        "namespace, where solve_operation_consistency looks it up in CLI mode",
    "pyinfra_cli.main:main":
        "tritonfleet/pyinfra_ext/interrupt.py: pyinfra installs its SIGINT handler (exits 0) before it loads the "
        "deploy code, so the handler installed then (exit 130) is the one in force",
    "pyinfra.operations.files:put._inner":
        "tritonfleet/host/ops/converged.py put() hands src, dest, user, group, mode and the rest to it",
    "pyinfra.operations.apt:packages._inner":
        "tritonfleet/host/ops/converged.py packages() hands packages, present, latest, update, upgrade to it and "
        "wraps each command it yields (strings) for the apt lock",
    "pyinfra.operations.systemd:service._inner":
        "tritonfleet/host/ops/converged.py service() hands service, running, enabled, restarted to it",
    "pyinfra.api.state:BaseStateCallback":
        "facts/memo.py, connection.py and failure.py: host_connect, operation_host_start(state, host, "
        "op_hash) and operation_host_error(state, host, op_hash, ...) are called with these arguments",
    "pyinfra.api.state:State.add_callback_handler": "facts/memo.py, connection.py, failure.py register callbacks",
    "pyinfra.api.state:State.get_op_meta": "facts/memo.py and failure.py read .names of an operation",
    "pyinfra.api.state:State.get_op_data_for_host": "facts/memo.py and failure.py read .operation_meta",
    "pyinfra.api.operation:OperationMeta":
        "facts/memo.py (is_complete, did_succeed, did_change), ops/check.py (will_change), failure.py "
        "(stderr_lines, stdout_lines of a failed operation, complete once the run ends)",
    "pyinfra_cli.prints:build_results_json":
        "rollout.py reads `-y --json`: results.operations[] (name, success, error, no_change) and "
        "results.failed_hosts",
    "pyinfra.api.facts:FactBase.requires_command":
        "facts/memo.py prefetch leaves facts with a required command to pyinfra",
    "pyinfra.connectors.ssh:SSHConnector.connect":
        "connection.py, transfer.py, health.py, metrics.py, rollout.py: connector.client is a "
        "paramiko SSHClient whose transport's socket is the TCP socket",
    "pyinfra.api.arguments:ConnectorArguments":
        "ops/stream.py passes the connector arguments of the current operation on",
    "pyinfra.api.host:Host.get_fact": "facts/memo.py reads facts through it",
    "pyinfra.api.arguments:all_global_arguments":
        "argcache.py caches its answer for the run: it must depend on nothing but pyinfra's classes",
    "pyinfra.api.arguments:pop_global_arguments":
        "argcache.py replaces all_global_arguments in pyinfra.api.arguments' namespace, where this "
        "looks it up on every call",
}


def resolve(name: str):
    module, _, attrs = name.partition(":")
    obj = importlib.import_module(module)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


def source_hash(obj) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


def current() -> dict:
    return {"pyinfra": version("pyinfra"), "sources": {n: source_hash(resolve(n)) for n in INTERNALS}}


def test_pyinfra_is_pinned_to_the_checked_minor_version():
    recorded = json.loads(RECORD.read_text())["pyinfra"]
    major, minor = recorded.split(".")[:2]
    pin = re.search(r'"pyinfra([^"]*)"', PYPROJECT.read_text()).group(1)
    assert pin == f">={major}.{minor},<{major}.{int(minor) + 1}", (
        f"pyproject.toml pins pyinfra{pin}, but the patched internals were checked against pyinfra "
        f"{recorded} (tests/fixtures/pyinfra/internals.json): pin pyinfra>={major}.{minor},<{major}.{int(minor) + 1}")
    assert version("pyinfra").split(".")[:2] == [major, minor], (
        f"pyinfra {version('pyinfra')} is installed, the patched internals were checked against {recorded}: "
        "install from requirements.lock (bash scripts/setup)")


@pytest.mark.parametrize("name", list(INTERNALS))
def test_patched_pyinfra_internals_are_unchanged(name):
    recorded = json.loads(RECORD.read_text())
    try:
        obj = resolve(name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"pyinfra {version('pyinfra')} has no {name} ({e}); tritonfleet relies on it: "
                    f"{INTERNALS[name]}. Adapt tritonfleet, then record (see this file's docstring).")
    assert source_hash(obj) == recorded["sources"].get(name), (
        f"pyinfra's {name} changed since it was checked (pyinfra {recorded['pyinfra']} -> "
        f"{version('pyinfra')}). Re-check: {INTERNALS[name]}. Then record the new hashes: "
        ".venv/bin/python tests/unit/pyinfra_ext/test_internals.py --record")


def test_inner_operations_take_the_arguments_passed_to_them():
    from pyinfra.operations import apt, files, systemd

    expected = {files.put: {"src", "dest", "user", "group", "mode"},
                apt.packages: {"packages", "present", "latest", "update", "upgrade"},
                systemd.service: {"service", "running", "enabled", "restarted"}}
    for op, params in expected.items():
        have = set(inspect.signature(op._inner).parameters)
        assert params <= have, f"{op.__module__}.{op.__name__}._inner lost {params - have} (ops/converged.py)"


def test_operation_order_is_read_from_pyinfra_operation_module():
    """oporder.install() swaps the name the operation code calls; it must be looked up in that
    module's namespace at call time (not bound elsewhere)."""
    op_module = importlib.import_module("pyinfra.api.operation")
    assert callable(getattr(op_module, "get_operation_order_from_stack", None))
    assert "get_operation_order_from_stack(state)" in inspect.getsource(op_module.solve_operation_consistency)


def test_global_arguments_are_computed_once_and_are_pyinfras(monkeypatch):
    """argcache.install(): pyinfra's two callers get the cached list (looked up by name at call
    time), equal to pyinfra's own, and popping arguments no longer evaluates type hints."""
    from pyinfra.api import arguments as arguments_module
    from pyinfra.api import facts as facts_module

    from tritonfleet.pyinfra_ext import argcache

    for caller in (arguments_module.pop_global_arguments, facts_module.FactBase.__init_subclass__):
        assert "all_global_arguments()" in inspect.getsource(caller), caller
    original = argcache._original()
    argcache.install()
    try:
        assert arguments_module.all_global_arguments() == original
        assert facts_module.all_global_arguments() == original
        calls = []
        real = arguments_module.get_type_hints
        monkeypatch.setattr(arguments_module, "get_type_hints", lambda *a, **k: calls.append(a) or real(*a, **k))
        for _ in range(3):
            arguments_module.all_global_arguments()
        assert calls == [], "the cached function evaluated type hints again"
    finally:
        argcache.uninstall()
    assert arguments_module.all_global_arguments is argcache._original


if __name__ == "__main__" and "--record" in sys.argv:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(current(), indent=2, sort_keys=True) + "\n")
    print(f"recorded pyinfra {version('pyinfra')} internals in {RECORD}")
