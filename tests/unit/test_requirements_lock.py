"""requirements.lock (what scripts/setup installs) covers every dependency pyproject.toml names,
at versions the specifiers allow, and the installed environment is the locked one;
requirements-runtime.lock (README's install) is the part of it an installation needs."""

from __future__ import annotations

import re
from importlib.metadata import distributions

import pytest
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
    from tests.integration.test_wheel_dependencies import closure

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


S3 = ROOT / "requirements-s3.lock"
S3_INSTALL = "pip install --require-hashes --no-deps -r requirements-s3.lock"


def _pins(path) -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", path.read_text(), re.M)}


def test_the_s3_lock_is_what_the_s3_part_adds():
    """requirements-s3.lock (an s3:// model_origin's client) is what scripts/runtime_lock.py writes:
    boto3 and what it needs beyond requirements-runtime.lock, hashed, at requirements.lock's
    versions, nothing of the runtime lock twice; README's Install names the line that installs
    it, and the error for a missing boto3 names the same line (no unpinned install)."""
    from tests.integration.test_wheel_dependencies import closure
    from tritonfleet.model_repo import s3_store

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert S3.read_text() == _runtime_lock_module().optional(LOCK.read_text(), pyproject, "s3"), \
        "requirements-s3.lock: run `python3 scripts/runtime_lock.py` (or `bash scripts/lock`)"
    s3, runtime = _pins(S3), _pins(RUNTIME)
    assert "boto3" in s3 and not set(s3) & set(runtime)
    assert set(s3) | set(runtime) >= closure(["boto3"])
    assert all(locked()[n] == v for n, v in s3.items())
    assert S3.read_text().count("==") == S3.read_text().count("# via") and "--hash=sha256:" in S3.read_text()
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert S3_INSTALL in install
    assert S3_INSTALL in s3_store.BOTO3_MISSING and "tritonfleet[s3]" not in s3_store.BOTO3_MISSING


# ---- the Pythons README names ------------------------------------------------------------------

def _readme_pythons() -> list[tuple[int, int]]:
    """The Python versions README's Install names: "Python 3.11 or 3.12" (or "3.11, 3.12 or 3.13")."""
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"Python ((?:3\.\d+, )*3\.\d+(?: or 3\.\d+)?)(?! or newer)[ ,.;:]", install)
    assert m, "README's Install names no Python version list (\"Python 3.11 or 3.12\")"
    return [tuple(int(x) for x in v.split(".")) for v in re.findall(r"3\.\d+", m.group(1))]


def _lowest(spec: str | None) -> tuple[int, int]:
    """The lowest 3.x a Requires-Python specifier allows (>=3.10, >=3.9, !=3.9.0 ...)."""
    from packaging.specifiers import SpecifierSet

    s = SpecifierSet(spec or "")
    return next(((3, m) for m in range(0, 30) if any(s.contains(f"3.{m}.{p}") for p in range(0, 20))), (3, 99))


def python_support() -> tuple[tuple[int, int], tuple[int, int], dict[str, str]]:
    """(lowest Python every pin of requirements-runtime.lock installs on, highest Python every
    compiled pin declares, {pin: why}) from the installed distributions' metadata (the locked
    versions: test_the_environment_is_the_locked_one). The lowest: the highest Requires-Python
    lower bound (pip refuses a distribution below it). The highest: a compiled distribution ships
    wheels per Python version, and its "Programming Language :: Python :: 3.N" classifiers name
    the ones its release supports (numpy 1.26.4: 3.9 to 3.12); classifiers that name only Pythons
    below the lowest (an unmaintained list, e.g. brotli's 3.3-3.5) or none say nothing and count
    not. docs/hardening.md, "Which Pythons"."""
    from importlib import metadata

    low, high, why = (3, 0), (3, 99), {}
    for name, version in _pins(RUNTIME).items():
        dist = metadata.distribution(name)
        assert dist.version == version, f"{name} {dist.version} installed, the lock has {version}: bash scripts/setup"
        lo = _lowest(dist.metadata.get("Requires-Python"))
        if lo > low:
            low, why["low"] = lo, f"{name}=={version} Requires-Python {dist.metadata.get('Requires-Python')}"
        if "Root-Is-Purelib: true" in (dist.read_text("WHEEL") or ""):
            continue
        said = [tuple(int(x) for x in c.rsplit("::", 1)[1].strip().split("."))
                for c in dist.metadata.get_all("Classifier") or []
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
        if said and max(said) >= low and max(said) < high:
            high, why["high"] = max(said), f"{name}=={version} (compiled) declares Python up to 3.{max(said)[1]}"
    return low, high, why


def test_readme_names_exactly_the_pythons_the_runtime_lock_installs_on():
    """README said "Python 3.10 or newer", but numpy==1.26.4 has no wheel for 3.13 and four pins
    require 3.11: README's list is every Python from the lock's lowest to its highest."""
    low, high, why = python_support()
    names = _readme_pythons()
    want = [(3, m) for m in range(low[1], high[1] + 1)]
    assert names == want, (f"README's Install names Python {', '.join(f'3.{m}' for _, m in names)}, the runtime "
                           f"lock installs on {', '.join(f'3.{m}' for _, m in want)} ({why})")


@pytest.mark.parametrize(("spec", "lowest"), [(">=3.10", (3, 10)), (">=3.9, !=3.9.0, !=3.9.1", (3, 9)),
                                              ("!=3.0.*,!=3.1.*,!=3.2.*,>=2.7", (3, 3)), (None, (3, 0)),
                                              ("<4.0,>=3.10", (3, 10))])
def test_lowest_python_of_a_specifier(spec, lowest):
    assert _lowest(spec) == lowest
