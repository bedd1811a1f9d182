"""Every operation and fact of the package, tested from data files (tests.support.cases): each
``tests/unit/<domain>/op_cases/<module>.<op>/<case>.json`` gives an operation's arguments and what
the host answers, and the exact commands it sends; each ``fact_cases/<module>.<Fact>/<case>.json``
a fact's arguments, its exact command, an output and the fact read from it. A new case is a new
file; an operation or fact with fewer than two cases fails ``test_every_operation_and_fact_has_cases``."""

from __future__ import annotations

import inspect
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.cases import (
    case_files,
    case_id,
    check_fact,
    check_operation,
    package_targets,
    resolve,
    target_of,
)

OPS = case_files("op_cases")
FACTS = case_files("fact_cases")
LATER = "cases after the mirror/lock hardening lands"
# a Python callback that runs its host scripts itself (no command a case could list): the scripts
# are tested in tests/unit/serving/test_image_fanout.py and tests/testbed/test_image_fanout.py
CALLBACK = "its commands come from a callback at run time"
# operations and facts without cases yet, and why
WITHOUT_CASES = {
    "tritonfleet.serving.ops.image_mirror:fill": LATER,
    "tritonfleet.model_repo.ops:model_release": LATER,
    "tritonfleet.serving.ops.image_fanout:image_seeded": CALLBACK,
    "tritonfleet.serving.ops.image_fanout:image_from_swarm": CALLBACK,
    "tritonfleet.model_repo.ops:ReleaseIndex": LATER,
    "tritonfleet.model_repo.facts:ReleaseState": LATER,
    "tritonfleet.model_repo.facts:ReleaseManifest": LATER,
}
# tritonfleet/steps/mirror.py and tritonfleet/pyinfra_ext/hostlock.py define no operation or fact
# of their own (their commands come through the ones above and through deploys): when one is
# added there it needs cases like any other, or an entry here with LATER


@pytest.mark.parametrize("path", OPS, ids=[f"{p.parents[2].name}/{case_id(p)}" for p in OPS])
def test_operation_case(path: Path):
    check_operation(path)


@pytest.mark.parametrize("path", FACTS, ids=[f"{p.parents[2].name}/{case_id(p)}" for p in FACTS])
def test_fact_case(path: Path):
    check_fact(path)


def test_every_operation_and_fact_has_cases():
    ops, facts = package_targets()
    counts = Counter(target_of(p) for p in OPS + FACTS)
    assert not set(counts) - ops - facts, "cases for no operation or fact of the package"
    assert not set(WITHOUT_CASES) - ops - facts, "an allowed name is no operation or fact any more"
    missing = {t: counts[t] for t in sorted(ops | facts) if counts[t] < 2 and t not in WITHOUT_CASES}
    assert not missing, f"fewer than two cases (tests/support/cases.py says how to write one): {missing}"


def test_op_cases_cover_both_paths():
    """Each operation with cases has one that changes the host (or is refused) and, where it can
    have nothing to do (it calls ``host.noop``), one where it has nothing to do."""
    changed, noop = set(), set()
    for p in OPS:
        (noop if json.loads(p.read_text()).get("noop_description") else changed).add(target_of(p))
    assert noop - changed == set(), "an operation with no case that changes the host"
    can_noop = {t for t in changed | noop if "host.noop(" in inspect.getsource(resolve(t)._inner)}
    assert can_noop - noop == set(), "an operation with a no-op path and no case for it"


# what the package's facts print, to mix with any text: each parser's own keys and markers
MARKERS = ["@@tritonfleet-fact@@", "@@tritonfleet-fact-status@@", "@@tritonfleet-fact-status@@ 0",
           "mode=644 user", "mode=644 user=root group=root", "SubState=running", "file=/usr/bin/x owner",
           "runlog=", "running=true", "image=sha256:", "started=x", "/x.service=1", "unit=", "fpr=",
           "trusted=yes", "error=", "##FILE /etc/apt/sources.list.d/x.sources", "##FILE /etc/apt/sources.list",
           "Types: deb", "URIs: x", "deb [signed-by=x", "deb [a b] x", "rc=127", "rc=x", "fields=index,name",
           "0, Tesla T4, GPU-1, 00000000:00:1E.0, 560.35.03, 7.5, 15360", "0, -, -, T4", "dpkg-journal=1",
           "ii \tdkms\t1", "hF\tx\t1", '{"release": "r1"}', "[1]", "failure-recorded", "SecureBoot enabled",
           "efivar=1", "Failed to initialize NVML: Driver/library version mismatch", "No devices were found"]
OUTPUTS = st.lists(st.one_of(st.text(max_size=60), st.sampled_from(MARKERS),
                             st.builds("".join, st.lists(st.sampled_from(MARKERS + [" ", "=", ",", "\t"]), max_size=4))),
                   max_size=12)
FACT_CLASSES = sorted(set(package_targets()[1]) - set(WITHOUT_CASES))


@pytest.mark.parametrize("target", FACT_CLASSES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(output=OUTPUTS)
def test_fact_reads_any_output(target: str, output: list[str]):
    """A fact reads whatever the host prints, never failing hard: a forged, cut or foreign answer
    is data (the house rule "facts parse"), never an exception in the middle of a run."""
    resolve(target)().process(output)
