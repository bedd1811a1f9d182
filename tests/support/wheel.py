"""The package's wheel built as an operator would get it: from a clean copy of the checkout's
sources (no caches, no build directories), with pip, without build isolation or an index."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tritonfleet import ROOT

#: what the wheel is built from (the test tooling is not among them: it is a project of its own)
SOURCES = ("pyproject.toml", "README.md", "tritonfleet", "deploys", "inventories", "files")


def build_wheel(work: Path, sources: tuple[str, ...] = SOURCES) -> Path:
    """The wheel built in ``work`` (``work/src`` the copy, ``work/dist`` the wheel)."""
    src = work / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in sources:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(work / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise AssertionError(f"pip wheel failed: {res.stderr[-3000:]}")
    (wheel,) = (work / "dist").glob("tritonfleet-*.whl")
    return wheel
