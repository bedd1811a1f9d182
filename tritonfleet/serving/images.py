"""Docker image archives (`docker save` format) as the control machine sees them: the ID of the
image an archive holds (what ``docker load`` gives the host), read without unpacking the layers,
so a multi-GB archive answers in milliseconds."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path


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
