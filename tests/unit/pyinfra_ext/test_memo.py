"""Many facts in one remote command (memo.prefetch), the per-run memo's rules, and the faster
operation order (tritonfleet.pyinfra_ext.oporder): on this machine through pyinfra's @local connector, each
answer compared with pyinfra reading the fact on its own."""

from __future__ import annotations

import importlib

import pytest
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


def test_operation_order_matches_pyinfras(tmp_path):
    from types import SimpleNamespace

    from pyinfra.api import util

    state = SimpleNamespace(current_deploy_filename="deploys/example.py", current_op_file_number=2)
    code = compile("def step(state):\n    return ours(state), theirs(state)\n\n\nresult = step(state)\n",
                   "deploys/example.py", "exec")
    ns = {"state": state, "ours": oporder.operation_order, "theirs": util.get_operation_order_from_stack}
    exec(code, ns)
    ours, theirs = ns["result"]
    assert ours == theirs and len(ours) >= 2


def test_operation_order_falls_back_to_pyinfras_if_they_ever_differ(monkeypatch):
    from types import SimpleNamespace

    operation_module = importlib.import_module("pyinfra.api.operation")

    state = SimpleNamespace(current_deploy_filename=None, current_op_file_number=0)
    monkeypatch.setattr(oporder, "_original", lambda s: [9, 9, 9])
    monkeypatch.setattr(oporder, "_state", {"checked": False})
    oporder.install()
    try:
        assert operation_module.get_operation_order_from_stack(state) == [9, 9]
        assert operation_module.get_operation_order_from_stack is oporder._original
    finally:
        oporder.uninstall()
