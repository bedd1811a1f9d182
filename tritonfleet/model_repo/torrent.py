"""A release's objects as one BitTorrent swarm: the metainfo (.torrent) the control machine makes
from the files it already hashed, and who seeds (pure; the host side: tritonfleet.model_repo.swarm).

The torrent is a multi-file torrent named ``sha256`` whose files are the release's non-empty
objects, each named by its SHA-256, sorted: laid out on disk exactly as the origin lays them out
below ``objects/`` (``objects/sha256/<hex>``). So the origin is its web seed with no extra copy:
BEP 19's ``url-list`` entry ``<origin>/objects/`` plus the torrent's name and the file's path is
the object's URL. The ``info`` dictionary (and so the info hash) depends only on the objects and
the piece length; the tracker and the web seed are outside it, so the seeds' torrent (with the
web seed) and the other hosts' (without: they take every byte from their peers) are one swarm.

BitTorrent checks every piece against the SHA-1 in ``pieces`` before it keeps or serves it; the
host then checks every object against the SHA-256 of the manifest before anything uses it. The
torrent itself never comes from a peer: the control machine sends it over SSH.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

NAME = "sha256"


def bencode(value) -> bytes:
    """BitTorrent's encoding (BEP 3): int, bytes/str, list, dict with keys sorted as raw strings."""
    if isinstance(value, bool):
        raise TypeError("bencode has no booleans")
    if isinstance(value, int):
        return b"i%de" % value
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return b"%d:%s" % (len(value), value)
    if isinstance(value, list):
        return b"l" + b"".join(bencode(v) for v in value) + b"e"
    if isinstance(value, dict):
        items = sorted((k.encode() if isinstance(k, str) else k, v) for k, v in value.items())
        return b"d" + b"".join(bencode(k) + bencode(v) for k, v in items) + b"e"
    raise TypeError(f"cannot bencode {type(value).__name__}")


@dataclass(frozen=True)
class Torrent:
    info: dict
    info_hash: str  # hex SHA-1 of the bencoded info dictionary (the swarm's name)
    files: tuple[str, ...]  # the objects' SHA-256s, in the torrent's order

    def metainfo(self, tracker: str, web_seed: str | None = None) -> bytes:
        """The .torrent file: ``tracker``'s announce URL and, for a seed, the origin's
        ``objects/`` URL as its web seed."""
        meta: dict = {"announce": tracker, "info": self.info}
        if web_seed:
            meta["url-list"] = [web_seed if web_seed.endswith("/") else web_seed + "/"]
        return bencode(meta)


def _chunks(objects: list[tuple[str, int]], open_object, piece: int) -> Iterable[bytes]:
    """The SHA-1 of every ``piece`` bytes of the objects laid end to end."""
    h, filled = hashlib.sha1(), 0
    for sha, _size in objects:
        with open_object(sha) as f:
            while block := f.read(min(piece - filled, 1 << 20)):
                h.update(block)
                filled += len(block)
                if filled == piece:
                    yield h.digest()
                    h, filled = hashlib.sha1(), 0
    if filled:
        yield h.digest()


def make(objects: dict[str, int], open_object, piece_bytes: int, name: str = NAME, prefix: str = "") -> Torrent:
    """The torrent of ``objects`` ({sha256: size}; empty ones are left out: every host makes
    those itself); ``open_object(sha)`` opens an object's content for reading. ``name`` and
    ``prefix`` lay the files out as ``<name>/<prefix><sha256>`` (a release: ``sha256/<hex>``, as
    the origin's ``objects/``; an image: ``blobs/sha256:<hex>``, as a registry's blob URLs)."""
    if piece_bytes < 16 * 1024 or piece_bytes & (piece_bytes - 1):
        raise ValueError(f"a piece is a power of two of at least 16 KiB, not {piece_bytes}")
    files = sorted((sha, int(size)) for sha, size in objects.items() if int(size) > 0)
    if not files:
        raise ValueError("a torrent needs at least one non-empty object")
    pieces = b"".join(_chunks(files, open_object, piece_bytes))
    info = {
        "name": name,
        "piece length": piece_bytes,
        "pieces": pieces,
        "files": [{"length": size, "path": [prefix + sha]} for sha, size in files],
    }
    return Torrent(info, hashlib.sha1(bencode(info)).hexdigest(), tuple(sha for sha, _ in files))


def from_repository(root: Path, manifest: dict, shas: Iterable[str], piece_bytes: int) -> Torrent:
    """The torrent of the objects ``shas`` of the release at ``root`` (``manifest``: path ->
    (size, sha256), as tritonfleet.model_repo.render makes it)."""
    wanted = set(shas)
    where: dict[str, tuple[int, Path]] = {}
    for path, (size, sha) in manifest.items():
        if sha in wanted and sha not in where:
            where[sha] = (int(size), root / path)
    return make({sha: size for sha, (size, _) in where.items()}, lambda sha: open(where[sha][1], "rb"), piece_bytes)


def web_seed(object_url: str, sha: str) -> str | None:
    """The origin's ``objects/`` URL from one object's plain URL (``.../objects/sha256/<sha>``), or
    None when the URL is signed or shaped otherwise (no web seed then)."""
    tail = f"{NAME}/{sha}"
    if "?" in object_url or "#" in object_url or not object_url.endswith("/" + tail):
        return None
    return object_url[: -len(tail)]


def seeds(hosts: list[tuple[str, str | None, bool | None]]) -> set[str]:
    """Who takes the release from the origin (its web seed) and so seeds the wave.

    ``hosts``: (name, zone or None, the host's own ``fanout_seed`` or None) of every host of the
    wave. A host that says ``fanout_seed = True`` seeds; in a zone where none says so, the zone's
    first host by name that does not say False seeds. No topology at all: one seed for the wave.
    """
    zones: dict[str | None, list[tuple[str, bool | None]]] = {}
    for name, zone, seed in hosts:
        zones.setdefault(zone, []).append((name, seed))
    out: set[str] = set()
    for members in zones.values():
        chosen = {n for n, s in members if s is True}
        if not chosen:
            chosen = {n for n, s in sorted(members) if s is not False}
            chosen = {min(chosen)} if chosen else set()
        out |= chosen
    return out
