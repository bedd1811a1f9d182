"""requirements.lock (what scripts/setup installs) covers every dependency pyproject.toml names,
at versions the specifiers allow, and the installed environment is the locked one."""

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
