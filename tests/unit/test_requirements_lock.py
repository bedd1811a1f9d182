"""requirements.lock (what scripts/setup installs) covers every dependency pyproject.toml names,
at versions the specifiers allow, and the installed environment is the locked one;
requirements-runtime.lock (README's install) is the part of it an installation needs."""

from __future__ import annotations

import re
from importlib.metadata import distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tritonfleet import ROOT

LOCK = ROOT / "requirements.lock"


def locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", LOCK.read_text(), re.M)
    return {canonicalize_name(n): v for n, v in pins}


def declared() -> list[Requirement]:
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is not in Python 3.10)
    reqs = []
    for key in ("dependencies", "test"):
        block = re.search(rf"^{key} = \[(.*?)^\]", text, re.M | re.S).group(1)
        reqs += re.findall(r'^\s*"([^"]+)"', block, re.M)
    reqs += [line.strip() for line in (ROOT / "requirements-bundled.in").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return [Requirement(r) for r in reqs]


def test_every_declared_dependency_is_locked_within_its_specifier():
    pins = locked()
    for req in declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in requirements.lock: run `bash scripts/lock`"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock has {name}=={pins[name]}, pyproject.toml wants {req}: run `bash scripts/lock`")


def test_every_lock_entry_has_hashes():
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text())
    entries = [b for b in blocks if "==" in b.split("\n", 1)[0]]
    assert len(entries) == len(locked())
    for block in entries:
        assert "--hash=sha256:" in block, f"no hash for {block.splitlines()[0]}"


def test_the_environment_is_the_locked_one():
    pins = locked()
    have = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
    for name, version in pins.items():
        assert have.get(name) == version, (
            f"{name} {have.get(name, 'is not installed')}, requirements.lock has {version}: run `bash scripts/setup`")


RUNTIME = ROOT / "requirements-runtime.lock"


def _runtime_lock_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("runtime_lock", ROOT / "scripts" / "runtime_lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_runtime_lock_is_the_installations_part_of_the_lock():
    """requirements-runtime.lock is what scripts/runtime_lock.py writes from requirements.lock, and
    it holds exactly the distributions the package requires, through their own requirements, as
    the installed packages' metadata says: no test tool, nothing missing."""
    from tests.unit.test_wheel_dependencies import closure

    assert RUNTIME.read_text() == _runtime_lock_module().runtime(LOCK.read_text(),
                                                                 (ROOT / "pyproject.toml").read_text()), \
        "requirements-runtime.lock: run `python3 scripts/runtime_lock.py` (or `bash scripts/lock`)"
    pins = {canonicalize_name(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", RUNTIME.read_text(), re.M)}
    runtime_requirements = [str(r) for r in declared()[:_n_dependencies()]]
    assert set(pins) == closure(runtime_requirements)
    assert all(locked()[n] == v for n, v in pins.items())
    for test_only in ("pytest", "ruff", "onnxruntime", "nvidia-pytriton", "matplotlib", "hypothesis"):
        assert test_only not in pins


def _n_dependencies() -> int:
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1)
    return len(re.findall(r'^\s*"([^"]+)"', block, re.M))


def test_readme_installs_the_locked_versions():
    """README's install used to ignore the lock (pip resolving whatever was newest)."""
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "pip install --require-hashes --no-deps -r requirements-runtime.lock" in install
    assert "--no-deps dist/tritonfleet-0.1.0-py3-none-any.whl" in install
