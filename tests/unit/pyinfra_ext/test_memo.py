"""Many facts in one remote command (memo.prefetch), the per-run memo's rules, and the faster
operation order (tritonfleet.pyinfra_ext.oporder): on this machine through pyinfra's @local connector, each
answer compared with pyinfra reading the fact on its own."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.connectors.local import LocalConnector
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.server import Arch, Command, KernelVersion, LinuxDistribution

from tritonfleet.host.facts import DpkgState, FileState, UnitState
from tritonfleet.pyinfra_ext import memo, oporder


@pytest.fixture
def local(monkeypatch):
    inventory = Inventory(([("@local", {})], {}))
    state = State(inventory, Config(), check_for_changes=False)
    connect_all(state)
    host = inventory.get_host("@local")
    commands = []
    real = LocalConnector.run_shell_command

    def counted(self, command, *args, **kwargs):
        commands.append(str(command))
        return real(self, command, *args, **kwargs)

    monkeypatch.setattr(LocalConnector, "run_shell_command", counted)
    with ctx_state.use(state), ctx_host.use(host):
        yield host, commands


SPECS = [(Arch, {}), (KernelVersion, {}), (LinuxDistribution, {}), (DpkgState, {}),
         (FileState, {"path": "/etc/hostname"}), (FileState, {"path": "/no/such/file"}),
         (UnitState, {"unit": "no-such-unit.service"}),
         (Command, {"command": "printf 'a\\n\\nb'"}), (Command, {"command": "exit 3"})]


def test_prefetch_reads_many_facts_in_one_command_with_pyinfras_answers(local):
    host, commands = local
    memo.prefetch(*SPECS)
    assert len(commands) == 1
    for cls, kwargs in SPECS[:-1]:
        assert memo.fact(cls, **kwargs) == host.get_fact(cls, **kwargs), cls
    # only the failing one was read again on its own (pyinfra reports its failure)
    assert memo.fact(Command, command="printf 'a\\n\\nb'") == "a\n\nb"
    n = len(commands)
    with pytest.raises(PyinfraError):  # pyinfra's own failure handling
        memo.fact(Command, command="exit 3")
    assert len(commands) == n + 1


def test_memo_reads_once_and_forgets_on_demand(local):
    host, commands = local
    memo.fact(Arch)
    memo.fact(Arch)
    assert len(commands) == 1
    memo.forget()
    memo.fact(Arch)
    assert len(commands) == 2


# A call stack as a deploy makes it: frames of the deploy file, of files of the operator's own
# (helpers, package code) and of pyinfra's install directory, in any order and depth. Each frame
# is a function compiled under its file's name, so co_filename and the line numbers are real.
_FILES = st.sampled_from(["deploys/example.py", "deploys/helpers.py", "/opt/site/tritonfleet/steps/x.py",
                          "<string>", "PYINFRA"])


def _call_chain(files: list[str], lines: list[int], innermost):
    """Functions f0 -> f1 -> ... -> innermost, f_i compiled under files[i] at line lines[i]."""
    from pyinfra.api import util

    nxt = innermost
    for k in reversed(range(len(files))):
        name = files[k] if files[k] != "PYINFRA" else os.path.join(util.PYINFRA_INSTALL_DIR, "api", "fake.py")
        src = "\n" * (lines[k] - 1) + f"def f{k}(state):\n    return nxt(state)\n"
        ns = {"nxt": nxt}
        exec(compile(src, name, "exec"), ns)
        nxt = ns[f"f{k}"]
    return nxt


@settings(max_examples=60, deadline=None)
@given(chain=st.lists(st.tuples(_FILES, st.integers(1, 400)), min_size=1, max_size=12),
       deploy=st.sampled_from([None, "deploys/example.py", "deploys/other.py"]),
       is_cli=st.booleans(), file_number=st.integers(0, 5))
def test_operation_order_matches_pyinfras(chain, deploy, is_cli, file_number):
    """On generated call stacks (files in and out of pyinfra, the deploy file or not, CLI mode or
    the API), the line numbers from frames are pyinfra's own, as pyinfra's caller gets them."""
    from types import SimpleNamespace

    import pyinfra
    from pyinfra.api import util

    state = SimpleNamespace(current_deploy_filename=deploy, current_op_file_number=file_number)
    got = {}
    # where pyinfra.api.operation calls it: a frame in pyinfra's install directory, which both skip
    both = _in_pyinfra("def both(state):\n    return ours(state), theirs(state)\n", "both",
                       ours=oporder._fast_order, theirs=util.get_operation_order_from_stack)

    def innermost(state):
        got["ours"], got["theirs"] = both(state)

    files, lines = [c[0] for c in chain], [c[1] for c in chain]
    old = pyinfra.is_cli
    pyinfra.is_cli = is_cli
    try:
        _call_chain(files, lines, innermost)(state)
    finally:
        pyinfra.is_cli = old
    assert got["ours"] == got["theirs"]
    if is_cli:
        assert got["ours"][0] == file_number


def _in_pyinfra(src: str, name: str, **ns):
    from pyinfra.api import util

    exec(compile(src, os.path.join(util.PYINFRA_INSTALL_DIR, "api", "fake_caller.py"), "exec"), ns)
    return ns[name]


def test_operation_order_differs_when_a_frame_moves():
    """The comparison above can fail: one line moved, and the order differs."""
    from types import SimpleNamespace

    state = SimpleNamespace(current_deploy_filename="deploys/example.py", current_op_file_number=0)
    got = []

    both = _in_pyinfra("def call(state):\n    return ours(state)\n", "call", ours=oporder._fast_order)

    def innermost(state):
        got.append(both(state))

    _call_chain(["deploys/example.py", "deploys/helpers.py"], [10, 20], innermost)(state)
    _call_chain(["deploys/example.py", "deploys/helpers.py"], [10, 21], innermost)(state)
    assert got[0] != got[1]
