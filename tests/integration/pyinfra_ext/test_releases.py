"""Every pyinfra release pyproject.toml allows, each installed into a scratch environment: the
run-time check of pyinfra's internals passes on it and tests/unit/pyinfra_ext/test_internals.py passes
against it. And on the locked release, a deploy run by pyinfra's own command line with an internal
changed in pyinfra's installed files: a speed-only one is switched off with a warning, a
behaviour one refuses the run, naming it and the version.

The scratch environments are fast: a virtual environment without pip, the release's wheel alone
installed into it (--no-deps, from the registry through pip's own configuration, kept under
.cache/pyinfra-releases), and a .pth file that adds this checkout and then this environment's
site-packages (requirements.lock's packages) after the new environment's own, so its pyinfra wins.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tritonfleet import ROOT
from tritonfleet.pyinfra_ext import compat

CACHE = ROOT / ".cache" / "pyinfra-releases"


def pin() -> SpecifierSet:
    return SpecifierSet(re.search(r'"pyinfra([^"]*)"', (ROOT / "pyproject.toml").read_text()).group(1))


def pip(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout)


def allowed_releases() -> list[str]:
    """The pyinfra releases the registry has that pyproject.toml's pin admits (pip's own index)."""
    res = pip("index", "versions", "pyinfra")
    m = re.search(r"^Available versions: (.+)$", res.stdout, re.MULTILINE)
    assert res.returncode == 0 and m, f"pip index versions pyinfra: {res.stdout[-500:]} {res.stderr[-1500:]}"
    out = []
    for v in m.group(1).split(", "):
        try:
            if Version(v) in pin():
                out.append(v)
        except InvalidVersion:
            continue
    return sorted(out, key=Version)


def wheel(release: str) -> Path:
    found = sorted(CACHE.glob(f"pyinfra-{release}-*.whl"))
    if not found:
        res = pip("download", "--no-deps", "-q", "-d", str(CACHE), f"pyinfra=={release}")
        assert res.returncode == 0, res.stderr[-2000:]
        found = sorted(CACHE.glob(f"pyinfra-{release}-*.whl"))
    assert found, f"no wheel of pyinfra {release} in {CACHE}"
    return found[0]


def scratch(tmp: Path, release: str) -> tuple[Path, Path, dict]:
    """(python, the new environment's site-packages, the environment for commands)."""
    venv = tmp / f"venv-{release}"
    res = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    python = venv / "bin" / "python"
    res = pip("--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel(release)))
    assert res.returncode == 0, res.stderr[-2000:]
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True).stdout.strip())
    (purelib / "zz-checkout-and-locked.pth").write_text(f"{ROOT}\n{sysconfig.get_paths()['purelib']}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return python, purelib, env


def run(argv: list, env: dict, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_pin_admits_releases_the_registry_has():
    releases = allowed_releases()
    assert releases, f"pyproject.toml's pin pyinfra{pin()} admits no release the registry has"
    assert all(v in compat.load_record()["checked"]["pyinfra"] for v in releases), releases


@pytest.mark.parametrize("release", allowed_releases())
def test_each_allowed_release_passes_the_check_and_the_internals_tests(release, tmp_path):
    python, purelib, env = scratch(tmp_path, release)
    res = run([python, "-c", "import json, pyinfra, tritonfleet, pyinfra.api.util as u; from importlib.metadata "
               "import version; print(json.dumps([version('pyinfra'), u.__file__, tritonfleet.__file__]))"], env)
    assert res.returncode == 0, res.stderr[-2000:]
    have, util, ours = json.loads(res.stdout)
    assert have == release and util.startswith(str(purelib)), (have, util)
    assert ours.startswith(str(ROOT)), ours
    res = run([python, "-m", "tritonfleet.pyinfra_ext.compat"], env)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert json.loads(res.stdout)["versions"]["pyinfra"] == release
    res = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/pyinfra_ext/test_internals.py"], env, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


DEPLOY = """\
from pyinfra.operations import server

from tritonfleet import pyinfra_patches

pyinfra_patches.install()
server.shell(name="nothing", commands=["true"])
"""


def change(path: Path, function: str) -> None:
    """One more statement at the start of ``function``'s body in ``path`` (an installed pyinfra file)."""
    text = path.read_text()
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == function)
    first = node.body[0]
    lines = text.splitlines(keepends=True)
    lines.insert(first.lineno - 1, " " * first.col_offset + "_ = 'a release that changed this'\n")
    path.write_text("".join(lines))


def test_a_changed_internal_in_pyinfras_files_is_switched_off_or_refused_by_the_deploy(tmp_path):
    python, purelib, env = scratch(tmp_path, compat.installed_versions()["pyinfra"])
    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY)
    argv = [python, "-m", "pyinfra", "--dry", "@local", deploy]

    res = run(argv, env, cwd=tmp_path)  # as installed: no word from the check
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "tritonfleet" not in res.stdout + res.stderr

    change(purelib / "pyinfra" / "api" / "util.py", "get_operation_order_from_stack")
    res = run(argv, env, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "pyinfra.api.util:get_operation_order_from_stack: its source differs" in out, out[-3000:]
    assert "speed-only patch oporder" in out and "off for this run" in out

    change(purelib / "pyinfra" / "operations" / "files.py", "put")
    res = run(argv, env, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "tritonfleet: no host was changed" in out and "tritonfleet refuses to run with pyinfra" in out, out[-3000:]
    assert "pyinfra.operations.files:put._inner: its source differs" in out
    assert "Traceback" not in out, out[-3000:]
