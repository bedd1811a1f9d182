"""Writes requirements-runtime.lock: the part of requirements.lock a tritonfleet installation needs
(the package's own dependencies in pyproject.toml, and theirs), entry for entry as pip-compile
wrote it there (version, every hash, its "via" lines), so an operator installs exactly the
versions the tests ran against without the tests' own tools (pytest, onnxruntime, the bundled
tritonserver). `bash scripts/lock` runs it after pip-compile; tests/unit/test_requirements_lock.py checks the file is
what this writes.

Which entries: the dependencies named in pyproject.toml's [project] dependencies, then every
entry that requirements.lock says is there "via" one already taken (pip-compile's record of who
required it), until nothing is added. Standard library only (run by the system's python3).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = """\
#
# The part of requirements.lock a tritonfleet installation needs (no test tools), written by
# scripts/runtime_lock.py from requirements.lock (`bash scripts/lock` runs it). Install:
#
#    pip install --require-hashes --no-deps -r requirements-runtime.lock
#    pip install --no-deps dist/tritonfleet-<version>-py3-none-any.whl
#
"""


#: the optional parts with a lock of their own (requirements-<name>.lock)
OPTIONAL = ("s3",)
OPTIONAL_HEADER = """\
#
# What tritonfleet's optional part "{name}" adds to requirements-runtime.lock, entry for entry as
# requirements.lock has it, written by scripts/runtime_lock.py (`bash scripts/lock` runs it).
# Install it after requirements-runtime.lock:
#
#    pip install --require-hashes --no-deps -r requirements-{name}.lock
#
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(lock: str) -> dict[str, tuple[str, set[str]]]:
    """{canonical name: (the entry's text, the names it is there via)} of a pip-compile lock."""
    out = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", lock):
        head = block.split("\n", 1)[0]
        m = re.match(r"([A-Za-z0-9_.-]+)==", head)
        if not m:
            continue
        via: set[str] = set()
        lines = block.splitlines()
        for i, line in enumerate(lines):
            s = line.strip()
            if s.startswith("# via "):
                via.add(s[len("# via "):].strip())
            elif s == "# via":
                for more in lines[i + 1:]:
                    if more.strip().startswith("#   "):
                        via.add(more.strip()[1:].strip())
        out[canonical(m.group(1))] = (block.rstrip("\n") + "\n", {canonical(v.split(" ")[0]) for v in via})
    return out


def dependencies(pyproject: str) -> list[str]:
    """Canonical names of pyproject.toml's [project] dependencies (extras and specifiers dropped)."""
    block = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.M | re.S).group(1)
    return [canonical(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in re.findall(r'^\s*"([^"]+)"', block, re.M)]


def extra(pyproject: str, name: str) -> list[str]:
    """Canonical names of the distributions pyproject.toml's optional dependency ``name`` adds."""
    block = re.search(rf"^{name} = \[(.*?)\]", pyproject, re.M | re.S).group(1)
    return [canonical(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in re.findall(r'"([^"]+)"', block)]


def _closure(all_entries: dict[str, tuple[str, set[str]]], roots: list[str]) -> set[str]:
    """``roots`` and every entry requirements.lock says is there "via" one already taken."""
    needed = set(roots)
    missing = needed - set(all_entries)
    if missing:
        raise SystemExit(f"requirements.lock lacks {', '.join(sorted(missing))}: run `bash scripts/lock`")
    grown = True
    while grown:
        grown = False
        for name, (_, via) in all_entries.items():
            if name not in needed and via & needed:
                needed.add(name)
                grown = True
    return needed


def runtime(lock: str, pyproject: str) -> str:
    """The text of requirements-runtime.lock."""
    all_entries = entries(lock)
    needed = _closure(all_entries, dependencies(pyproject))
    return HEADER + "".join(text for name, (text, _) in all_entries.items() if name in needed)


def optional(lock: str, pyproject: str, name: str) -> str:
    """The text of requirements-<name>.lock: what the optional part ``name`` (pyproject.toml's
    [project.optional-dependencies]) adds to requirements-runtime.lock, installed after it."""
    all_entries = entries(lock)
    base = _closure(all_entries, dependencies(pyproject))
    needed = _closure(all_entries, extra(pyproject, name)) - base
    return OPTIONAL_HEADER.format(name=name) + "".join(
        text for entry, (text, _) in all_entries.items() if entry in needed)


def main() -> None:
    text = runtime((ROOT / "requirements.lock").read_text(), (ROOT / "pyproject.toml").read_text())
    (ROOT / "requirements-runtime.lock").write_text(text)
    print(f"requirements-runtime.lock: {text.count('==')} packages", file=sys.stderr)
    pyproject = (ROOT / "pyproject.toml").read_text()
    for name in OPTIONAL:
        text = optional((ROOT / "requirements.lock").read_text(), pyproject, name)
        (ROOT / f"requirements-{name}.lock").write_text(text)
        print(f"requirements-{name}.lock: {text.count('==')} packages", file=sys.stderr)


if __name__ == "__main__":
    main()
