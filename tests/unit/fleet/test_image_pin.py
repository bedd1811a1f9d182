"""triton_image pinned by digest, and `status` telling a moved tag from the image it names."""

from __future__ import annotations

import pytest

from tritonfleet.fleet.probe import HostStatus, drift, interpret, parse
from tritonfleet.gpu.rules import driver_supported, triton_release
from tritonfleet.serving.images import split_image

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
ID1 = "sha256:" + "a" * 64
ID2 = "sha256:" + "b" * 64
TAG = "nvcr.io/nvidia/tritonserver:24.08-py3"


@pytest.mark.parametrize("ref,parts", [
    (TAG, ("nvcr.io/nvidia/tritonserver", "24.08-py3", None)),
    (f"{TAG}@{D1}", ("nvcr.io/nvidia/tritonserver", "24.08-py3", D1)),
    (f"nvcr.io/nvidia/tritonserver@{D1}", ("nvcr.io/nvidia/tritonserver", None, D1)),
    (f"localhost:5000/triton:24.08-py3@{D1}", ("localhost:5000/triton", "24.08-py3", D1)),
    ("localhost:5000/triton", ("localhost:5000/triton", None, None)),
])
def test_split_image(ref, parts):
    assert split_image(ref) == parts


def test_a_bad_digest_is_refused():
    with pytest.raises(ValueError, match="sha256:<64 hex digits>"):
        split_image(f"{TAG}@sha256:abc")


def test_a_digest_pin_keeps_the_release_its_tag_names():
    assert triton_release(f"{TAG}@{D1}") == "24.08"
    assert driver_supported("535", f"{TAG}@{D1}")[0]
    ok, why = driver_supported("535", f"nvcr.io/nvidia/tritonserver@{D1}")
    assert not ok and "name:<tag>@sha256:<digest>" in why


def probed(image_lines, wanted=None) -> HostStatus:
    text = "\n".join(["@active", "active", "@image", *image_lines, "@wanted_image", *([wanted] if wanted else [])])
    return interpret(_FH, parse(text))


class _FH:
    name, address, gpu_class = "tb1-t4", "10.77.4.2", None


def test_status_reads_the_running_image():
    st = probed([f"{TAG}|{ID1}", f"digests=nvcr.io/nvidia/tritonserver@{D1}"], ID1)
    assert (st.image, st.image_id, st.image_digests, st.wanted_image_id) == (
        TAG, ID1, [f"nvcr.io/nvidia/tritonserver@{D1}"], ID1)
    assert drift(st, {"image": TAG}) == []


def test_a_moved_tag_is_drift():
    """The tag names another image on the host than the one the container runs."""
    st = probed([f"{TAG}|{ID1}", "digests="], ID2)
    (d,) = drift(st, {"image": TAG})
    assert f"image {TAG} moved" in d and "b" * 12 in d and "a" * 12 in d and "pin triton_image by digest" in d


def test_a_digest_pin_compares_repository_digests():
    pinned = f"{TAG}@{D1}"
    assert drift(probed([f"{pinned}|{ID1}", f"digests=nvcr.io/nvidia/tritonserver@{D1}"], ID1),
                 {"image": pinned}) == []
    (d,) = drift(probed([f"{pinned}|{ID1}", f"digests=nvcr.io/nvidia/tritonserver@{D2}"], ID1), {"image": pinned})
    assert f"is not nvcr.io/nvidia/tritonserver@{D1[:19]}" in d and D2[:19] in d
    # loaded from an archive (no repository digests): the IDs are compared
    assert drift(probed([f"{pinned}|{ID1}", "digests="], ID1), {"image": pinned}) == []
    assert "moved" in drift(probed([f"{pinned}|{ID1}", "digests="], ID2), {"image": pinned})[0]


def test_another_reference_and_a_missing_image():
    assert drift(probed([f"other:1|{ID1}", "digests="], ID1), {"image": TAG}) == [f"image other:1 (want {TAG})"]
    assert "is not on the host" in drift(probed([f"{TAG}|{ID1}", "digests="]), {"image": TAG})[0]
