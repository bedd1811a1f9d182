"""The image tunables as the hosts pull them: ``triton_image`` and ``cuda_test_image`` rewritten
to ``image_mirror`` when it is set (docs/model-origin.md).

A rule of how tunables combine, so it lives with the accessor: the deploy's settings
(tritonfleet.settings.access.get) and the fleet commands' (tritonfleet.inventory.roster) both
give every reader the rewritten reference, so the unit, the image facts, the history and the
status all name the image the host really runs. The mirror itself (its registry configuration,
the fill) is tritonfleet.serving.image_mirror. Pure: imports nothing of tritonfleet but the
defaults.
"""

from __future__ import annotations

import re
from typing import Any

from .defaults import DEFAULTS

#: the tunables that name an image the hosts pull (rewritten to the mirror)
MIRRORED = ("triton_image", "cuda_test_image")
#: image_mirror_upstream's default (tritonfleet/settings/defaults.py)
DEFAULT_UPSTREAM = DEFAULTS["image_mirror_upstream"]


def parse_reference(image: str) -> tuple[str, str, str | None, str | None]:
    """(registry, repository path, tag, digest) by Docker's reference rules (as
    tritonfleet.serving.images.registry_of and split_image read them): the first component is a
    registry when it holds '.' or ':' or is 'localhost', else Docker Hub, whose one-word names
    are below library/."""
    ref, _, digest = str(image).partition("@")
    name, tag = ref, None
    slash, colon = ref.rfind("/"), ref.rfind(":")
    if colon > slash:
        name, tag = ref[:colon], ref[colon + 1 :]
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = "docker.io", name if "/" in name else f"library/{name}"
    return registry, path, tag, digest or None


def registry_host(url: str) -> str:
    """'nvcr.io' of 'https://nvcr.io' (the registry part of an image reference)."""
    return re.sub(r"^[a-z]+://", "", str(url)).rstrip("/").split("/", 1)[0]


def rewrite(image: str, mirror: str | None, upstream: str) -> str:
    """``image`` as the hosts pull it: through ``mirror`` when it is an image of the
    ``upstream`` registry (``<mirror>/<path>[:tag][@digest]``), else as it is."""
    if not mirror:
        return image
    registry, path, tag, digest = parse_reference(image)
    if registry != registry_host(upstream):
        return image
    return f"{mirror}/{path}{f':{tag}' if tag else ''}{f'@{digest}' if digest else ''}"


def through_mirror(key: str, value: Any, settings: Any) -> Any:
    """The tunable ``key``'s ``value`` as the hosts pull it (``settings``: the host's
    tritonfleet.settings.access.Settings, for its other tunables): rewritten when ``key`` names
    an image and ``image_mirror`` is set."""
    if key not in MIRRORED or not value:
        return value
    mirror = settings.get("image_mirror")
    if not mirror:
        return value
    return rewrite(value, mirror, settings.get("image_mirror_upstream"))


def unpinned_images(settings: Any) -> list[tuple[str, str, str]]:
    """(tunable, its value, the upstream reference to pin) of each image pulled through
    ``image_mirror`` without a digest (``settings``: anything with the tunables' ``get``, the
    images as the hosts pull them): the mirror then serves whatever the tag names upstream when
    it first fills, not one set of bytes to every host. Pre-flight refuses these; `tritonfleet
    check` reports them."""
    mirror = settings.get("image_mirror")
    if not mirror:
        return []
    out = []
    for key in MIRRORED:
        registry, path, tag, digest = parse_reference(settings.get(key))
        if registry == mirror and not digest:
            upstream = f"{registry_host(settings.get('image_mirror_upstream'))}/{path}:{tag or 'latest'}"
            out.append((key, str(settings.get(key)), upstream))
    return out


def apply(data: dict[str, Any]) -> dict[str, Any]:
    """Host data (a dict of tunables, defaults included) with the images rewritten to the mirror."""
    mirror = data.get("image_mirror")
    if not mirror:
        return data
    out = dict(data)
    for key in MIRRORED:
        if out.get(key):
            out[key] = rewrite(out[key], mirror, data.get("image_mirror_upstream") or DEFAULT_UPSTREAM)
    return out


def unpinned(image: str, mirror: str | None, upstream: str) -> bool:
    """The image goes through the mirror but names no digest (the mirror would ask the upstream
    about a tag that may move)."""
    return bool(mirror) and parse_reference(image)[0] == registry_host(upstream) and not parse_reference(image)[3]
