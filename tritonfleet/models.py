"""The model repository on the control machine: per-class rendering and the release manifest.

A release is identified by the hash of its manifest (every file's path, size and sha256), so the
same repository gives the same release id on every host and every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

CACHE_DIR = Path(os.environ.get("TRITONFLEET_LOCAL_CACHE", Path.home() / ".cache" / "tritonfleet"))
MARKER = ".tritonfleet-release"


def _hash_cache_file() -> Path:
    return CACHE_DIR / "sha256-cache.json"


def cache_key(path: Path, st: os.stat_result) -> str:
    """What the local sha256 cache knows a file by: its path, and the identity and times stat
    gives (device and inode, size, mtime and ctime in ns). A file replaced by another one of the
    same size and mtime (a copy with preserved times, a rename over it, an in-place rewrite whose
    mtime was set back) has another inode or a new ctime, which no user can set back: it is hashed
    again. (Like git's index, a rewrite within the same clock tick as the previous hash can keep
    the ctime: docs/hardening.md.)"""
    return f"{path.resolve()}|{st.st_dev}:{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def _cached_path(key: str) -> str:
    return key.rsplit("|", 4)[0]


def file_sha256(path: Path, cache: dict | None = None) -> str:
    key = cache_key(path, path.stat())
    if cache is not None and key in cache:
        return cache[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if cache is not None:
        cache[key] = digest
    return digest


def manifest(repo: Path) -> dict[str, list]:
    """{relative path: [size, sha256]} for every file in ``repo`` (hidden top-level entries skipped)."""
    cache_path = _hash_cache_file()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    out: dict[str, list] = {}
    used: dict[str, str] = {}
    for root, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            p = Path(root) / name
            rel = p.relative_to(repo).as_posix()
            st = p.stat()
            key = cache_key(p, st)
            digest = cache.get(key) or file_sha256(p, cache)
            used[key] = digest
            out[rel] = [st.st_size, digest]
    # entries of files seen now under another identity, size or time are stale: drop them
    seen = {_cached_path(k) for k in used}
    fresh = {k: v for k, v in cache.items() if _cached_path(k) not in seen}
    fresh.update(used)
    if fresh != cache or not cache_path.exists():
        try:
            CACHE_DIR.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_name(f"{cache_path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(fresh))
            tmp.replace(cache_path)
        except OSError:
            pass
    return out


def release_id(man: dict[str, list]) -> str:
    return hashlib.sha256(json.dumps(man, sort_keys=True).encode()).hexdigest()[:16]


def apply_overrides(config_text: str, override: dict) -> str:
    """Replace top-level fields of a config.pbtxt (Triton's ModelConfig schema) by ``override``."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(config_text, cfg)
    for key in override:
        cfg.ClearField(key)
    json_format.ParseDict(override, cfg)
    return text_format.MessageToString(cfg)


def render(src: Path, overrides: dict | None, dest_root: Path | None = None) -> Path:
    """The repository as a host of this class serves it: ``src`` with ``overrides``
    ({model: {field: value}}) applied. Without overrides, ``src`` itself."""
    if not overrides:
        return src
    key = hashlib.sha256(json.dumps(overrides, sort_keys=True).encode() + str(src.resolve()).encode()).hexdigest()[:12]
    dest = (dest_root or CACHE_DIR / "rendered") / key
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel_root = Path(root).relative_to(src)
        (tmp / rel_root).mkdir(parents=True, exist_ok=True)
        for name in files:
            if name.startswith("."):
                continue
            s, d = Path(root) / name, tmp / rel_root / name
            model = rel_root.parts[0] if rel_root.parts else None
            if name == "config.pbtxt" and len(rel_root.parts) == 1 and model in overrides:
                try:
                    d.write_text(apply_overrides(s.read_text(), overrides[model]))
                except Exception as e:  # protobuf parse errors: name the file
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise ValueError(f"{s}: cannot apply model_overrides[{model!r}]: {e}") from e
            else:
                try:
                    os.link(s, d)
                except OSError:
                    shutil.copy2(s, d)
    unknown = set(overrides) - {p.name for p in src.iterdir() if p.is_dir()}
    if unknown:
        shutil.rmtree(tmp)
        raise ValueError(f"model_overrides names models not in {src}: {', '.join(sorted(unknown))}")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def model_names(repo: Path) -> list[str]:
    return sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
