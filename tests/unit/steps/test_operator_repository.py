"""What an operator's repository holds keeps working: the deploy files, inventory and group data
`tritonfleet init` of tritonfleet 0.1.0 wrote (tests/fixtures/operator-repo-0.1.0/, as written)
import names the package still has, and run as the package's own steps do (pyinfra's @fake
connector here; on the test hosts: tests/testbed/test_operator_repository.py)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from pyinfra_cli.util import exec_file

import tritonfleet.pyinfra_ext.install
import tritonfleet.steps.rollback
import tritonfleet.steps.triton
import tritonfleet.steps.verify
from tests.support.fakehost import run_fake
from tests.unit.steps.test_steps_fake import BASE, DATA
from tritonfleet.pyinfra_ext import argcache, oporder

REPO = Path(__file__).resolve().parents[2] / "fixtures" / "operator-repo-0.1.0"
FILES = sorted(REPO.rglob("*.py"))


def imports(path: Path) -> list[tuple[str, str | None]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tritonfleet"):
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.startswith("tritonfleet")]
    return out


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_every_name_it_imports_is_there(path):
    names = imports(path)
    for module, name in names:
        mod = importlib.import_module(module)
        if name is not None:
            assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), f"{module}.{name}"
    if path.parent.name == "deploys":
        assert ("tritonfleet", "pyinfra_patches") in names


def test_the_old_names_are_the_package_s_own():
    from tritonfleet import defaults, limits, pyinfra_patches, tunables
    from tritonfleet.core import open_files
    from tritonfleet.settings import defaults as settings_defaults
    from tritonfleet.settings import table

    assert pyinfra_patches.install is tritonfleet.pyinfra_ext.install.install
    assert limits.raise_nofile is open_files.raise_nofile
    assert defaults.DEFAULTS is settings_defaults.DEFAULTS
    assert defaults.ssh_strict_host_key_checking == settings_defaults.ssh_strict_host_key_checking
    assert tunables.markdown is table.markdown


def _fake(deploy, data=None):
    try:
        _, cmds, state = run_fake(deploy, BASE, {**DATA, **(data or {})})
    finally:  # what install() changed in pyinfra, for the tests after this one
        oporder.uninstall()
        argcache.uninstall()
    # (a failure record names the second it was written)
    return [re.sub(r'"time": "[^"]*"', '"time": "-"', str(c)) for c in cmds], sorted(h.name for h in state.failed_hosts)


@pytest.mark.parametrize("name, runbook", [
    ("verify", lambda: (tritonfleet.pyinfra_ext.install.install(),
                        tritonfleet.steps.verify.verify_gpus(load_image=False),
                        tritonfleet.steps.triton.health_gate(record=False))),
    ("rollback", lambda: (tritonfleet.pyinfra_ext.install.install(), tritonfleet.steps.rollback.rollback())),
])
def test_its_deploy_files_send_what_the_steps_send(name, runbook):
    """The old deploy file, run on a fake host, sends exactly the commands of the same runbook
    written with the package's modules as they are named now."""
    old = _fake(lambda: exec_file(str(REPO / "deploys" / f"{name}.py")))
    new = _fake(runbook)
    assert old[0] and old == new
