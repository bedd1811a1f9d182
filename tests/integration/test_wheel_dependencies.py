"""The wheel, installed as README says, has everything the validator needs: built from this
checkout, installed into a fresh virtual environment with nothing but the distributions of
requirements-runtime.lock (README's install; tests/unit/test_requirements_lock.py checks they are exactly what the
wheel's Requires-Dist needs, through their own requirements), taken from this environment's
installed packages (no download), it refuses every ONNX mismatch class of
tests/unit/model_repo/test_onnx_io.py. Before onnx was a dependency of the package, this installation
printed "valid" for all of them (the signature check was skipped without a word).

How the fresh environment sees only those distributions: the wheel alone is installed (pip
install --no-deps); a directory of links to the files of each distribution (its modules and its
.dist-info) is added through a .pth file. The test asserts that a distribution the package does
not require (onnxruntime, installed here for the tests) cannot be imported there, so nothing
leaks in from this environment.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.wheel import build_wheel
from tests.unit.model_repo.test_onnx_io import mismatch_repository
from tritonfleet import ROOT


def run(argv: list, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env or dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)


def closure(requirements: list[str]) -> set[str]:
    """Canonical names of the distributions ``requirements`` need, through their own
    requirements (markers evaluated for this interpreter, no extras)."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        dist = md.distribution(name)
        todo += [r for r in (dist.requires or [])]
        for extra in req.extras:
            todo += [r.split(";")[0] for r in (dist.requires or [])
                     if Requirement(r).marker and Requirement(r).marker.evaluate({"extra": extra})]
    return seen


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's bin directory, an environment for commands, its requirements)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line.split(":", 1)[1].strip() for line in z.read(meta).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    deps = tmp / "deps"
    deps.mkdir()
    needed = {canonicalize_name(n) for n in re.findall(r"^([A-Za-z0-9_.-]+)==",
                                                      (ROOT / "requirements-runtime.lock").read_text(), re.M)}
    assert needed == closure(requires), "requirements-runtime.lock: run `bash scripts/lock`"
    for name in sorted(needed):
        dist = md.distribution(name)
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            top = f.parts[0]
            if top == ".." or (deps / top).exists() or top.endswith(".pth"):
                continue
            if (base / top).exists():
                (deps / top).symlink_to(base / top)
    venv = tmp / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", venv], tmp).returncode == 0
    python = venv / "bin" / "python"
    res = run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel], tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).stdout.strip()
    Path(purelib, "zz-required-distributions.pth").write_text(f"{deps}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"
    return venv / "bin", env, requires, tmp


def test_onnx_is_a_requirement_and_nothing_else_leaks_in(installed):
    bindir, env, requires, tmp = installed
    assert any(canonicalize_name(Requirement(r).name) == "onnx" for r in requires), requires
    probe = run([bindir / "python", "-c", "import importlib.util as u, tritonfleet, onnx; "
                 "print(tritonfleet.__file__); print(u.find_spec('onnxruntime'))"], tmp, env)
    assert probe.returncode == 0, probe.stderr
    where, onnxruntime = probe.stdout.split()
    assert where.startswith(str(bindir.parent)) and onnxruntime == "None"


def test_the_installed_wheel_refuses_every_onnx_mismatch(installed):
    bindir, env, _, tmp = installed
    repo = tmp / "models"
    expect = mismatch_repository(repo)
    res = run([bindir / "tritonfleet", "validate", repo], tmp, env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    for model, words in expect.items():
        lines = [line for line in res.stdout.splitlines() if line.startswith(f"{repo}/{model}/")]
        assert any(words in line for line in lines), (model, lines)
    assert "[unchecked]" not in res.stdout
