"""Docker image archives (`docker save` format) as the control machine sees them."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path


def _manifest(tf: tarfile.TarFile) -> list[dict]:
    f = tf.extractfile("manifest.json")
    if f is None:
        raise ValueError("no manifest.json")
    return json.load(f)


def image_id(archive: Path) -> str:
    """The image ID (``sha256:<hash of the config>``) `docker load` gives the archive's first image."""
    with tarfile.open(archive, "r:*") as tf:
        m = _manifest(tf)
        cfg = tf.extractfile(m[0]["Config"])
        if cfg is None:
            raise ValueError(f"{archive}: config {m[0]['Config']} missing")
        return "sha256:" + hashlib.sha256(cfg.read()).hexdigest()


def archive_tags(archive: Path) -> list[str]:
    with tarfile.open(archive, "r:*") as tf:
        return [t for m in _manifest(tf) for t in (m.get("RepoTags") or [])]
