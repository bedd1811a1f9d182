"""Docker images as the control machine sees them: the ID of the image an archive (``docker save``
format) holds (what ``docker load`` gives the host), read without unpacking the layers, so a
multi-GB archive answers in milliseconds; an image reference's parts and registry, and which
images a host pulls and whether that needs the registry login (the login itself:
tritonfleet.serving.ops.registry)."""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from pathlib import Path

from ..pyinfra_ext import memo
from ..settings.access import Settings
from .facts import DockerImageId


def read_metadata(archive: Path) -> dict[str, bytes]:
    """The small files of a ``docker save`` archive (everything but layer tars), by name."""
    files: dict[str, bytes] = {}
    with tarfile.open(archive, "r|*") as tf:
        for member in tf:
            name = member.name.removeprefix("./")
            if member.isfile() and not name.endswith("layer.tar") and member.size < 16 << 20:
                files[name] = tf.extractfile(member).read()
            manifest = files.get("manifest.json")
            if manifest and all(m["Config"] in files for m in json.loads(manifest)):
                break
    if "manifest.json" not in files:
        raise ValueError(f"{archive}: no manifest.json, not a docker save archive")
    return files


def image_id(archive: Path) -> str:
    """``sha256:<hex>`` of the image config: the ID ``docker images --no-trunc`` shows."""
    files = read_metadata(Path(archive))
    config = files[json.loads(files["manifest.json"])[0]["Config"]]
    return "sha256:" + hashlib.sha256(config).hexdigest()


def registry_of(image: str) -> str:
    """The registry an image reference pulls from, by Docker's rules: the first path component
    when it has a '.' or ':' or is 'localhost', else Docker Hub (docker.io)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def login_registry(settings: Settings) -> str:
    """The registry the login (registry_user) is for: registry_host, or triton_image's registry."""
    return settings.get("registry_host") or registry_of(settings.get("triton_image"))


def needs_login(settings: Settings, image: str) -> bool:
    """Pulling ``image`` needs the registry login (never through the image mirror: the mirror
    logs in to its upstream itself)."""
    return (
        bool(settings.get("registry_user"))
        and registry_of(image) == login_registry(settings)
        and registry_of(image) != settings.get("image_mirror")
    )


def needs_mirror_login(settings: Settings, image: str) -> bool:
    """Pulling ``image`` goes through the image mirror, which asks its clients to log in
    (``image_mirror_auth``): the host logs in as ``mirror_client_user`` first."""
    return (
        bool(settings.get("image_mirror"))
        and bool(settings.get("image_mirror_auth"))
        and registry_of(image) == settings.get("image_mirror")
    )


def pulls(settings: Settings, images: list[str]) -> list[str]:
    """Those of ``images`` the current host will pull (no archive configured, not present yet)."""
    archives = settings.get("image_archives") or {}
    return [i for i in images if i not in archives and not memo.fact(DockerImageId, image=i)]


DIGEST_RE = r"sha256:[0-9a-f]{64}"


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """Docker's image reference grammar, the parts tritonfleet needs: ``name[:tag][@digest]`` ->
    (name, tag or None, digest or None). A ':' before the last '/' belongs to a registry port."""
    ref, _, digest = str(image).partition("@")
    name, tag = ref, None
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        name, tag = ref[:colon], ref[colon + 1 :]
    if digest and not re.fullmatch(DIGEST_RE, digest):
        raise ValueError(f"image {image!r}: the digest must be sha256:<64 hex digits>")
    return name, tag, digest or None
