"""Every import in the benchmarks resolves on a fresh clone: bench/*.py import most of what they
use inside functions (a measurement loads only what it needs), so a module moved or renamed in the
package or the test tooling breaks a benchmark only when that measurement runs, possibly an hour
into it. Each import statement anywhere in a bench module is resolved the way the benchmark's
process resolves it (the checkout and bench/ on sys.path, the way bench/run.py sets them)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from tritonfleet import ROOT

BENCH = Path(ROOT) / "bench"
MODULES = sorted(BENCH.glob("*.py"))


def imported(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import in ``path``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def test_there_are_benchmarks_to_check():
    assert {p.name for p in MODULES} >= {"run.py", "dataplane.py", "pull_bare.py", "scale.py"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_import_of_a_benchmark_resolves(path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(ROOT), str(BENCH), *sys.path])
    missing = []
    for line, module, names in imported(path):
        if module.split(".")[0] == "ansible":  # the Ansible anchor's own virtualenv (bench/setup)
            continue
        spec = importlib.util.find_spec(module)
        if spec is None:
            missing.append(f"{path.name}:{line}: {module}")
            continue
        if names and spec.origin and spec.origin.endswith(".py") and spec.submodule_search_locations is None \
                and Path(spec.origin).resolve().is_relative_to(Path(ROOT).resolve()):
            # a plain module of this checkout: every name asked for is defined in it (moved away?)
            tree = ast.parse(Path(spec.origin).read_text())
            defined = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                       if isinstance(t, ast.Name)}
            defined |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                                      ast.AsyncFunctionDef))}
            defined |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            defined |= {(a.asname or a.name).split(".")[0] for n in tree.body
                        if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
            if "*" not in defined:  # a star import (a façade) defines what its source does
                missing += [f"{path.name}:{line}: {module}.{name}" for name in names if name not in defined]
    assert not missing, "imports a benchmark cannot resolve:\n" + "\n".join(missing)
