"""The package's wheel built as an operator would get it: from a clean copy of the checkout's
sources (no caches, no build directories), with pip, without build isolation or an index
(tritonfleet_testbed.origin_server.build_wheel, which pull mode's tests and benchmark publish)."""

from __future__ import annotations

from pathlib import Path

from tritonfleet_testbed.origin_server import WHEEL_SOURCES
from tritonfleet_testbed.origin_server import build_wheel as _build_wheel

#: what the wheel is built from (the test tooling is not among them: it is a project of its own)
SOURCES = WHEEL_SOURCES


def build_wheel(work: Path, sources: tuple[str, ...] = SOURCES) -> Path:
    """The wheel built in ``work/dist`` (``work/dist/src`` the copy)."""
    return _build_wheel(work / "dist", sources)
