"""The model repository on the control machine: per-class rendering and the release manifest.

A release is identified by the hash of its manifest (every file's path, size and sha256), so the
same repository gives the same release id on every host and every run.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from . import runid

CACHE_DIR = Path(os.environ.get("TRITONFLEET_LOCAL_CACHE", Path.home() / ".cache" / "tritonfleet"))
MARKER = ".tritonfleet-release"


def _hash_cache_file() -> Path:
    return CACHE_DIR / "sha256-cache.json"


_RENDERED_RUN = re.compile(r"^([0-9a-f]{12})\.[A-Za-z0-9-]+$")


def _cache_path(path: Path) -> str:
    """The path a file's hash is cached under: its own, except that a per-run rendered copy
    (rendered/<key>.<run>/...) counts as rendered/<key>/... so the next run's copy of the same
    file (same size and mtime: a hard link, or the same override) is not read again."""
    resolved = path.resolve()
    parts = resolved.parts
    for i, part in enumerate(parts[:-1]):
        if part == "rendered" and i + 1 < len(parts):
            m = _RENDERED_RUN.match(parts[i + 1])
            if m:
                return str(Path(*parts[:i + 1], m.group(1), *parts[i + 2:]))
    return str(resolved)


def file_sha256(path: Path, cache: dict | None = None) -> str:
    st = path.stat()
    key = f"{_cache_path(path)}|{st.st_size}|{st.st_mtime_ns}"
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
            key = f"{_cache_path(p)}|{st.st_size}|{st.st_mtime_ns}"
            digest = cache.get(key) or file_sha256(p, cache)
            used[key] = digest
            out[rel] = [st.st_size, digest]
    # entries of files seen now under another size or mtime are stale: drop them
    seen = {k.rsplit("|", 2)[0] for k in used}
    fresh = {k: v for k, v in cache.items() if k.rsplit("|", 2)[0] not in seen}
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


def _run_alive(name: str) -> bool:
    """Whether the run that rendered ``name`` (<key>.<run id>, or a .tmp- directory of it) may
    still be using it."""
    m = re.search(r"\.\d{8}T\d{6}-(\d+)-[0-9a-f]+(\.|$)", name)
    if not m:
        return True  # not ours to judge
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _prune_rendered(root: Path) -> None:
    """Remove what runs that are gone rendered (and left behind: killed, or crashed)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for d in entries:
        if not _run_alive(d.name):
            shutil.rmtree(d, ignore_errors=True)


def render(src: Path, overrides: dict | None, dest_root: Path | None = None) -> Path:
    """The repository as a host of this class serves it: ``src`` with ``overrides``
    ({model: {field: value}}) applied. Without overrides, ``src`` itself.

    Each run renders into a directory of its own (rendered/<key>.<run id>, removed when the
    run ends; what killed runs left is removed by the next): a second operator's run never
    replaces the files a first one is sending."""
    if not overrides:
        return src
    key = hashlib.sha256(json.dumps(overrides, sort_keys=True).encode() + str(src.resolve()).encode()).hexdigest()[:12]
    root = dest_root or CACHE_DIR / "rendered"
    root.mkdir(parents=True, exist_ok=True)
    _prune_rendered(root)
    dest = root / f"{key}.{runid.RUN_ID}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}.{runid.RUN_ID}.", dir=root))
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
    _ours.add(dest)
    return dest


_ours: set[Path] = set()


@atexit.register
def _remove_ours() -> None:
    for d in _ours:
        shutil.rmtree(d, ignore_errors=True)


def model_names(repo: Path) -> list[str]:
    return sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
