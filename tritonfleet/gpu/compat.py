"""Can a Triton image run on a host with driver branch B and GPUs of class G: one answer with its
reason and the fix (a newer branch, an older image), from the rows of tritonfleet/data/compat/.

Pure: pre-flight asks it for every host (tritonfleet.preflight: check_gpu_class_and_driver,
check_driver_branch); ``table()`` is the whole image x branch x GPU class table the tests check and
docs/driver-sources.md shows (``python -m tritonfleet.gpu.compat`` prints it). The rule, in order:

1. the image's release has a row (its release notes' driver and GPU requirements);
2. the GPU class's compute capability is at least the image's lowest (``rules.compute_capability_problem``);
3. the branch supports the class's architecture (a branch without a row is not judged here);
4. the driver meets the image's requirement (``rules.driver_supported``): its branch at least the
   stricter of the notes' branch and the CUDA major version's, or a data-center forward-compatibility
   branch at its first release the notes name (every class here is a data-center GPU: T4, L4).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from . import compat_data
from .rules import (
    GPU_CLASSES,
    class_compute_capability,
    compute_capability_problem,
    driver_supported,
    triton_release,
)


@dataclass(frozen=True)
class CompatVerdict:
    """``ok``: the image runs; ``reason``: why (the requirement and what was found); ``fix``: what
    would run instead ("" when ok, or when nothing known would)."""

    ok: bool
    reason: str
    fix: str = ""


def image_releases() -> list[str]:
    """Every Triton release with a row, oldest first."""
    return [r["release"] for r in compat_data.images()]


def branch_names() -> list[str]:
    """Every driver branch with a row, oldest first."""
    return [r["branch"] for r in compat_data.branches()]


def architecture(gpu_class) -> str | None:
    """The architecture ("turing") of the GPUs of ``gpu_class`` (None: unknown class or capability)."""
    cc = class_compute_capability(gpu_class)
    return compat_data.architectures().get(cc) if cc else None


def _branch_row(branch: str) -> dict | None:
    return next((r for r in compat_data.branches() if r["branch"] == branch), None)


def _branch_of(branch_or_version) -> str | None:
    m = re.match(r"^(?:\d+:)?(\d+)(?:[.-]|$)", str(branch_or_version).strip())
    return m.group(1) if m else None


def _image(release: str) -> str:
    return f"nvcr.io/nvidia/tritonserver:{release}-py3"


def judge(image: str, branch_or_version, gpu_class) -> tuple[bool, str]:
    """Steps 1-4 of the rule without the fix: (runs, reason)."""
    cls = str(gpu_class or "").upper()
    if cls not in GPU_CLASSES:
        return False, f"unknown GPU class {gpu_class!r} (known: {', '.join(GPU_CLASSES)})"
    release = triton_release(image)
    if release not in image_releases():
        return driver_supported(branch_or_version, image)  # its words: no requirements known
    problem = compute_capability_problem(cls, image)
    if problem:
        return False, problem
    branch = _branch_of(branch_or_version)
    row = _branch_row(branch) if branch else None
    arch = architecture(cls)
    if row is not None and arch not in row["architectures"]:
        return False, (
            f"driver branch R{branch} does not support {arch.capitalize()} GPUs (GPU class {cls}, compute "
            f"capability {class_compute_capability(cls)}); it supports "
            f"{', '.join(a.capitalize() for a in row['architectures'])}"
        )
    return driver_supported(branch_or_version, image, datacenter=True)


def fix(image: str, branch_or_version, gpu_class) -> str:
    """What would run instead of ``image`` on ``branch_or_version`` with ``gpu_class``: the known
    branches that run the image (oldest first), and the newest known image the branch runs."""
    cls = str(gpu_class or "").upper()
    if cls not in GPU_CLASSES:
        return f"put the host in one of the GPU classes {', '.join(GPU_CLASSES)}"
    release = triton_release(image)
    branch = _branch_of(branch_or_version) or ""
    parts = []
    if release in image_releases():
        newer = [b for b in branch_names() if judge(image, b, cls)[0] and (not branch or int(b) > int(branch))]
        if newer:
            parts.append(
                f"a driver branch that runs Triton {release} on {cls}: {newer[0]}"
                + (f" (or {', '.join(newer[1:])})" if newer[1:] else "")
            )
    older = [r for r in image_releases() if branch and judge(_image(r), branch_or_version, cls)[0]]
    if older:
        parts.append(f"a triton_image that R{branch} runs on {cls}: Triton {older[-1]} ({_image(older[-1])}) or older")
    return "; or ".join(parts)


def verdict(image: str, branch_or_version, gpu_class) -> CompatVerdict:
    """The rule's answer for one host: runs or not, why, and (when not) the fix."""
    ok, reason = judge(image, branch_or_version, gpu_class)
    return CompatVerdict(ok, reason, "" if ok else fix(image, branch_or_version, gpu_class))


def table() -> list[tuple[str, str, str, bool, str]]:
    """(release, branch, GPU class, runs, reason) for every known image x branch x GPU class."""
    return [
        (r, b, cls, *judge(_image(r), b, cls)) for r in image_releases() for b in branch_names() for cls in GPU_CLASSES
    ]


def markdown() -> str:
    """The table as docs/driver-sources.md shows it: a row per image, a column per branch, the GPU
    classes that run it in each cell."""
    branches = branch_names()
    runs: dict[tuple[str, str], list[str]] = {}
    for release, branch, cls, ok, _ in table():
        if ok:
            runs.setdefault((release, branch), []).append(cls)
    head = "| Triton (server, CUDA) | " + " | ".join(f"R{b}" for b in branches) + " |"
    rows = [head, "|---|" + "---|" * len(branches)]
    for row in compat_data.images():
        cells = [" ".join(runs.get((row["release"], b), [])) or "-" for b in branches]
        rows.append(f"| {row['release']} ({row['server']}, {row['cuda']}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
