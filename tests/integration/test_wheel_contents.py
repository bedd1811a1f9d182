"""The production wheel holds the package and nothing of the test tooling.

Built here from a copy of this checkout that has the test tooling in it (tritonfleet_testbed/,
its own project file), as `pip wheel` builds it for an operator (README, Install). The tooling is
a project of its own, installed next to tritonfleet in a checkout by scripts/setup:
tests/unit/test_structure.py checks that `tritonfleet testbed` reaches the command line from there.
"""

from __future__ import annotations

import zipfile

from tests.support.wheel import SOURCES, build_wheel


def test_the_wheel_holds_no_test_tooling(tmp_path):
    # the test tooling copied in too: the wheel must leave it out
    wheel = build_wheel(tmp_path, (*SOURCES, "tritonfleet_testbed"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next((z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"tritonfleet", "tritonfleet-0.1.0.dist-info"}, tops
    assert "tritonfleet/steps/triton.py" in names and "tritonfleet/templates/triton.service.j2" in names
    # the record the run-time check of pyinfra's internals reads
    assert "tritonfleet/pyinfra_ext/internals.json" in names and "tritonfleet/core/errors.py" in names
    assert "tritonfleet_testbed" not in entry_points and "tritonfleet.commands" not in entry_points, entry_points
    assert "tritonfleet = tritonfleet.__main__:main" in entry_points
