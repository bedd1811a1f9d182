"""The suite's parts (scripts/test, tritonfleet_testbed/suite.py) hold every test exactly once,
by pytest's own collection: the parts' selections are disjoint, their union is the whole suite,
and each part has tests (a part that selects nothing would pass while testing nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tritonfleet_testbed import suite

ROOT = Path(__file__).resolve().parents[3]


def _collect(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ids(proc: subprocess.Popen) -> list[str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (out[-2000:], err[-2000:])
    return [line for line in out.splitlines() if "::" in line]


def test_every_test_is_in_exactly_one_part():
    parts = suite.parts(0)
    procs = {p.name: _collect(*p.args) for p in parts}
    whole = _collect("tests")
    ids = {name: _ids(proc) for name, proc in procs.items()}
    everything = _ids(whole)
    assert len(everything) > 100
    seen: dict[str, str] = {}
    for name, got in ids.items():
        assert got, f"part {name} selects no test"
        for nodeid in got:
            assert nodeid not in seen, f"{nodeid} is in both {seen[nodeid]} and {name}"
            seen[nodeid] = name
    assert sorted(seen) == sorted(everything)
    # the testbed parts hold exactly the testbed-marked tests, on two instances
    assert {i.split("::")[0] for i in ids["testbed-a"]} == set(suite.FIRST_PART_FILES)
    assert {i.split("::")[0] for i in ids["testbed-c"]} == set(suite.THIRD_PART_FILES)
    assert [p.instance for p in parts] == [0, 1, 2, None, None]
    # the unit part holds tests/unit/ and nothing else, the integration part tests/integration/
    assert {i.split("/")[1] for i in ids["unit"]} == {"unit"}
    assert {i.split("/")[1] for i in ids["integration"]} == {"integration"}


def test_the_base_instance_leaves_room_for_the_second(monkeypatch):
    assert [p.instance for p in suite.parts(7)][:3] == [7, 8, 9]
    monkeypatch.setenv("TRITONFLEET_TESTBED", "8")
    with pytest.raises(SystemExit, match="base must be 0-7"):
        suite.base_instance()
    monkeypatch.setenv("TRITONFLEET_TESTBED", "3")
    assert suite.base_instance() == 3
