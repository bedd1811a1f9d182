"""The layers of the package (docs/architecture.md), read from every import of every module with
``ast``, a function's own imports included: imports point down only, no module imports another
of its own layer's domains, there is no import cycle (between modules or between packages), only
operations and steps import a module that defines pyinfra operations (the read side never does),
and only steps, operations and pre-flight read the host being deployed (the rest is given a
``Settings``)."""

from __future__ import annotations

import ast

import pytest

from tests.unit.test_structure import ROOT, imported, module_name

#: bottom first. A module may import its own layer and the layers below; the domains of one
#: layer (a tuple) import nothing of each other. ``tritonfleet`` itself (its __init__: the
#: package's resources and version) is below everything.
LAYERS: list[tuple[str, ...]] = [
    ("tritonfleet.core",),  # plumbing: imports nothing else of tritonfleet
    ("tritonfleet.settings",),  # the tunables and the one accessor
    ("tritonfleet.pyinfra_ext",),  # every use of pyinfra's internals
    ("tritonfleet.gpu",),  # GPU facts, rules, placement, the loss guard's rule
    ("tritonfleet.host", "tritonfleet.model_repo"),  # driver/Docker/toolkit; the model repository
    ("tritonfleet.serving",),  # Triton on one host
    ("tritonfleet.inventory",),  # the inventory model: hosts, groups, their data, as the fleet commands read them
    ("tritonfleet.observability",),  # metrics, Prometheus, tune, load test
    ("tritonfleet.fleet",),  # status (probe), the rollout and its performance gate
    ("tritonfleet.preflight",),  # deploy-time read-only checks
    ("tritonfleet.steps",),  # the @deploy steps
    ("tritonfleet.cli",),  # the command line
    ("tritonfleet.__main__",),  # the console script: gevent's patches first, then the command line
    # kept for operators' deploy files and inventories: nothing in the package imports them
    ("tritonfleet.limits", "tritonfleet.defaults", "tritonfleet.tunables", "tritonfleet.pyinfra_patches"),
]
FACADES = LAYERS[-1]


def modules() -> dict[str, object]:
    return {module_name(p): p for p in sorted((ROOT / "tritonfleet").rglob("*.py")) if "skeleton" not in p.parts}


def graph() -> dict[str, dict[str, int]]:
    """module -> {module of the package it imports: line}."""
    mods = modules()
    out: dict[str, dict[str, int]] = {}
    for m, p in mods.items():
        found = [(line, name) for line, name in imported(p) if name in mods and name != m]
        # `from tritonfleet.inventory import roster` imports the module, not the package around it
        through = {(line, name.rpartition(".")[0]) for line, name in found}
        edges: dict[str, int] = {}
        for line, name in found:
            if (line, name) not in through:
                edges.setdefault(name, line)
        out[m] = edges
    return out


def place(module: str) -> tuple[int, str] | None:
    """(layer index, domain) of ``module``: its longest matching prefix."""
    best = None
    for i, domains in enumerate(LAYERS):
        for d in domains:
            if (module == d or module.startswith(d + ".")) and (best is None or len(d) > len(best[1])):
                best = (i, d)
    return best


def test_every_module_has_its_layer():
    unplaced = sorted(m for m in modules() if m != "tritonfleet" and place(m) is None)
    assert not unplaced, f"modules outside every layer (add them to a package of docs/architecture.md): {unplaced}"


def test_imports_point_down_only():
    bad = []
    for m, edges in graph().items():
        here = place(m)
        for target, line in edges.items():
            if target == "tritonfleet" or here is None:
                continue
            there = place(target)
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1]):
                bad.append(f"{m}:{line} imports {target} ({here[1]} -> {there[1]})")
    assert not bad, "imports against the layers (docs/architecture.md):\n" + "\n".join(bad)


def test_nothing_in_the_package_imports_the_facades():
    bad = [f"{m}:{line} imports {t}" for m, edges in graph().items() if m not in FACADES
           for t, line in edges.items() if t in FACADES]
    assert not bad, "\n".join(bad)


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    """Not even through a function's own import (where a cycle would hide)."""
    # a package's __init__ that re-exports its modules is one with them: not a cycle of its own
    g = {m: {t: line for t, line in edges.items() if not t.startswith(m + ".")} for m, edges in graph().items()}
    assert cycles(g) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


#: where a function may read the host pyinfra is deploying now (``access.get``,
#: ``access.current``): the deploy steps, the operations and pre-flight start there and pass a
#: ``Settings`` down; the accessor defines them.
AMBIENT_READERS = ("tritonfleet.steps", "tritonfleet.preflight", "tritonfleet.settings.access")


def reads_ambient_allowed(module: str) -> bool:
    return (any(module == a or module.startswith(a + ".") for a in AMBIENT_READERS)
            or "ops" in module.split("."))  # an operations module or package: */ops/, model_repo.ops


def ambient_reads(path, name: str | None = None) -> list[tuple[int, str]]:
    """(line, call) of every read of the current host in ``path``: ``access.get(...)`` or
    ``access.current()`` through the module ``tritonfleet.settings.access`` under any name, or
    ``get``/``current`` imported from it; and (line, "access as NAME") for the module imported
    under another name. ``name``: the module's dotted name (else from ``path``)."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    modules_as: set[str] = set()
    functions_as: set[str] = set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                if source == "tritonfleet.settings" and a.name == "access":
                    modules_as.add(a.asname or a.name)
                    if a.asname and a.asname != "access":
                        found.append((node.lineno, f"access as {a.asname}"))
                elif source == "tritonfleet.settings.access" and a.name in ("get", "current"):
                    functions_as.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "tritonfleet.settings.access" and a.asname:
                    modules_as.add(a.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if ((isinstance(f, ast.Attribute) and f.attr in ("get", "current") and isinstance(f.value, ast.Name)
                 and f.value.id in modules_as) or (isinstance(f, ast.Name) and f.id in functions_as)):
                found.append((node.lineno, ast.unparse(f)))
    return found


def test_settings_are_passed_explicitly():
    """A function outside the steps, the operations and pre-flight takes a ``settings: Settings``
    from its caller instead of reading the host pyinfra is deploying now: so it serves a
    ``FleetHost`` (status, the rollout) or a per-GPU ``Overlay`` as well, with no pyinfra State.
    The accessor is called by its name (no ``access as config``)."""
    bad = []
    for m, p in modules().items():
        for line, what in sorted(ambient_reads(p)):
            if what.startswith("access as ") or not reads_ambient_allowed(m):
                bad.append(f"{p.relative_to(ROOT)}:{line}: {what}")
    assert not bad, ("the current host read outside the steps, operations and pre-flight (take a "
                     "`settings: Settings` parameter; the caller passes access.current() or a FleetHost), or "
                     "the accessor under another name:\n" + "\n".join(bad))


def test_the_ambient_read_finder_finds_them(tmp_path):
    mod = tmp_path / "probe.py"
    mod.write_text("from ..settings import access as config\nfrom ..settings.access import current\n\n"
                   "def f():\n    return config.get('x'), current()\n")
    assert [w for _, w in ambient_reads(mod, "tritonfleet.serving.probe")] == [
        "access as config", "config.get", "current"]
    assert reads_ambient_allowed("tritonfleet.serving.ops.lb") and reads_ambient_allowed("tritonfleet.model_repo.ops")
    assert not reads_ambient_allowed("tritonfleet.serving.images")


def package_of(module: str, path) -> str:
    """The package ``module`` belongs to: itself for a package's __init__, else its parent; a
    module at the top of tritonfleet (``preflight``, the operator API) stands for itself."""
    if path.name == "__init__.py":
        return module
    parent = module.rpartition(".")[0]
    return module if parent == "tritonfleet" else parent


def package_graph() -> dict[str, dict[str, str]]:
    """package -> {package it imports: "module:line -> module", the first such import}. A package
    and its own subpackages are one: a subpackage may use its parent's modules (``validate`` reads
    ``model_repo.contents``, which the deploy side reads too) and the parent its subpackages."""
    mods = modules()
    out: dict[str, dict[str, str]] = {}
    for m, edges in graph().items():
        a = package_of(m, mods[m])
        for t, line in edges.items():
            b = package_of(t, mods[t])
            if a == b or a.startswith(b + ".") or b.startswith(a + "."):
                continue
            out.setdefault(a, {}).setdefault(b, f"{m}:{line} -> {t}")
    return out


def test_no_package_level_import_cycle():
    """No two packages import each other, even through other packages (``fleet.rollout`` ->
    ``fleet.runner`` -> ``fleet.rollout`` would be one): each package can be read, tested and moved
    with only what is below it."""
    g = package_graph()
    found = cycles(g)
    where = [f"{a}: {v}" for c in found for a in c for b, v in g.get(a, {}).items() if b in c]
    assert found == [], "package-level import cycles:\n" + "\n".join(where)


def test_the_package_graph_sees_a_cycle_between_sibling_packages(monkeypatch):
    real = graph()
    assert "tritonfleet.fleet.runner" in package_graph().get("tritonfleet.fleet.rollout", {})
    with_back_edge = {**real, "tritonfleet.fleet.runner.workers": {
        **real["tritonfleet.fleet.runner.workers"], "tritonfleet.fleet.rollout.plan": 1}}
    monkeypatch.setitem(globals(), "graph", lambda: with_back_edge)
    assert ["tritonfleet.fleet.rollout", "tritonfleet.fleet.runner"] in cycles(package_graph())


def defines_operations(path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                name = ast.unparse(d.func if isinstance(d, ast.Call) else d)
                if name.split(".")[-1] in ("operation", "deploy", "tritonfleet_step"):
                    return True
    return False


def test_only_operations_and_steps_import_operations():
    """The read side (status, probe, rollout planning, pre-flight, tune, loadtest, the CLI) and
    every pure module import no module that defines pyinfra operations or deploys: reading a host
    can never plan a change."""
    mods = modules()
    ops = {m for m, p in mods.items() if defines_operations(p)}
    assert {"tritonfleet.pyinfra_ext.check", "tritonfleet.host.ops.reboot", "tritonfleet.steps.triton"} <= ops
    bad = [f"{m}:{line} imports {t}" for m, edges in graph().items()
           if m not in ops and not m.startswith("tritonfleet.steps") and m not in FACADES
           for t, line in edges.items() if t in ops]
    assert not bad, "operations imported outside operations and steps:\n" + "\n".join(bad)


@pytest.mark.parametrize("domain", ["core", "settings", "pyinfra_ext", "gpu", "host", "model_repo", "serving",
                                    "observability", "fleet", "steps", "cli"])
def test_every_domain_is_a_package(domain):
    assert (ROOT / "tritonfleet" / domain / "__init__.py").is_file()


def test_no_module_is_over_750_lines_but_data_tables():
    """A module that grows past ~600 lines of the compact style (750 as ``ruff format`` wraps them:
    the formatter added about a fifth) mixes concerns: split it along its seams. Data tables (the
    tunables, apt's messages) may be longer."""
    tables = {"tritonfleet/settings/defaults.py"}
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted((ROOT / "tritonfleet").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 750 and p.relative_to(ROOT).as_posix() not in tables]
    assert not long, "\n".join(long)


def test_tests_are_laid_out_like_the_source():
    """tests/unit/<domain>/ for the pure, fast tests of each package (and of the bench and the
    test tooling), tests/integration/<domain>/ (the same domains) for those that start real servers
    or programs, tests/testbed/ for those that run test hosts (the last two marked by their
    directory: tests/conftest.py), tests/support/ for the helpers; no test file elsewhere, and
    every test directory a package (a file of the same name in both tiers stays two modules)."""
    tests = ROOT / "tests"
    domains = {p.name for p in (ROOT / "tritonfleet").iterdir() if (p / "__init__.py").is_file()}
    misplaced = [str(p.relative_to(ROOT)) for p in tests.glob("test_*.py")]
    for tier in ("unit", "integration"):
        misplaced += [str(p.relative_to(ROOT)) for p in (tests / tier).iterdir()
                      if p.is_dir() and p.name != "__pycache__" and p.name not in domains | {"bench", "testbed_tooling"}]
        misplaced += [f"{p.relative_to(ROOT)} (no __init__.py)" for p in [tests / tier, *(tests / tier).iterdir()]
                      if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").is_file()]
    misplaced += [str(p.relative_to(ROOT)) for p in (tests / "support").glob("test_*.py")]
    assert not misplaced, ("test files outside tests/unit/<domain>/, tests/integration/<domain>/ and "
                           f"tests/testbed/: {misplaced}")
    markers = ["pytest" + ".mark." + m for m in ("testbed", "integration")]  # (not written out: this file would match)
    marked = [str(p.relative_to(ROOT)) for p in tests.rglob("test_*.py")
              if any(m in p.read_text() for m in markers) or "\npytestmark" in p.read_text()]
    assert not marked, f"the tiers' markers come from the directory (tests/testbed/, tests/integration/), not the file: {marked}"


#: the modules' names before the move to the layers, kept as aliases (``import X as Y``): a reader
#: of ``pergpu.enabled`` had to go back to the import block to find ``serving.per_gpu``. A module
#: is called by its own name; where a local name collides, the local is renamed (or the few names
#: used are imported). ``access as config`` joins this list once the settings are passed
#: explicitly everywhere (its sites read the current host).
PRE_MOVE_ALIASES = {
    ("inventory", "fleet"), ("install", "pyinfra_patches"), ("per_gpu", "pergpu"), ("report", "failure"),
    ("report", "failure_lib"), ("nvidia_repos", "vendorfacts"), ("guard", "gpuguard"), ("release", "release_plan"),
    ("placement", "gpucount"), ("open_files", "limits"), ("boot_kernel", "kernel"), ("signing_keys", "keys"),
    ("render", "models"), ("traffic", "rollout_traffic"), ("state", "rollout_state"), ("canary", "canary_mod"),
    ("access", "config"),
}


def test_no_pre_move_alias():
    found = []
    for m, p in modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [f"{m}:{node.lineno}: {a.name} as {a.asname}" for a in node.names
                          if (a.name.rpartition(".")[2], a.asname) in PRE_MOVE_ALIASES]
    assert not found, "modules imported under their names before the move (call them by their own):\n" + "\n".join(found)


def test_no_private_name_is_imported_across_modules():
    """A name with a leading underscore stays in its module: a name other modules use is public
    (no underscore), or it moves. A private module (``_name.py``) may be imported by the modules
    of its own package, as community.docker's ``module_utils/_*.py`` are."""
    found = []
    for m, p in modules().items():
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for line, name in imported(p):
            private = [part for part in name.split(".") if part.startswith("_") and not part.startswith("__")]
            if not private:
                continue
            owner = name.rpartition(".")[0]
            if owner in modules() and not owner.rpartition(".")[2].startswith("_") and owner != m:
                found.append(f"{m}:{line}: {name}")  # a private name of another module
            elif name in modules() and name.rpartition(".")[0] != package:
                found.append(f"{m}:{line}: {name} (a private module of another package)")
    assert not found, "private names imported across modules (drop the underscore, or move the name):\n" + "\n".join(found)


def test_no_class_name_is_defined_twice():
    """One meaning per name: two classes of one name (three ``Origin``s, three ``Settings`` once)
    make a reader, a traceback and a type annotation ambiguous. A class names what it is
    (``PullSite``, ``CanaryPolicy``, ``TuneThresholds``, ``ValueSources``)."""
    where: dict[str, list[str]] = {}
    for m, p in modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{m}:{node.lineno}")
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, "class names defined more than once (rename all but one):\n" + "\n".join(
        f"{name}: {', '.join(places)}" for name, places in sorted(twice.items()))


# ------------------------------------------------- imports at module level, but for a listed set

#: third-party packages a function may import for itself: optional, or heavy for the commands and
#: deploys that never use them (figures: docs/scale.md, "What start-up imports")
LAZY_PACKAGES = {
    "boto3": "optional extra (s3): only an s3:// model origin needs it",
    "botocore": "boto3's: the same extra",
    "matplotlib": "optional extra (plot): only `tritonfleet loadtest --plot`",
    "onnx": "heavy: only validate's ONNX signature check reads a model.onnx",
    "google.protobuf": "protobuf's formats: only where a model config is parsed or written",
    "tritonclient": "heavy (gRPC stubs): only where a model config is parsed, and the load test's clients",
    "aiohttp": "the load test's HTTP client",
    "grpc": "the load test's gRPC client",
    "prometheus_client": "only tune's parser, the rollout's exporter and the metrics reads",
    "requests": "not loaded by `tritonfleet --help`: only a model origin over HTTP uses it on the control side",
    "gevent": "gevent.fileobject only for the deploy lock's pipe; the canary watchdog runs without gevent too",
    "pyinfra_cli": "importing pyinfra_cli patches the process for gevent (its __init__): only commands that "
                   "load an inventory through pyinfra's loader import it",
}

#: modules whose functions may import anything (they import what a command runs)
LAZY_MODULES = {
    "tritonfleet.cli": "the command bodies: `tritonfleet --help` and each command import only what they run",
    "tritonfleet.__main__": "gevent patches the standard library before the command line is imported",
}

#: (module, the module it imports inside a function): measured start-up costs. Each one at module
#: level would add modules to what `tritonfleet --help` imports (H) or to what a deploy file's
#: steps import for a host's no-op (D): bench/run.py noop-installed, docs/scale.md
LAZY_EDGES = {
    ("tritonfleet.fleet.probe", "tritonfleet.serving.images"): "H: images and its requests",
    ("tritonfleet.gpu.facts", "tritonfleet.pyinfra_ext.memo"): "H: the facts' memo and pyinfra's state",
    ("tritonfleet.gpu.placement", "tritonfleet.core.triton_schema"): "H, D: Triton's config schema (protobuf)",
    ("tritonfleet.model_repo.render", "tritonfleet.core.triton_schema"): "H, D: Triton's config schema (protobuf)",
    ("tritonfleet.model_repo.render", "tritonfleet.model_repo.derived"): "H, D: the remembered keys (protobuf)",
    ("tritonfleet.model_repo.origin", "tritonfleet.model_repo.release"): "H: the release layout",
    ("tritonfleet.pyinfra_ext.probes", "tritonfleet.pyinfra_ext.hostlock"): "H: the deploy lock and gevent's pipe",
    ("tritonfleet.serving.unit", "tritonfleet.serving.drain"): "H: the drain and its requests",
    ("tritonfleet.model_repo.ops", "tritonfleet.model_repo.fetch"): "D: only a release from a model origin",
    ("tritonfleet.model_repo.ops", "tritonfleet.model_repo.origin"): "D: only a release from a model origin",
    ("tritonfleet.steps.triton", "tritonfleet.model_repo.origin"): "D: only a release from a model origin",
    ("tritonfleet.serving.health", "tritonfleet.serving.warmup"): "D: only a gate that warms models up",
    ("tritonfleet.steps.triton", "tritonfleet.steps.rollback"): "D: only auto_rollback after a failed gate",
    ("tritonfleet.model_repo.verdicts", "tritonfleet.model_repo.validate"):
        "D: a converged host's pre-flight answers from the verdict, without the validator and protobuf "
        "(tests/integration/model_repo/test_verdicts.py)",
    ("tritonfleet.serving.warmup", "tritonfleet.model_repo.validate"):
        "D: the warm-up plan is remembered: the validator and protobuf only when it is not (the same test)",
}

#: the functions that still read the current host's settings for themselves import the accessor
#: where they read it; they go with those reads (settings passed explicitly: docs/architecture.md)
CURRENT_HOST_READS = {("tritonfleet.gpu.facts", "tritonfleet.settings.access"),
                      ("tritonfleet.model_repo.render", "tritonfleet.settings.access"),
                      ("tritonfleet.serving.health", "tritonfleet.settings.access"),
                      ("tritonfleet.serving.per_gpu", "tritonfleet.settings.access")}


def function_imports(path) -> tuple[list[tuple[int, str, list[str]]], set[tuple[str, str]]]:
    """(line, source module, [module.name for each name]) of every import inside a function of
    ``path``, and the (module, name) pairs its module level imports."""
    m = module_name(path)
    package = m if path.name == "__init__.py" else m.rpartition(".")[0]

    def source(node) -> str:
        if isinstance(node, ast.Import):
            return node.names[0].name
        if node.level:
            return ".".join(package.split(".")[: len(package.split(".")) - (node.level - 1)] + ([node.module] if node.module else []))
        return node.module or ""

    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {(a.name, a.asname or "") for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            top |= {(source(node), f"{a.name} as {a.asname or a.name}") for a in node.names}
    inner = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    src = source(node)
                    again = all((a.name, a.asname or "") in top for a in node.names) if isinstance(node, ast.Import) \
                        else all((src, f"{a.name} as {a.asname or a.name}") in top for a in node.names)
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                        [src] + [f"{src}.{a.name}" for a in node.names]
                    inner.append((node.lineno, src, names, again))
    return [(line, src, names) for line, src, names, again in inner if not again], \
        {(m, src) for line, src, names, again in inner if again}


def lazy_reason(m: str, src: str, names: list[str], mods) -> str | None:
    """Why ``m`` may import ``src`` (``names``) inside a function (None: it may not)."""
    for pkg, why in LAZY_PACKAGES.items():
        if any(n == pkg or n.startswith(pkg + ".") for n in [src, *names]):
            return why
    for prefix, why in LAZY_MODULES.items():
        if m == prefix or m.startswith(prefix + "."):
            return why
    targets = [n for n in names[1:] if n in mods] or [src]  # `from package import module`: the module
    if all((m, t) in LAZY_EDGES or (m, t) in CURRENT_HOST_READS for t in targets):
        return "listed"
    return None


def test_imports_are_at_module_level_but_a_listed_set():
    """A module's dependencies are in its import block: a function imports for itself only an
    optional or heavy package, a command body of the CLI, or what a measured start-up cost keeps
    out of `tritonfleet --help` and a deploy's no-op (the lists above, each with its reason). No
    function imports again what its module imports at the top."""
    mods = modules()
    bad, again, used = [], [], set()
    for m, p in mods.items():
        inner, reimports = function_imports(p)
        again += [f"{m}: {src} again inside a function" for m, src in sorted(reimports)]
        for line, src, names in inner:
            if lazy_reason(m, src, names, mods) is None:
                bad.append(f"{m}:{line}: {src} ({', '.join(names[1:]) or names[0]})")
            used |= {(m, t) for t in names} | {(m, src)}
    stale = sorted(f"{m} -> {t}" for m, t in LAZY_EDGES if (m, t) not in used)
    assert not bad, "imports inside functions (move them to the module's import block, or list them with " \
                    "the reason):\n" + "\n".join(bad)
    assert not again, "\n".join(again)
    assert not stale, f"LAZY_EDGES lists imports no function makes any more: {stale}"
