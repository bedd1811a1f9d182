"""The package's structure, read from the source with ``ast``: the read side imports no deploy
step, the production package never imports the test tooling, and importing the steps changes
nothing in pyinfra (each deploy file installs tritonfleet's patches with one visible line)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tritonfleet"
DEPLOY_FILES = sorted([*ROOT.glob("deploys/*.py"), *ROOT.glob("tests/deploys/*.py"), *ROOT.glob("bench/deploys/*.py")])


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at any depth (a function's own imports too),
    relative ones resolved; ``from M import N`` gives M and M.N (N may be a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            out.append((node.lineno, source))
            out += [(node.lineno, f"{source}.{a.name}") for a in node.names]
    return out


def production_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def import_graph() -> dict[str, set[str]]:
    """Which of the package's modules each of its modules imports."""
    mods = production_modules()
    return {m: {i for _, i in imported(p) if i in mods} for m, p in mods.items()}


def chain(graph: dict[str, set[str]], start: str, bad) -> list[str] | None:
    """The first import chain from ``start`` to a module ``bad`` accepts (None: there is none)."""
    seen, todo = {start}, [[start]]
    while todo:
        path = todo.pop(0)
        for nxt in sorted(graph.get(path[-1], ())):
            if bad(nxt):
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                todo.append([*path, nxt])
    return None


def test_no_module_outside_the_steps_imports_them():
    """The read side (probe, preflight, fleet, rollout, status, tune, loadtest, perfgate, failure,
    ...) and the facts, operations and CLI import no deploy step, not even inside a function, and
    reach none through another module."""
    graph = import_graph()
    found = []
    for m in graph:
        if within(m, "tritonfleet.steps"):
            continue
        path = chain(graph, m, lambda x: within(x, "tritonfleet.steps"))
        if path:
            found.append(" -> ".join(path))
    assert not found, "deploy steps imported outside tritonfleet/steps/:\n" + "\n".join(found)


def test_the_production_package_never_imports_the_test_tooling():
    found = [f"{p.relative_to(ROOT)}:{line}: {m}" for p in production_modules().values()
             for line, m in imported(p) if within(m, "tritonfleet_testbed")]
    assert not found, "tritonfleet imports the test tooling (tritonfleet_testbed):\n" + "\n".join(found)


def test_the_cli_commands_import_nothing_from_the_cli_package():
    """The command modules are imported by tritonfleet.cli, never the other way round too."""
    found = [f"{p.relative_to(ROOT)}:{line}: {m}" for p in sorted((PACKAGE / "cli").glob("*.py"))
             if p.name != "__init__.py" for line, m in imported(p)
             if m == "tritonfleet.cli" or m.startswith("tritonfleet.cli.main")]
    assert not found, "a command module imports the CLI package back:\n" + "\n".join(found)


@pytest.mark.parametrize("deploy", DEPLOY_FILES, ids=[str(p.relative_to(ROOT)) for p in DEPLOY_FILES])
def test_every_deploy_file_installs_the_patches_first(deploy):
    """One visible line, the first statement after the imports: pyinfra_patches.install()."""
    body = [n for n in ast.parse(deploy.read_text()).body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    first = ast.unparse(body[0]) if body else ""
    assert first == "pyinfra_patches.install()", (
        f"{deploy.relative_to(ROOT)}: the first statement after the imports is {first!r}, not "
        "pyinfra_patches.install() (from tritonfleet import pyinfra_patches)")


def test_the_readmes_deploy_example_is_the_deploy_file():
    """README shows deploys/models.py as the example of an entry point: it is that file (its
    first comment aside), the patches line included."""
    readme = (ROOT / "README.md").read_text()
    example = readme.split("e.g. `deploys/models.py`:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    code = [ln for ln in (ROOT / "deploys" / "models.py").read_text().splitlines(keepends=True)
            if not ln.startswith("#")]
    assert example == "".join(code)


PATCHES = """
import importlib, json, logging, signal
import pyinfra
pyinfra.is_cli = True  # as when pyinfra's CLI loads a deploy file
operation = importlib.import_module("pyinfra.api.operation")
arguments = importlib.import_module("pyinfra.api.arguments")
from pyinfra.api.state import State
from pyinfra.api.host import Host
from pyinfra.context import ctx_state

def now():
    return {"order": operation.get_operation_order_from_stack.__module__,
            "sigint": getattr(signal.getsignal(signal.SIGINT), "__module__", None),
            "callbacks": [type(c).__module__ for c in state.callback_handlers],
            "global_arguments": arguments.all_global_arguments.__module__,
            "log_filters": [type(f).__module__ for f in logging.getLogger("pyinfra").filters],
            "host_io_gated": sorted(n for n in ("run_shell_command", "put_file", "get_file", "rsync")
                                    if getattr(getattr(Host, n), "_tritonfleet_lock_gate", False))}

state = State()
state.callback_handlers = []  # (State.init sets it up for a run)
ctx_state.set(state)
out = {"before": now()}
import tritonfleet, tritonfleet.cli, tritonfleet.inventory.roster, tritonfleet.fleet.probe, tritonfleet.fleet.rollout
import tritonfleet.preflight, tritonfleet.steps.host_prep, tritonfleet.steps.rollback
import tritonfleet.steps.triton, tritonfleet.steps.verify
out["imported"] = now()
from tritonfleet import pyinfra_patches
pyinfra_patches.install()
out["installed"] = now()
print(json.dumps(out))
"""


def test_importing_the_steps_patches_nothing_and_install_does():
    res = subprocess.run([sys.executable, "-c", PATCHES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["imported"] == out["before"], f"importing the steps changed pyinfra: {out}"
    installed = out["installed"]
    assert installed["order"] == "tritonfleet.pyinfra_ext.oporder", installed
    assert installed["sigint"] == "tritonfleet.pyinfra_ext.interrupt", installed
    assert "tritonfleet.pyinfra_ext.connection" in installed["callbacks"], installed
    assert installed["global_arguments"] == "tritonfleet.pyinfra_ext.argcache", installed
    assert installed["log_filters"] == ["tritonfleet.pyinfra_ext.connection"], installed
    assert installed["host_io_gated"] == ["get_file", "put_file", "rsync", "run_shell_command"], installed


def test_the_testbed_commands_join_the_cli_through_their_entry_point(monkeypatch):
    """`tritonfleet testbed ...` comes from the test tooling's entry point (the repository's
    install has it); a declared command whose package is not installed is left out."""
    import importlib.metadata

    import click

    from tritonfleet import cli
    from tritonfleet_testbed.cli import testbed

    assert cli.main.commands["testbed"] is testbed
    declared = [importlib.metadata.EntryPoint("absent", "tritonfleet_absent_tooling.cli:group", cli.COMMANDS_GROUP),
                importlib.metadata.EntryPoint("testbed", "tritonfleet_testbed.cli:testbed", cli.COMMANDS_GROUP)]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: declared if group == cli.COMMANDS_GROUP else [])
    group = click.Group("tritonfleet")
    monkeypatch.setattr(cli, "main", group)
    cli._add_installed_commands()
    assert sorted(group.commands) == ["testbed"]


def test_install_runs_once_a_run_while_the_other_hosts_wait_for_it(monkeypatch):
    """pyinfra runs the deploy file once per host, side by side (greenlets): install() starts the
    deploy locks once and returns at once, the hosts' deploy files go on loading (importing their
    steps) while the holders connect, and no host's first step goes on before every lock is held."""
    import gevent
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    from tritonfleet.pyinfra_ext import argcache, hostlock, oporder
    from tritonfleet.pyinfra_ext import install as pyinfra_patches

    events = []

    class Holder:  # a holder whose host answers after 50 ms
        def __init__(self, name):
            self.host = SimpleNamespace(name=name)

        def acquire(self, say=None, started=False):
            gevent.sleep(0.05)
            events.append(f"{self.host.name}: lock held")
            return ""

        def end(self):
            pass

        def release(self):
            pass

    def acquire_all(wait=True):
        events.append(f"holders started (wait={wait})")
        hostlock._gates[:] = hostlock._gates or [threading.Lock()]
        hostlock._pending.append(([Holder(f"h{i}") for i in range(3)], print))
        return hostlock.wait_all() if wait else 0

    monkeypatch.setattr(hostlock, "enabled", lambda: True)
    monkeypatch.setattr(hostlock, "acquire_all", acquire_all)
    monkeypatch.setattr(hostlock, "gate_host_io", lambda: events.append("host I/O gated"))
    state = State()
    state.callback_handlers = []

    def deploy_file(i: int) -> None:
        with ctx_state.use(state):
            pyinfra_patches.install()
            events.append(f"host {i} loads its steps")
            pyinfra_patches.required("pre-flight")
            events.append(f"host {i} runs its first step")

    try:
        gevent.joinall([gevent.spawn(deploy_file, i) for i in range(3)], raise_error=True)
    finally:
        oporder.uninstall()
        argcache.uninstall()
        hostlock.release_all()
    assert events[:2] == ["holders started (wait=False)", "host I/O gated"], events
    assert events.count("holders started (wait=False)") == 1, events
    held = [events.index(f"h{i}: lock held") for i in range(3)]
    loads = [events.index(f"host {i} loads its steps") for i in range(3)]
    steps = [events.index(f"host {i} runs its first step") for i in range(3)]
    assert max(loads) < min(held), f"a host's deploy file waited for the locks before its steps loaded: {events}"
    assert max(held) < min(steps), f"a step ran before every host's lock was held: {events}"
