"""pyinfra's internals that tritonfleet patches or relies on are the ones it was checked against,
and the run-time check of them (tritonfleet/pyinfra_ext/compat.py) does what it says.

compat.INTERNALS lists every such internal with the feature it serves; compat.RECORD
(tritonfleet/pyinfra_ext/internals.json) holds the sha256 of each one's source, and of each
module file holding one, in every release it was checked against. These tests run against the
installed pyinfra; tests/integration/pyinfra_ext/test_releases.py runs them again against every pyinfra release
pyproject.toml allows, each in a scratch environment. After re-checking a new release, record it
with `.venv/bin/python -m tritonfleet.pyinfra_ext.compat --record` and widen the pin.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tritonfleet.pyinfra_ext import compat, probes

PYPROJECT = Path(__file__).parents[3] / "pyproject.toml"
RECORD = compat.load_record()


def pin() -> SpecifierSet:
    return SpecifierSet(re.search(r'"pyinfra([^"]*)"', PYPROJECT.read_text()).group(1))


def test_the_pin_admits_only_checked_releases():
    checked = RECORD["checked"]["pyinfra"]
    spec = pin()
    assert all(Version(v) in spec for v in checked), (str(spec), checked)
    major, minor = (int(p) for p in checked[0].split(".")[:2])
    candidates = [f"{major}.{minor}.{p}" for p in range(100)] + [f"{major}.{minor + 1}.0", f"{major + 1}.0.0"]
    admitted = [v for v in candidates if Version(v) in spec]
    unchecked = [v for v in admitted if v not in checked]
    assert not unchecked, (
        f"pyproject.toml pins pyinfra{spec}, which admits {', '.join(unchecked)}: tritonfleet was checked against "
        f"{', '.join(checked)} only (tritonfleet/pyinfra_ext/internals.json). Check a release "
        "(tests/integration/pyinfra_ext/test_releases.py), record it, then widen the pin")


def test_the_installed_pyinfra_is_a_checked_one_and_passes_the_check():
    assert version("pyinfra") in RECORD["checked"]["pyinfra"], (
        f"pyinfra {version('pyinfra')} is installed, tritonfleet was checked against {RECORD['checked']['pyinfra']}: "
        "install from requirements.lock (bash scripts/setup)")
    res = compat.check()
    assert res.mismatches == [], res.refusal() if res.refused else res.warnings()


@pytest.mark.parametrize("internal", [i for i in compat.INTERNALS if i.probe is None], ids=lambda i: i.name)
def test_every_internal_is_recorded_as_it_is(internal):
    """Source by source (what the check falls back to when a module file differs)."""
    try:
        obj = compat.resolve(internal.name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"pyinfra {version('pyinfra')} has no {internal.name} ({e}); tritonfleet relies on it: "
                    f"{internal.assumes}. Adapt tritonfleet, then record (see this file's docstring).")
    assert compat.source_hash(obj) in RECORD["sources"].get(internal.name, []), (
        f"pyinfra's {internal.name} changed since it was checked ({RECORD['checked']['pyinfra']} -> "
        f"{version('pyinfra')}). Re-check: {internal.assumes}. Then record it (see this file's docstring)")


@pytest.mark.parametrize("internal", [i for i in compat.INTERNALS if i.probe is not None],
                         ids=lambda i: f"{i.name} ({i.assumes[:20]})")
def test_every_probed_internal_passes_its_probe(internal):
    assert internal.probe(compat.resolve(internal.name)) == ""


HOST_MODULE = """
class Host:
    def run_shell_command(self, *args, **kwargs):
        return self.connector.run_shell_command(*args, **kwargs)

    def put_file(self, *args, **kwargs):
        return self.connector.put_file(*args, **kwargs)

    def get_file(self, *args, **kwargs):
        return self.connector.get_file(*args, **kwargs)

    def rsync(self, *args, **kwargs):
        return self.connector.rsync(*args, **kwargs)

    def connect(self):
        return self.connector.connect()
"""


@pytest.mark.parametrize("change, why", [
    ("", ""),
    ("return self.connector.put_file(*args, **kwargs)|return self.connector.upload(*args, **kwargs)",
     "Host.put_file no longer hands its arguments to self.connector.put_file"),
    ("    def connect(self):|    def stream(self, *a):\n        return self.connector.stream_command(*a)\n\n"
     "    def connect(self):", "Host calls its connector's stream_command too"),
])
def test_the_lock_gate_probe_sees_a_host_with_another_way_to_its_host(tmp_path, monkeypatch, change, why):
    """lock_early relies on Host's four methods being pyinfra's only way to a host: a Host whose
    method no longer forwards, or that calls its connector from another method, fails the probe
    (the speed feature goes off: install() waits for the locks itself)."""
    text = HOST_MODULE
    if change:
        old, new = change.split("|")
        text = text.replace(old, new)
    (tmp_path / "fake_pyinfra_host.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fake_pyinfra_host", None)
    module = importlib.import_module("fake_pyinfra_host")
    try:
        probe = next(i.probe for i in compat.INTERNALS if i.feature == "lock_early")
        assert probe(module.Host) == why
    finally:
        sys.modules.pop("fake_pyinfra_host", None)


def test_every_feature_is_speed_or_behaviour_and_has_internals():
    assert {i.feature for i in compat.INTERNALS} == set(compat.FEATURES)
    assert {kind for kind, _ in compat.FEATURES.values()} == {compat.SPEED, compat.BEHAVIOUR}
    assert {f for f, (kind, _) in compat.FEATURES.items() if kind == compat.SPEED} == {"oporder", "argcache", "lock_early",
                                                                                       "connect_early", "idle_poll",
                                                                                       "jinja_bytecode"}


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
        # the check still sees pyinfra's own function behind the patch
        assert compat.check({"argcache"}, record={**RECORD, "files": {}}).mismatches == []
    finally:
        argcache.uninstall()
    assert arguments_module.all_global_arguments is argcache._original


# ---------------------------------------------------------------- a changed internal, at run time

def changed_copy(tmp_path, monkeypatch, name: str):
    """A copy of the internal ``name`` (a function) with one more statement, loaded from a file
    of its own (with its module's globals), put where pyinfra has it: what a pyinfra release that
    changed it looks like."""
    module_name, _, attrs = name.partition(":")
    owner = importlib.import_module(module_name)
    *path, last = attrs.split(".")
    for attr in path:
        owner = getattr(owner, attr)
    original = getattr(owner, last)
    lines = textwrap.dedent(inspect.getsource(original)).splitlines(keepends=True)
    node = ast.parse("".join(lines)).body[0]
    first = node.body[0]
    indent = " " * first.col_offset
    at = first.lineno - 1
    source = "".join(lines[node.lineno - 1:at]) + f"{indent}_ = 'a pyinfra release changed this'\n" + "".join(lines[at:])
    f = tmp_path / f"changed_{last}.py"
    f.write_text("from __future__ import annotations\nimport importlib\n"
                 f"globals().update({{k: v for k, v in vars(importlib.import_module({module_name!r})).items() "
                 "if not k.startswith('__')})\n" + source)
    spec = importlib.util.spec_from_file_location(f.stem, f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(owner, last, getattr(mod, original.__name__))
    return getattr(mod, original.__name__)


def test_a_changed_speed_internal_switches_its_patch_off_with_a_warning(tmp_path, monkeypatch):
    changed_copy(tmp_path, monkeypatch, "pyinfra.api.util:get_operation_order_from_stack")
    res = compat.check()
    assert res.refused == [] and res.off == {"oporder"}
    [warning] = res.warnings()
    assert f"pyinfra {version('pyinfra')}" in warning
    assert "pyinfra.api.util:get_operation_order_from_stack: its source differs" in warning
    assert "speed-only patch oporder" in warning and "off for this run" in warning


def test_a_changed_behaviour_internal_refuses_naming_it_and_the_version(tmp_path, monkeypatch):
    import pyinfra.operations.files as files

    changed_copy(tmp_path, monkeypatch, "pyinfra.operations.files:put._inner")
    assert files.put._inner.__module__ == "changed__inner"
    res = compat.check()
    assert [m.internal.name for m in res.refused] == ["pyinfra.operations.files:put._inner"]
    text = res.refusal()
    assert f"tritonfleet refuses to run with pyinfra {version('pyinfra')}" in text
    assert "pyinfra.operations.files:put._inner: its source differs" in text and "ops/converged.py" in text
    assert f"pip install 'pyinfra=={RECORD['checked']['pyinfra'][0]}'" in text
    with pytest.raises(compat.PyinfraChanged, match=r"put\._inner"):
        compat.ensure("converged")
    compat.ensure("oporder", "cli_args")  # the others are unaffected


def test_install_refuses_before_it_changes_anything(tmp_path, monkeypatch):
    """pyinfra_patches.install() with a changed behaviour internal: the run stops (no traceback:
    SystemExit with the refusal), no patch is installed and no lock taken."""
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    from tritonfleet.pyinfra_ext import hostlock, oporder
    from tritonfleet.pyinfra_ext import install as pyinfra_patches

    changed_copy(tmp_path, monkeypatch, "pyinfra.api.state:State.get_op_meta")
    taken = []
    monkeypatch.setattr(hostlock, "enabled", lambda: True)
    monkeypatch.setattr(hostlock, "acquire_all", lambda *a, **k: taken.append(1))
    op_module = importlib.import_module("pyinfra.api.operation")
    before = op_module.get_operation_order_from_stack
    state = State()
    state.callback_handlers = []
    with ctx_state.use(state), pytest.raises(SystemExit) as exc:
        pyinfra_patches.install()
    text = str(exc.value)
    assert text.startswith("tritonfleet: no host was changed:\ntritonfleet refuses to run with pyinfra"), text
    assert "pyinfra.api.state:State.get_op_meta: its source differs" in text
    assert taken == [] and op_module.get_operation_order_from_stack is before is not oporder._fast_order
    assert state.callback_handlers == []


def test_install_runs_with_a_speed_patch_off(tmp_path, monkeypatch, caplog):
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    from tritonfleet.pyinfra_ext import (
        argcache,
        connection,
        hostlock,
        oporder,
    )
    from tritonfleet.pyinfra_ext import (
        install as pyinfra_patches,
    )

    changed_copy(tmp_path, monkeypatch, "pyinfra.api.arguments:pop_global_arguments")
    monkeypatch.setattr(hostlock, "enabled", lambda: False)
    arguments = importlib.import_module("pyinfra.api.arguments")
    state = State()
    state.callback_handlers = []
    try:
        with ctx_state.use(state):
            pyinfra_patches.install()
        assert arguments.all_global_arguments is argcache._original  # left off
        assert importlib.import_module("pyinfra.api.operation").get_operation_order_from_stack is \
            oporder._fast_order  # the other speed patch on
        assert connection._idle_poll["on"] is True
        assert "speed-only patch argcache" in caplog.text and "pop_global_arguments" in caplog.text
    finally:
        oporder.uninstall()
        argcache.uninstall()


def test_with_lock_early_off_install_waits_for_the_locks_itself(monkeypatch, caplog):
    """pyinfra's Host no longer the only way to a host (the probe differs): install() takes the
    locks and waits for them itself, as before lock_early, and leaves Host alone."""
    from pyinfra.api.host import Host
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    from tritonfleet.pyinfra_ext import argcache, hostlock, oporder
    from tritonfleet.pyinfra_ext import install as pyinfra_patches

    internal = next(i for i in compat.INTERNALS if i.feature == "lock_early")
    monkeypatch.setattr(compat, "INTERNALS", tuple(
        compat.Internal(i.name, i.feature, i.assumes, probe=lambda host: "Host calls its connector's stream too")
        if i is internal else i for i in compat.INTERNALS))
    file_hash = compat.file_hash  # pyinfra/api/host.py as a release that changed it: its internals are read
    monkeypatch.setattr(compat, "file_hash", lambda m: "changed" if m == "pyinfra.api.host" else file_hash(m))
    for n in hostlock.HOST_IO:
        monkeypatch.setattr(Host, n, inspect.unwrap(getattr(Host, n)))  # as pyinfra has it; restored after
    calls = []
    monkeypatch.setattr(hostlock, "enabled", lambda: True)
    monkeypatch.setattr(hostlock, "acquire_all", lambda wait=True: calls.append(wait))
    state = State()
    state.callback_handlers = []
    try:
        with ctx_state.use(state):
            pyinfra_patches.install()
    finally:
        oporder.uninstall()
        argcache.uninstall()
    assert calls == [True]
    assert not any(getattr(getattr(Host, n), "_tritonfleet_lock_gate", False) for n in hostlock.HOST_IO)
    assert "speed-only patch lock_early" in caplog.text


def test_idle_poll_tuning_follows_the_check(monkeypatch):
    """paramiko's Transport without the idle poll tritonfleet tunes: the probe says what changed."""
    import paramiko

    class Changed(paramiko.Transport):
        _active_check_timeout = None

    why = probes.paramiko_idle_poll(Changed)
    assert "no _active_check_timeout" in why
    assert probes.paramiko_idle_poll(paramiko.Transport) == ""


def test_the_dry_flag_probe():
    import click

    assert probes.has_dry_flag(click.Command("pyinfra", params=[click.Option(["--dry"], is_flag=True)])) == ""
    assert "--dry" in probes.has_dry_flag(click.Command("pyinfra", params=[click.Option(["--dry-run", "dry"],
                                                                                          is_flag=True)]))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# ------------------------------------------------- every internal used anywhere is listed

#: pyinfra's public API, as its docs (docs/api/, the operations' and facts' references) name it:
#: the context proxies and the logger at the top, what ``pyinfra.api`` exports, its exceptions,
#: the operations and the facts. Anything else of pyinfra (and all of pyinfra_cli, its command
#: line) is an internal: listed in compat.INTERNALS, checked at run time.
PUBLIC_TOP = {"host", "state", "inventory", "config", "logger"}


def public(module: str, name: str | None) -> bool:
    import pyinfra.api

    if module in ("pyinfra", "pyinfra.context") and name in PUBLIC_TOP:
        return True
    if module.startswith(("pyinfra.operations", "pyinfra.facts", "pyinfra.api.exceptions")):
        return not (name or "").startswith("_")
    if module == "pyinfra" and name in ("api", "operations", "facts"):
        return True
    if module.startswith("pyinfra.api") and name is not None and not name.startswith("_"):
        try:
            obj = getattr(importlib.import_module(module), name)
        except AttributeError:
            return False
        return getattr(pyinfra.api, name, None) is obj  # what pyinfra.api exports, wherever imported from
    return False


def pyinfra_uses(path: Path) -> list[tuple[int, str]]:
    """(line, ``module:name``) of every pyinfra name ``path`` imports that is not public, and of
    every private attribute (``files.put._inner``) reached through a pyinfra name it imports."""
    tree = ast.parse(path.read_text())
    out, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in ("pyinfra", "pyinfra_cli"):
            for a in node.names:
                if node.module in ("pyinfra", "pyinfra.context") and a.name in PUBLIC_TOP - {"logger"}:
                    bound[a.asname or a.name] = "pyinfra.context:ContextObject"  # the proxy of the current one
                elif importlib.util.find_spec(node.module).submodule_search_locations and \
                        importlib.util.find_spec(f"{node.module}.{a.name}"):
                    bound[a.asname or a.name] = f"{node.module}.{a.name}:"  # a module
                else:
                    bound[a.asname or a.name] = f"{node.module}:{a.name}"
                if node.module.startswith("pyinfra_cli") or not public(node.module, a.name):
                    out.append((node.lineno, f"{node.module}:{a.name}"))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("pyinfra", "pyinfra_cli"):
                    bound[a.asname or a.name.split(".")[0]] = a.name
                    if a.name.startswith("pyinfra_cli") or not (a.name == "pyinfra" or public(*a.name.rsplit(".", 1))):
                        out.append((node.lineno, f"{a.name}:"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                module, _, name = bound[base.id].partition(":")
                out.append((node.lineno, f"{module}:{'.'.join([name, *chain] if name else chain)}"))
    return out


def test_every_pyinfra_internal_the_package_uses_is_listed_in_the_check():
    """Wherever in the package a pyinfra internal is used (pyinfra_ext/ holds most), it is in
    compat.INTERNALS, so a pyinfra release that changes it is caught at run time."""
    listed = {i.name for i in compat.INTERNALS}
    root = Path(compat.__file__).parents[2]
    missing = []
    for path in sorted((root / "tritonfleet").rglob("*.py")):
        for line, name in pyinfra_uses(path):
            if not any(n == name or n.startswith(name + ".") or name.endswith(":") and n.startswith(name)
                       for n in listed):
                missing.append(f"{path.relative_to(root)}:{line}: {name}")
    assert not missing, ("pyinfra internals used but not in tritonfleet/pyinfra_ext/compat.py INTERNALS (list "
                         "each with its feature and what tritonfleet assumes, then record: python -m "
                         "tritonfleet.pyinfra_ext.compat --record):\n" + "\n".join(missing))


def test_the_internals_scan_sees_an_unlisted_internal(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from pyinfra import host, logger\nfrom pyinfra.api import StringCommand\n"
                 "from pyinfra.api.util import get_file_sha1\nfrom pyinfra_cli.util import parse_cli_arg\n"
                 "from pyinfra.operations import files\nfiles.put._inner\nfrom pyinfra.facts.server import Arch\n")
    assert pyinfra_uses(p) == [(3, "pyinfra.api.util:get_file_sha1"), (4, "pyinfra_cli.util:parse_cli_arg"),
                               (6, "pyinfra.operations.files:put._inner")]
