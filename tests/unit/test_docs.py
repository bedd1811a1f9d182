"""The docs stay true: every module of the package is in docs/architecture.md's layer table, every
dotted ``tritonfleet.x.y`` name in the docs, README.md and the package's docstrings resolves, and
the tunables command has one name for operators."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tritonfleet"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOTTED = re.compile(r"(?<![\w./-])tritonfleet(?:\.[A-Za-z_]\w*)+")
#: dotted words that are not Python names: the project's mail domain, the entry point group of
#: commands other packages add (tritonfleet.cli.COMMANDS_GROUP)
NOT_NAMES = {"tritonfleet.invalid", "tritonfleet.commands"}


def package_modules() -> list[str]:
    """Every module of the package, dotted (packages' __init__ as the package's own name)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "skeleton" in parts or "templates" in parts or "data" in parts:
            continue
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def table_rows(text: str) -> list[tuple[str, str]]:
    """(first cell, whole row) of every markdown table row."""
    return [(line.split("|")[1].strip(), line) for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|---") and line.count("|") >= 3]


def missing_from_table(text: str, modules: list[str]) -> list[str]:
    """Modules the table does not name: a domain's module (or a sub-package's) by its name in
    backticks in a row whose first cell is the domain (`` `gpu/` ``, `` `fleet.inventory` ``);
    a top-level module by its own row."""
    section = text[text.index("## The layers, bottom up"):text.index("## The rules")]  # not the history's table
    rows = table_rows(section)
    missing = []
    for module in modules:
        parts = module.split(".")[1:]
        if not parts:
            continue
        if len(parts) == 1:  # top level: tritonfleet/preflight.py, a domain package, __main__
            name = parts[0]
            if not any(re.search(rf"`(tritonfleet\.)?{re.escape(name)}/?`", first) for first, _ in rows):
                missing.append(module)
            continue
        domain, name = parts[0], parts[-1]
        domain_rows = [row for first, row in rows if f"`{domain}/`" in first or f"`{domain}." in first]
        named = (f"`{name}`", f"`{name}/`", f"`{domain}.{'.'.join(parts[1:])}`")
        if not any(n in row for row in domain_rows for n in named):
            missing.append(module)
    return missing


def test_every_module_is_in_the_architecture_table():
    missing = missing_from_table(ARCHITECTURE.read_text(), package_modules())
    assert not missing, "docs/architecture.md's layer table does not name:\n" + "\n".join(missing)


def test_the_table_check_finds_a_missing_module():
    text = ARCHITECTURE.read_text()
    assert missing_from_table(text.replace("`signals`", "`signal_table`"), package_modules()) == [
        "tritonfleet.gpu.signals"]
    assert missing_from_table(text.replace("| `tritonfleet.limits` |", "| limits |"), package_modules()) == [
        "tritonfleet.limits"]


def resolves(dotted: str) -> bool:
    """Import the longest importable prefix, getattr the rest."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((getattr(node, "lineno", 1), doc))
    return out


def dotted_names() -> list[tuple[str, str]]:
    """(where, name) of every dotted tritonfleet name in the docs, README.md and docstrings."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found += [(f"{path.relative_to(ROOT)}:{n}", m) for m in DOTTED.findall(line)]
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, doc in docstrings(path):
            found += [(f"{path.relative_to(ROOT)}:{n}", m) for m in DOTTED.findall(doc)]
    return [(where, name) for where, name in found if name not in NOT_NAMES]


def test_every_dotted_name_resolves():
    names = dotted_names()
    assert len(names) > 100
    stale = [f"{where}: {name}" for where, name in names if not resolves(name)]
    assert not stale, "names that are no module or attribute:\n" + "\n".join(stale)


def test_a_stale_name_is_found():
    assert resolves("tritonfleet.gpu.signals.ALERTS") and resolves("tritonfleet.fleet.pull.host_run")
    assert not resolves("tritonfleet.cli.Main") and not resolves("tritonfleet.gpu.signals.NO_SUCH")


def test_the_tunables_command_has_one_name():
    """Operators read ``python -m tritonfleet.tunables``; tritonfleet.settings.table's own name
    stays working (tests/integration/cli/test_bad_input.py) but is named only in that module."""
    old = "python -m tritonfleet.settings.table"
    places = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "inventories").rglob("*.py"),
              *(PACKAGE / "skeleton").rglob("*"), *PACKAGE.rglob("*.py")]
    named = [str(p.relative_to(ROOT)) for p in places
             if p.is_file() and "__pycache__" not in p.parts and old in p.read_text()]
    assert sorted(named) == ["docs/architecture.md", "tritonfleet/settings/table.py", "tritonfleet/tunables.py"], named


def public_steps_and_operations() -> list[tuple[str, ast.FunctionDef]]:
    """(where, function) of every public ``@operation`` and step (``tritonfleet_step``, ``@deploy``)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                decorators = [ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1]
                              for d in node.decorator_list]
                if {"operation", "deploy", "tritonfleet_step"} & set(decorators):
                    out.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node))
    return out


def docstring_problems(node: ast.FunctionDef) -> list[str]:
    """What a pyinfra-style docstring lacks: a summary, a ``+ param:`` line per parameter, what it
    changes, its tunables (real ones, or none) and an example."""
    from tritonfleet.settings.defaults import DEFAULTS

    doc = ast.get_docstring(node)
    if not doc:
        return ["no docstring"]
    problems = []
    if not doc.splitlines()[0].strip():
        problems.append("no summary line")
    params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    problems += [f"no '+ {p}:' line" for p in params if not re.search(rf"^\+ {p}: \S", doc, re.M)]
    problems += [f"no '{w}' paragraph" for w in ("Changes:", "Tunables:") if not re.search(rf"^{w} \S", doc, re.M)]
    tunables = re.search(r"^Tunables: (.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    if tunables:
        problems += [f"Tunables names {t!r}, no tunable" for t in re.findall(r"``(\w+)``", tunables.group(1))
                     if t not in DEFAULTS]
    if not re.search(r"^\*\*Example:\*\*\n\n\.\. code:: python\n\n    \S", doc, re.M):
        problems.append("no **Example:** block")
    return problems


def test_every_public_step_and_operation_has_a_pyinfra_docstring():
    found = public_steps_and_operations()
    assert len([w for w, _ in found if "/steps/" in w and "record_" not in w]) >= 16, found
    bad = [f"{where}: {p}" for where, node in found for p in docstring_problems(node)]
    assert not bad, "\n".join(bad)


def test_the_docstring_check_finds_what_is_missing():
    def fn(src: str) -> ast.FunctionDef:
        return ast.parse(src).body[0]

    good = ('def step(load: bool = True):\n    """Summary.\n\n    + load: what\n\n    Changes: x.\n\n'
            '    Tunables: ``triton_image``.\n\n    **Example:**\n\n    .. code:: python\n\n        step()\n    """\n')
    assert docstring_problems(fn(good)) == []
    assert docstring_problems(fn(good.replace("load: bool", "load: bool, other: int"))) == ["no '+ other:' line"]
    assert docstring_problems(fn(good.replace("triton_image", "no_such_tunable"))) == [
        "Tunables names 'no_such_tunable', no tunable"]
    assert docstring_problems(fn(good.replace("**Example:**", "Example"))) == ["no **Example:** block"]
    assert docstring_problems(fn("def step():\n    pass\n")) == ["no docstring"]


def test_every_step_is_a_tritonfleet_step_and_required_is_called_once():
    """The steps' refusal without install() lives in one decorator (tritonfleet.pyinfra_patches),
    not in a copy per step: required( is called in it and in pre-flight's entry point only."""
    steps = [where for where, node in public_steps_and_operations() if "/steps/" in where
             and "tritonfleet_step" in ast.unparse(node.decorator_list[0])]
    plain = [where for where, node in public_steps_and_operations()
             if any(ast.unparse(d).startswith("deploy(") for d in node.decorator_list)]
    assert len(steps) >= 16 and not plain, plain
    calls = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in sorted(PACKAGE.rglob("*.py"))
             for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call)
             and ast.unparse(n.func).split(".")[-1] == "required"]
    assert [c.split(":")[0] for c in calls] == ["tritonfleet/preflight.py", "tritonfleet/pyinfra_ext/install.py"], calls
