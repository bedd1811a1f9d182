"""The unit tier starts no server: no module under tests/unit imports the helpers that start one
(tests/support/tritonproc.py, haproxy.py, registry.py, the wheel builder; the testbed tooling's
local tritonserver and origin servers), and none hands one of the heavy programs (tritonserver, HAProxy, nginx, Prometheus and its
tools, Alertmanager, the node exporter, the registry, pyinfra's or tritonfleet's command line) to
subprocess. A static check over the files' syntax trees: such a test belongs under
tests/integration/<domain>/ (docs/tests.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "tests" / "unit"

#: modules a unit test may not import: each starts a server or builds the package
SERVER_HELPERS = ("tests.support.tritonproc", "tests.support.haproxy", "tests.support.registry",
                  "tests.support.wheel", "tests.support.canary_load", "tritonfleet_testbed.localtriton",
                  "tritonfleet_testbed.origin_server", "tritonfleet_testbed.origin_servers")
#: programs a unit test may not start (a word of a string in the program argument of subprocess)
HEAVY_PROGRAMS = frozenset({
    "tritonserver", "haproxy", "nginx", "prometheus", "promtool", "prometheus-alertmanager", "alertmanager",
    "amtool", "prometheus-node-exporter", "node_exporter", "registry", "docker-registry", "skopeo", "pyinfra",
    "tritonfleet",
})
PATH_BUILDERS = frozenset({"str", "Path", "which", "join", "fspath"})
SPAWNERS = frozenset({"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"})


def _words(node: ast.AST, names: dict[str, ast.AST], seen: frozenset[str] = frozenset()) -> set[str]:
    """Every word of every string in a program's expression, module-level names followed to their
    value; calls other than the path builders (a script builder's arguments) are not the program."""
    if isinstance(node, ast.Constant):
        return set(node.value.replace("/", " ").split()) if isinstance(node.value, str) else set()
    if isinstance(node, ast.Name):
        return _words(names[node.id], names, seen | {node.id}) if node.id in names and node.id not in seen else set()
    if isinstance(node, ast.Call):
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if func not in PATH_BUILDERS:
            return set()
    words: set[str] = set()
    for child in ast.iter_child_nodes(node):
        words |= _words(child, names, seen)
    return words


def _program(argv: ast.AST) -> ast.AST:
    """The program of an argument vector: its first item (the module after ``python -m``)."""
    if isinstance(argv, (ast.List, ast.Tuple)) and argv.elts:
        first = argv.elts[0]
        if (len(argv.elts) > 2 and isinstance(argv.elts[1], ast.Constant) and argv.elts[1].value == "-m"
                and isinstance(first, ast.Attribute) and first.attr == "executable"):
            return argv.elts[2]
        return first
    return argv


def offences(source: str) -> list[str]:
    """What in one test module's source starts a server or a heavy program, one line each."""
    tree = ast.parse(source)
    names = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        imported: list[str] = []
        if isinstance(node, ast.Import):
            imported = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in imported:
            if any(name == h or name.startswith(h + ".") for h in SERVER_HELPERS):
                found.append(f"line {node.lineno}: imports {name}")
        if (isinstance(node, ast.Call) and node.args
                and isinstance(node.func, (ast.Attribute, ast.Name))
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in SPAWNERS):
            heavy = sorted(_words(_program(node.args[0]), names) & HEAVY_PROGRAMS)
            if heavy:
                found.append(f"line {node.lineno}: starts {', '.join(heavy)}")
    return found


def test_no_unit_test_starts_a_server():
    bad = {str(p.relative_to(ROOT)): got for p in sorted(UNIT.rglob("*.py")) if (got := offences(p.read_text()))}
    assert not bad, f"tests that start servers or heavy programs belong under tests/integration/<domain>/: {bad}"


def test_the_check_sees_each_way_of_starting_one():
    assert offences("from tests.support.haproxy import HAProxy\n")
    assert offences("import tests.support.tritonproc as tp\n")
    assert offences("from tests.support import registry\n")
    assert offences("from tritonfleet_testbed.origin_servers import Nginx\n")
    assert offences("import subprocess\nsubprocess.run(['haproxy', '-f', 'x'])\n")
    assert offences("P = shutil.which('prometheus') or '/usr/bin/prometheus'\nsubprocess.Popen([P, '--x'])\n")
    assert offences("BIN = Path(sys.executable).parent\nsubprocess.run([str(BIN / 'tritonfleet'), 'converge'])\n")
    assert offences("T = str(Path(sys.executable).parent / 'tritonfleet')\nrun([T, 'status'])\n")
    assert offences("subprocess.run([sys.executable, '-m', 'pyinfra', '@local', 'd.py'])\n")
    assert not offences("import subprocess\nsubprocess.run(['sh', '-c', 'tritonfleet status'])\n")
    assert not offences("subprocess.run([sys.executable, '-c', 'print(1)'])\n")
    assert not offences("subprocess.run(manifest_command(url, 'nvidia/tritonserver'), shell=True)\n")
    assert not offences("from tests.support.fakehost import run_fake\n")
