"""No command prints a traceback for bad input: every command (status, rollout, prometheus,
loadtest, tune, validate, init) is fed generated broken inventories, group data files, --data
values and arguments, and must answer with one readable error and exit status 2.

Most of it runs in-process through click's CliRunner, each command in a forked child
(tests/support/forked.py; fast: no interpreter start, no host contacted: every input here is refused
before a connection is opened), with a bounded number of generated examples; the console script itself is run where only it can show something (the
gevent warning, which the entry point prevents; the exit status a shell sees).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support.forked import forked
from tritonfleet import ROOT
from tritonfleet.cli import main
from tritonfleet.settings.check import RULES
from tritonfleet.settings.defaults import DEFAULTS

TRITONFLEET = str(Path(sys.executable).parent / "tritonfleet")
GEN = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

GOOD_INVENTORY = ('t4 = [("t4-a", {"ssh_hostname": "127.0.0.1", "ssh_port": 1})]\n'
                  'l4 = [("l4-a", {"ssh_hostname": "127.0.0.1", "ssh_port": 1})]\n')


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A working directory with inventories/prod.py (hosts that never answer), its group data,
    the model repository and the deploys: the layout `tritonfleet init` writes."""
    shutil.copytree(ROOT / "inventories" / "group_data", tmp_path / "inventories" / "group_data")
    shutil.copytree(ROOT / "files", tmp_path / "files")
    shutil.copytree(ROOT / "deploys", tmp_path / "deploys")
    (tmp_path / "inventories" / "prod.py").write_text(GOOD_INVENTORY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _invoke_here(args: list[str]) -> SimpleNamespace:
    res = CliRunner().invoke(main, args)
    escaped = None if res.exception is None or isinstance(res.exception, SystemExit) else repr(res.exception)
    return SimpleNamespace(exit_code=res.exit_code, output=res.output, escaped=escaped)


def invoke(*args: str) -> SimpleNamespace:
    """The command run in-process by click's runner, in a forked child (tests/support/forked.py: loading
    an inventory patches the process for gevent, which must not reach later tests)."""
    return forked(_invoke_here, [str(a) for a in args])


def assert_usage_error(res, *words: str) -> None:
    """One readable error, exit status 2, no traceback; ``words`` in it."""
    out = res.output
    assert res.escaped is None, f"an exception escaped: {res.escaped}\n{out}"
    assert res.exit_code == 2, (res.exit_code, out)
    assert "Traceback" not in out and ("Error: " in out or "tritonfleet " in out), out
    assert len(out.strip().splitlines()) <= 30, out
    for w in words:
        assert w in out, (w, out)


INVENTORY_COMMANDS = [
    ["status", "{inv}"],
    ["rollout", "{inv}", "deploys/models.py"],
    ["prometheus", "{inv}", "--out", "prom"],
    ["loadtest", "{inv}", "--duration", "1"],
    ["tune", "{inv}", "--window", "0"],
    ["tune", "{inv}", "--loadtest", "lt.json"],
    ["check", "{inv}"],
]


def _run_all(inv: str, *extra: str):
    Path("lt.json").write_text('{"results": []}')
    for cmd in INVENTORY_COMMANDS:
        yield cmd[0], invoke(*[a.format(inv=inv) for a in cmd], *extra)


# ---- broken inventories ----------------------------------------------------------------------

BROKEN_INVENTORIES = {
    "syntax": ("t4 = [\n", "inventories/bad.py:1"),
    "name-error": ("t4 = [(host_name, {})]\n", "NameError"),
    "type-error": ("t4 = [('a', {'ssh_hostname': '1.2.3.4'})] + 1\n", "TypeError"),
    "empty": ("# nothing\n", "has no hosts"),
    "deploy-file": ((ROOT / "deploys" / "models.py").read_text(), "is a deploy file, not an inventory"),
    "raises": ("raise SystemExit('no hosts for you')\n", "no hosts for you"),
    "import": ("import no_such_module_here\nt4 = ['a']\n", "ModuleNotFoundError"),
    "binary": ("\x00\x01\x02", "inventories/bad.py"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_INVENTORIES))
def test_every_command_refuses_a_broken_inventory(project, case):
    body, words = BROKEN_INVENTORIES[case]
    Path("inventories/bad.py").write_text(body)
    for _name, res in _run_all("inventories/bad.py"):
        assert_usage_error(res, words)


def test_a_missing_inventory_and_a_directory(project):
    for _name, res in _run_all("inventories/nothing.py"):
        assert_usage_error(res, "inventories/nothing.py not found")
    for _name, res in _run_all("inventories"):
        assert_usage_error(res, "directory")


BROKEN_GROUP_DATA = {
    "syntax": ("triton_http_port = (\n", "inventories/group_data/t4.py:"),
    "name-error": ("triton_image = tag + ':24.08'\n", "NameError"),
    "port-word": ("triton_http_port = 'eighty'\n", "triton_http_port = 'eighty' (inventories/group_data/t4.py)"),
    "port-range": ("triton_grpc_port = 70000\n", "triton_grpc_port = 70000"),
    "negative": ("health_timeout = -1\n", "health_timeout = -1"),
    "misspelt": ("helth_timeout = 5\n", "did you mean health_timeout?"),
    "gpu-class": ("gpu_class = 'H100'\n", "gpu_class = 'H100'"),
    "quoted": ("fleet_parallel = '8'\n", "(write 8 without quotes)"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_GROUP_DATA))
def test_every_command_refuses_broken_group_data(project, case):
    line, words = BROKEN_GROUP_DATA[case]
    f = Path("inventories/group_data/t4.py")
    f.write_text(f.read_text() + line)
    for _name, res in _run_all("inventories/prod.py"):
        assert_usage_error(res, words)


# ---- generated settings, --data and arguments --------------------------------------------------

def py(value) -> str:
    """``value`` as Python source (a non-finite float has no literal)."""
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return f"float({str(value)!r})"
    return repr(value)


def bad_values(key: str):
    """Values the rule of ``key`` refuses, drawn from a few kinds of mistake."""
    candidates = st.one_of(
        st.sampled_from(["eighty", "", "yes", "-1", "1e9", "[]", "None"]),
        st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
        st.lists(st.integers(), max_size=2), st.booleans(), st.none())
    return candidates.filter(lambda v: RULES[key].problem(v) is not None)


@GEN
@given(data=st.data())
def test_generated_bad_settings_are_refused_by_every_command(project, data):
    key = data.draw(st.sampled_from(sorted(RULES)))
    value = data.draw(bad_values(key))
    where = data.draw(st.sampled_from(["group", "host", "all"]))
    if where == "host":
        Path("inventories/prod.py").write_text(
            f't4 = [("t4-a", {{"ssh_hostname": "127.0.0.1", "ssh_port": 1, {key!r}: {py(value)}}})]\n')
    else:
        Path("inventories/prod.py").write_text(GOOD_INVENTORY)
    f = Path("inventories/group_data") / ("all.py" if where == "all" else "t4.py")
    original = f.read_text()
    try:
        if where != "host":
            f.write_text(original + f"{key} = {py(value)}\n")
        cmd = data.draw(st.sampled_from(INVENTORY_COMMANDS))
        Path("lt.json").write_text('{"results": []}')
        res = invoke(*[a.format(inv="inventories/prod.py") for a in cmd], "--limit", "t4-a")
        assert_usage_error(res, f"{key} = ")
    finally:
        f.write_text(original)


@GEN
@given(key=st.sampled_from(sorted(k for k in RULES if isinstance(DEFAULTS[k], int) and not isinstance(DEFAULTS[k], bool))),
       word=st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8),
       cmd=st.sampled_from(["status", "rollout"]))
def test_generated_bad_data_is_refused(project, key, word, cmd):
    """--data as pyinfra parses it (pyinfra_cli.util.parse_cli_arg: true and false are booleans,
    null is JSON's None): a word where a number belongs."""
    assume(word not in ("true", "false"))
    value = None if word == "null" else word
    args = ["status", "inventories/prod.py"] if cmd == "status" else ["rollout", "inventories/prod.py",
                                                                       "deploys/models.py"]
    res = invoke(*args, "--data", f"{key}={word}")
    assert_usage_error(res, f"{key} = {value!r} (--data)")


BAD_ARGUMENTS = [
    (["rollout", "deploys/models.py", "inventories/prod.py"], "the arguments are the wrong way round"),
    (["rollout", "inventories/prod.py", "inventories/prod.py"], "is an inventory"),
    (["rollout", "inventories/prod.py", "deploys/nothing.py"], "deploy deploys/nothing.py not found"),
    (["rollout", "inventories/prod.py"], "INVENTORY and DEPLOY are required"),
    (["rollout", "inventories/prod.py", "deploys/models.py", "--canary", "-1"], "--canary"),
    (["rollout", "inventories/prod.py", "deploys/models.py", "--gate-timeout", "-5"], "--gate-timeout"),
    (["rollout", "inventories/prod.py", "deploys/models.py", "--gate-timeout", "0"], "--gate-timeout"),
    (["rollout", "inventories/prod.py", "deploys/models.py", "--batch", "0"], "--batch"),
    (["rollout", "inventories/prod.py", "deploys/models.py", "--max-fail", "-1"], "--max-fail"),
    (["rollout", "inventories/prod.py", "deploys/models.py", "--data", "novalue"], "expected key=value"),
    (["rollout", "--resume", "inventories/prod.py"], "--resume takes everything from the journal"),
    (["rollout", "inventories/prod.py", "deploys/models.py", "--roll-back"], "--roll-back and --journal"),
    (["rollout", "--resume", "--journal", "nowhere"], "no rollout journal"),
    (["status", "inventories/prod.py", "--limit", "nosuchhost"], "--limit nosuchhost matches no host"),
    (["status", "deploys/triton.py"], "is a deploy file, not an inventory"),
    (["status"], "Missing argument"),
    (["prometheus", "inventories/prod.py", "--scrape-interval", "15 s"], "not a Prometheus duration"),
    (["prometheus", "inventories/prod.py", "--job", "a b"], "--job"),
    (["prometheus", "inventories/prod.py", "--rate-window", "30s"], "at least 4 scrape intervals"),
    (["prometheus", "inventories/prod.py", "--limit", "nosuch"], "matches no host"),
    (["loadtest", "inventories/prod.py", "--concurrency", "0,x"], "--concurrency"),
    (["loadtest", "inventories/prod.py", "--duration", "0"], "--duration"),
    (["loadtest", "inventories/prod.py", "--protocol", "smoke"], "--protocol"),
    (["tune", "inventories/prod.py", "--window", "-1"], "--window"),
    (["tune"], "give an INVENTORY"),
    (["tune", "--loadtest", "notjson.json"], "notjson.json"),
    (["tune", "--loadtest", "list.json"], "list.json"),
    (["tune", "--loadtest", "missing.json"], "missing.json"),
    (["validate", "no/such/repo"], "no such directory"),
    (["validate", "inventories/prod.py"], "not a directory"),
    (["validate", "files/model_repository", "--gpus", "-1"], "--gpus"),
    (["init", "inventories/prod.py"], "is a file"),
    (["init", "inventories"], "is not empty"),
    (["nosuchcommand"], "No such command"),
    (["deploy", "deploys/models.py", "inventories/prod.py"], "is a deploy file, not an inventory"),
    (["deploy", "inventories/prod.py", "deploys/models.py", "--workers", "-1"], "--workers"),
    (["deploy", "inventories/prod.py", "deploys/models.py", "--data", "fleet_workers=x"], "fleet_workers = 'x' (--data)"),
    (["pull", "publish", "inventories/prod.py", "deploys/models.py", "--origin", "nowhere"],
     "origin nowhere is not a directory"),
    (["pull", "publish", "inventories/prod.py", "deploys/models.py", "--origin", "files", "--data",
      "pull_poll_interval=0"], "pull_poll_interval = 0 (--data)"),
    (["pull", "rollout", "inventories/prod.py", "deploys/models.py", "--origin", "files", "--sign-key", "nokey"],
     "signing key nokey not found"),
    (["pull", "rollout", "inventories/prod.py", "deploys/models.py", "--origin", "files", "--sign-key", "nokey",
      "--max-fail", "-1"], "--max-fail"),
    (["bootstrap", "inventories/prod.py", "--origin", "nowhere", "--url", "http://x", "--wheel",
      "deploys/models.py", "--wheelhouse", "files"], "origin nowhere is not a directory"),
    (["converge", "--config", "nowhere/pull.json"], "was not bootstrapped for pull mode"),
    (["quarantine", "list", "inventories/prod.py"], "no quarantine_url in inventories/prod.py's data"),
    (["quarantine", "serve", "deploys/models.py"], "is a deploy file, not an inventory"),
    (["quarantine", "release", "inventories/prod.py", "t4-a", "--data", "quarantine_url=x"],
     "quarantine_url = 'x' (--data)"),
]


@pytest.mark.parametrize(("args", "words"), BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_bad_arguments_are_one_usage_error(project, args, words):
    Path("notjson.json").write_text("{not json")
    Path("list.json").write_text("[1, 2]")
    assert_usage_error(invoke(*args), words)


def test_every_command_is_covered():
    covered = {c[0] for c in INVENTORY_COMMANDS} | {a[0] for a, _ in BAD_ARGUMENTS}
    assert set(main.commands) - {"testbed"} <= covered, set(main.commands) - covered


# ---- the console script --------------------------------------------------------------------------

def test_the_command_prints_no_gevent_warning_and_says_why_a_host_is_unreachable(project):
    """gevent's MonkeyPatchWarning ("may lead to errors, including RecursionError") used to be
    printed by every command that read an inventory; status used to say "unreachable" without
    the reason, which only --json had."""
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    res = subprocess.run([TRITONFLEET, "status", "inventories/prod.py"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert "MonkeyPatchWarning" not in res.stderr, res.stderr
    assert res.returncode == 1  # a host that does not answer: the run failed, not the input
    rows = [line for line in res.stdout.splitlines() if line.startswith(("t4-a", "l4-a"))]
    assert len(rows) == 2 and all("unreachable: " in r for r in rows), res.stdout
    assert all("Unable to connect to port 1" in r or "refused" in r.lower() for r in rows), rows
    res = subprocess.run([TRITONFLEET, "loadtest", "inventories/prod.py", "--duration", "0.1",
                          "--concurrency", "1"], capture_output=True, text=True, timeout=120, env=env)
    assert "MonkeyPatchWarning" not in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_usage_error_exits_2_in_the_shell(project):
    Path("inventories/bad.py").write_text("t4 = [\n")
    res = subprocess.run([TRITONFLEET, "status", "inventories/bad.py"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "tritonfleet status: inventories/bad.py:1: '[' was never closed: not a Python file pyinfra can read "
        "(fix the line, or give another file)"]


@pytest.mark.parametrize("module", ["tritonfleet.tunables", "tritonfleet.settings.table"])
def test_python_m_tritonfleet_tunables_takes_help(module):
    """The operators' name (tritonfleet.tunables) and the module's own print the same table."""
    res = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith(f"usage: python -m {module}")
    assert "| tunable |" not in res.stdout
    res = subprocess.run([sys.executable, "-m", module, "--bogus"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "unrecognized arguments: --bogus" in res.stderr
    res = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("| tunable |")
    from tritonfleet.settings.table import markdown

    assert res.stdout == markdown() + "\n"
