"""The compatibility table (tritonfleet/data/compat/) against its rule, every row of it."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet import ROOT
from tritonfleet.gpu import compat, compat_data
from tritonfleet.gpu.rules import GPU_CLASSES

IMAGES = {r["release"]: r for r in compat_data.images()}
BRANCHES = {r["branch"]: r for r in compat_data.branches()}


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def expected(release: str, branch: str, cls: str) -> bool:
    """The rule restated from the raw rows: capability, architecture, then the driver requirement
    (the stricter of the notes' branch and the CUDA major's, or a forward-compatibility branch)."""
    row, brow = IMAGES[release], BRANCHES[branch]
    cc = GPU_CLASSES[cls]["compute_capability"]
    if _v(cc) < _v(row["min_compute_capability"]):
        return False
    if compat_data.architectures()[cc] not in brow["architectures"]:
        return False
    need = int(compat_data.cuda_major_min_branch()[row["cuda"].split(".")[0]])
    need = max(need, int(row.get("min_driver", 0)))
    return int(branch) >= need or branch in row["datacenter"]


@pytest.mark.parametrize("name", compat_data.FILES)
def test_every_row_names_its_sources_and_says_what_is_not_confirmed(name):
    rows = compat_data.rows_of(name)
    assert rows
    for row in rows:
        assert row["source"], row
        for src in row["source"]:
            assert src.startswith("https://") or (ROOT / src).is_file(), src
        assert isinstance(row["confirmed"], bool)
        assert row["note"].strip(), row


def test_the_whole_table_follows_the_rule():
    table = compat.table()
    assert len(table) == len(IMAGES) * len(BRANCHES) * len(GPU_CLASSES)
    for release, branch, cls, ok, reason in table:
        assert ok is expected(release, branch, cls), (release, branch, cls, reason)
        assert reason


def test_every_refusal_names_a_fix_that_itself_runs():
    """A refusal's fix names branches and an image; each of them is accepted by the same rule."""
    for release, branch, cls, ok, _ in compat.table():
        if ok:
            continue
        v = compat.verdict(f"nvcr.io/nvidia/tritonserver:{release}-py3", branch, cls)
        assert not v.ok
        named = re.search(r"on \w+: ([\d, ()or]+?)(?:;|$)", v.fix)
        for b in re.findall(r"\d{3}", named.group(1)) if named and "driver branch" in v.fix else []:
            assert expected(release, b, cls), (release, branch, cls, v.fix)
        for other in re.findall(r"Triton (\d\d\.\d\d) \(", v.fix):
            assert expected(other, branch, cls), (release, branch, cls, v.fix)
        if any(expected(release, b, cls) for b in BRANCHES if int(b) > int(branch)):
            assert "driver branch" in v.fix, (release, branch, cls, v.fix)


@pytest.mark.parametrize("release,branch,cls,ok,words", [
    ("26.07", "570", "T4", False, ["needs driver >= 580"]),
    ("26.07", "580", "T4", True, []),
    ("26.07", "595", "L4", True, []),
    ("26.05", "535", "T4", False, ["needs driver >= 580"]),  # no forward-compatibility list from 26.05
    ("25.08", "575", "L4", False, ["needs driver >= 580"]),  # notes say 575; CUDA 13 needs R580
    ("25.03", "545", "T4", True, []),                        # forward compatibility, as the notes list
    ("24.08", "550", "T4", False, ["needs driver >= 560"]),
    ("24.08", "470", "L4", False, ["does not support Ada"]),
    ("24.08", "470", "T4", True, []),
])
def test_rows_read_from_the_sources(release, branch, cls, ok, words):
    v = compat.verdict(f"nvcr.io/nvidia/tritonserver:{release}-py3", branch, cls)
    assert v.ok is ok, v
    for w in words:
        assert w in v.reason
    if not ok:
        assert v.fix


def test_the_fix_for_a_current_image_on_an_old_branch():
    v = compat.verdict("nvcr.io/nvidia/tritonserver:26.07-py3", "570.133.07", "t4")
    assert v.fix.startswith("a driver branch that runs Triton 26.07 on T4: 580 (or 590, 595, 610, 620)")
    assert "Triton 25.03 (nvcr.io/nvidia/tritonserver:25.03-py3) or older" in v.fix


def test_unknown_image_and_class_are_refused_by_name():
    v = compat.verdict("nvcr.io/nvidia/tritonserver:99.01-py3", "580", "T4")
    assert not v.ok and "no driver requirements known" in v.reason and "26.07" in v.fix
    v = compat.verdict("nvcr.io/nvidia/tritonserver:26.07-py3", "580", "A100")
    assert not v.ok and "unknown GPU class 'A100'" in v.reason


def test_toolkit_releases_reach_1_20_and_branches_the_current_ones():
    versions = [r["version"] for r in compat_data.toolkit_releases()]
    assert {"1.18.0", "1.19.0", "1.20.0"} <= set(versions)
    assert {"535", "570", "580", "590", "595"} <= set(BRANCHES)
    # Maxwell, Pascal and Volta end with R580; Turing (T4) goes on
    assert all("volta" not in BRANCHES[b]["architectures"] for b in BRANCHES if int(b) > 580)
    assert all("turing" in BRANCHES[b]["architectures"] for b in BRANCHES)


def test_the_driver_requirements_of_rules_come_from_the_same_rows():
    from tritonfleet.gpu.rules import TRITON_DRIVER_REQUIREMENTS, triton_min_compute_capability

    assert sorted(TRITON_DRIVER_REQUIREMENTS) == sorted(IMAGES)
    for release, row in IMAGES.items():
        assert TRITON_DRIVER_REQUIREMENTS[release]["min_driver"] == compat_data.min_driver(row)
        # the per-release capability agrees with the release-range rule pre-flight applies
        assert triton_min_compute_capability(release) == row["min_compute_capability"]


@settings(max_examples=200, deadline=None)
@given(release=st.sampled_from(sorted(IMAGES)), branch=st.sampled_from(sorted(BRANCHES)),
       cls=st.sampled_from(sorted(GPU_CLASSES)),
       minor=st.integers(0, 300), patch=st.integers(0, 99), revision=st.sampled_from(["", "-1", "-0ubuntu1"]))
def test_a_full_version_is_judged_as_its_branch_from_the_first_release_on(release, branch, cls, minor, patch,
                                                                          revision):
    """A release of a branch runs an image when the branch does, except below the first release the
    notes name for a forward-compatibility branch; a newer release of the same branch never runs less."""
    image = f"nvcr.io/nvidia/tritonserver:{release}-py3"
    version = f"{branch}.{minor}.{patch:02d}{revision}"
    ok = compat.judge(image, version, cls)[0]
    first = IMAGES[release]["datacenter"].get(branch)
    if first and ok is False and compat.judge(image, branch, cls)[0]:
        assert _v(f"{branch}.{minor}.{patch:02d}") < _v(first)
    else:
        assert ok is compat.judge(image, branch, cls)[0]
    if ok:
        assert compat.judge(image, f"{branch}.{minor + 1}.{patch:02d}{revision}", cls)[0]


def test_docs_show_the_current_table():
    doc = (ROOT / "docs" / "driver-sources.md").read_text()
    assert compat.markdown() in doc, "docs/driver-sources.md: paste the output of `python -m tritonfleet.gpu.compat`"
    for row in compat_data.images():
        assert f"| {row['release']} | {row['server']} | {row['cuda']} |" in doc, row["release"]
