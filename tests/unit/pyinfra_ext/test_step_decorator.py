"""tritonfleet_step (tritonfleet.pyinfra_patches): pyinfra's ``@deploy(name)`` whose body first
refuses a pyinfra CLI run whose deploy file did not call install(), and which otherwise sends
exactly what the plain ``@deploy(name)`` sends."""

from __future__ import annotations

import pyinfra
import pytest
from pyinfra.api import deploy
from pyinfra.operations import server

from tests.support.fakehost import run_fake
from tritonfleet import pyinfra_patches


def _body(ran: list):
    def body(word: str = "x"):
        ran.append(word)
        server.shell(name=f"say {word}", commands=[f"echo {word}"])
        server.shell(name="and again", commands=["true"])
    return body


def test_a_step_refuses_a_cli_run_without_install(monkeypatch):
    """As pyinfra's CLI loads a deploy file that skipped install(): the run ends naming the step
    and the fix, before the step's body (no operation planned on any host)."""
    ran: list = []
    step = pyinfra_patches.tritonfleet_step("My step")(_body(ran))

    def deploy_file():  # pyinfra's CLI runs it (is_cli), its state without install()'s mark
        monkeypatch.setattr(pyinfra, "is_cli", True)
        step()

    with pytest.raises(SystemExit) as e:
        run_fake(deploy_file, {})
    assert "the step 'My step' runs, but the deploy file did not call pyinfra_patches.install()" in str(e.value.code)
    assert "from tritonfleet import pyinfra_patches" in str(e.value.code)
    assert ran == []


def test_a_step_sends_what_a_plain_deploy_sends():
    """Outside the CLI (the Python API, these tests) no lock is taken: the same operations, names
    and commands as pyinfra's own decorator, in the same order, under the step's name."""
    ran: list = []
    sent = []
    for decorate in (deploy("My step"), pyinfra_patches.tritonfleet_step("My step")):
        _, cmds, state = run_fake(decorate(_body(ran)), {}, word="hello")
        names = [sorted(state.get_op_meta(h).names) for h in state.get_op_order()]
        sent.append((names, [str(c) for c in cmds]))
    assert sent[0] == sent[1] and sent[0][0] == [["My step | say hello"], ["My step | and again"]]
    assert ran == ["hello", "hello"]


@pytest.mark.parametrize(
    ("stands", "reads", "forgotten"),
    [
        (True, 1, 0),  # read while the lock was taken, and it stands: not read again
        (False, 2, 1),  # another run held the lock in between: forgotten, read again under the lock
        (None, 1, 0),  # no holder pending (or the speed switch off): read once the locks are held
    ],
)
def test_a_first_read_is_read_again_unless_it_stands(monkeypatch, stands, reads, forgotten):
    """install.required(step, read): what hostlock.read_before_lock answers decides whether the
    read is kept; a read that does not stand is forgotten (memo) and read again, after the lock."""
    from tritonfleet.pyinfra_ext import hostlock, install, memo

    calls: list = []
    read = lambda: calls.append("read") or "line"  # noqa: E731

    def read_before_lock(host, r):
        if stands is not None:
            r()
        return stands

    monkeypatch.setattr(hostlock, "read_before_lock", read_before_lock)
    monkeypatch.setattr(memo, "forget", lambda host=None: calls.append("forget"))
    run_fake(lambda: install.required("pre-flight", read), {})
    assert calls.count("read") == reads and calls.count("forget") == forgotten
    if forgotten:
        assert calls == ["read", "forget", "read"]
