"""The drop-in operations (tritonfleet.host.ops.converged) as a table, the way pyinfra tests its
own operations (tests/operations/<op>/<case>.json): each case in converged_cases/<op>/<case>.json
gives the operation's arguments and what the host answers, and the exact commands the operation
sends on pyinfra's @fake connector (``-y``: no change detection before execution). A converged
host gets one read; anything else goes through pyinfra's own operation, commands and all.

    {"doc": "...", "args": {...}, "content": "file text (put)",
     "responses": {"a command's substring": ["its output lines"]}, "commands": ["...", ...]}

A case's ``commands`` are checked exactly; to write a new case, leave ``commands`` out and run
``python -m tests.unit.host.test_converged_cases <case.json>`` to print them (then read them)."""

from __future__ import annotations

import json
import sys
from io import StringIO
from pathlib import Path

import pytest
from pyinfra.api import deploy

from tests.support.fakehost import run_fake
from tritonfleet.host.ops import converged

CASES = Path(__file__).with_name("converged_cases")
TMPDIR_FACT = 'if [ -n "$TMPDIR" ]'
FILES = sorted(CASES.glob("*/*.json"))


def commands_of(case: dict, op: str) -> tuple[list[str], list[str]]:
    """(the commands the fake host received, the hosts that failed)."""
    args = dict(case.get("args", {}))
    if op == "put":
        args["src"] = StringIO(case["content"])

    @deploy(f"converged.{op}")
    def one():
        getattr(converged, op)(name=case.get("doc", op), **args)

    _, cmds, state = run_fake(one, case.get("responses", {}), yes=True)
    # pyinfra's own lookup of the host's temporary directory (its TmpDir fact) is read or not
    # depending on what earlier runs in this process left in pyinfra's context: not the operation's
    cmds = [str(c) for c in cmds if not str(c).startswith(TMPDIR_FACT)]
    return cmds, sorted(h.name for h in state.failed_hosts)


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_case(path: Path):
    case = json.loads(path.read_text())
    cmds, failed = commands_of(case, path.parent.name)
    assert not failed, failed
    assert cmds == case["commands"], f"{path.relative_to(CASES)}: {case.get('doc')}"


def test_every_operation_has_cases():
    assert {p.parent.name for p in FILES} == {"put", "packages", "service"}
    assert all(len(list((CASES / op).glob("*.json"))) >= 2 for op in ("put", "packages", "service"))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        p = Path(name)
        print(json.dumps(commands_of(json.loads(p.read_text()), p.parent.name)[0], indent=1))
