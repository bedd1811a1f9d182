"""The compatibility facts as shipped (tritonfleet/data/compat/): Triton images, driver branches,
Container Toolkit releases, each row with its sources.

Parse only: ``gpu.rules`` takes Triton's driver requirements from here and ``gpu.compat`` answers
"can this image run on this branch with these GPUs" from the same rows.
"""

from __future__ import annotations

from functools import cache

import tomllib

from .. import resource

DATA = resource("data", "compat")
FILES = ("triton_images", "driver_branches", "container_toolkit")


@cache
def load(name: str) -> dict:
    """The parsed file ``data/compat/<name>.toml``."""
    return tomllib.loads((DATA / f"{name}.toml").read_text())


def images() -> list[dict]:
    """Every Triton image row, oldest release first."""
    return sorted(load("triton_images")["image"], key=lambda r: tuple(int(p) for p in r["release"].split(".")))


def branches() -> list[dict]:
    """Every driver branch row, oldest first."""
    return sorted(load("driver_branches")["branch"], key=lambda r: int(r["branch"]))


def architectures() -> dict[str, str]:
    """Compute capability ("7.5") -> architecture ("turing")."""
    return dict(load("driver_branches")["architectures"])


def cuda_major_min_branch() -> dict[str, str]:
    """CUDA major version ("13") -> the first branch that runs it without forward compatibility."""
    return dict(load("driver_branches")["cuda_major_min_branch"])


def toolkit_releases() -> list[dict]:
    """Every Container Toolkit release row, oldest first."""
    return sorted(load("container_toolkit")["release"], key=lambda r: tuple(int(p) for p in r["version"].split(".")))


def min_driver(image_row: dict) -> str:
    """The branch an image needs without forward compatibility: the stricter of its release notes'
    "requires NVIDIA Driver release N or later" and the first branch of its CUDA major version."""
    need = cuda_major_min_branch()[image_row["cuda"].split(".", 1)[0]]
    said = image_row.get("min_driver")
    return said if said and int(said) > int(need) else need


def rows_of(name: str) -> list[dict]:
    """The rows of one file (images, branches or toolkit releases), for checks over every row."""
    return {"triton_images": images, "driver_branches": branches, "container_toolkit": toolkit_releases}[name]()
