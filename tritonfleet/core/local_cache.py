"""What a deploy remembers on the control machine between runs, and where.

``CACHE_DIR`` (``TRITONFLEET_LOCAL_CACHE``, default ``~/.cache/tritonfleet``) holds the model
repository's file hashes, the rendered copies, the validator's verdicts, what was derived from a
config.pbtxt by parsing it (tritonfleet.model_repo.verdicts) and the unit template compiled
(tritonfleet.serving.unit). Everything there is kept under a key that covers all it was derived
from, so a changed input is a new key, never a stale answer; a cache directory that cannot be
written only costs the next run the work again. ``TRITONFLEET_SPEED=off``
(tritonfleet.core.speed, ``local_cache``): nothing is read or written, everything is derived again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from . import speed

CACHE_DIR = Path(os.environ.get("TRITONFLEET_LOCAL_CACHE", Path.home() / ".cache" / "tritonfleet"))


def digest(*parts: bytes | str) -> str:
    """sha256 over ``parts``, each with its length (no two lists of parts give the same bytes)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(f"{len(data)}\0".encode() + data)
    return h.hexdigest()


def read(path: Path) -> str | None:
    """The text remembered at ``path``; None when there is none, it cannot be read, or it is not
    what :func:`write` wrote (its first line, the sha256 of the rest, does not match), or the
    speed switch is off."""
    if not speed.on("local_cache"):
        return None
    try:  # bytes: text mode would read a "\r" back as "\n"
        seal, _, data = path.read_bytes().partition(b"\n")
    except OSError:
        return None
    if seal != hashlib.sha256(data).hexdigest().encode():
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def write(path: Path, text: str) -> None:
    """Remember ``text`` at ``path``, after a line with its sha256: written whole under another
    name, then renamed (a concurrent run reads the old file, or none, or this one, never half of
    one). An error is ignored; nothing is written with the speed switch off."""
    if not speed.on("local_cache"):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        data = text.encode()
        tmp.write_bytes(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
        tmp.replace(path)
    except (OSError, UnicodeEncodeError):  # UnicodeEncodeError: a text with lone surrogates
        pass
