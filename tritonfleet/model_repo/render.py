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
from functools import cache
from pathlib import Path

from ..core import local_cache, runid
from ..core.errors import UsageError
from ..gpu.facts import placement_gpus
from ..gpu.placement import POLICIES, place, policy_for
from ..settings.access import Settings
from . import contents

CACHE_DIR = local_cache.CACHE_DIR
MARKER = ".tritonfleet-release"


def _hash_cache_file() -> Path:
    return CACHE_DIR / "sha256-cache.json"


_RENDERED_RUN = re.compile(r"^([0-9a-f]{12})\.[A-Za-z0-9-]+$")


def _cache_path(path: Path) -> tuple[str, bool]:
    """The path a file's hash is cached under, and whether it is a per-run rendered copy: its own
    path, except that a rendered copy (rendered/<key>.<run>/...) counts as rendered/<key>/... so
    the next run's copy of the same file (a hard link to the same file) is not read again."""
    resolved = path.resolve()
    parts = resolved.parts
    for i, part in enumerate(parts[:-1]):
        if part == "rendered" and i + 1 < len(parts):
            m = _RENDERED_RUN.match(parts[i + 1])
            if m:
                return str(Path(*parts[: i + 1], m.group(1), *parts[i + 2 :])), True
    return str(resolved), False


def cache_key(path: Path, st: os.stat_result) -> str:
    """What the local sha256 cache knows a file by: its path, and the identity and times stat
    gives (device and inode, size, mtime and ctime in ns). A file replaced by another one of the
    same size and mtime (a copy with preserved times, a rename over it, an in-place rewrite whose
    mtime was set back) has another inode or a new ctime, which no user can set back: it is hashed
    again. (Like git's index, a rewrite within the same clock tick as the previous hash can keep
    the ctime: docs/hardening.md.) A per-run rendered copy is a hard link that each run makes
    anew, which changes the file's ctime every run: there the key leaves the ctime out (an
    in-place rewrite of a source file with its mtime set back is then not seen: docs/hardening.md)."""
    where, rendered = _cache_path(path)
    ctime = "-" if rendered else st.st_ctime_ns
    return f"{where}|{st.st_dev}:{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{ctime}"


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


class RepositoryError(UsageError, ValueError):
    """The local model repository holds something a release cannot reproduce on a host."""


#: top-level names the host's release directory keeps for itself (the marker, the stat record)
RESERVED_PREFIX = contents.RESERVED_PREFIX


def is_dir_entry(path: str) -> bool:
    """Whether a manifest key is an empty directory ('m/1/') rather than a file."""
    return path.endswith("/")


def walk(repo: Path):
    """Every entry of ``repo`` a release reproduces, sorted: ('file', rel, path) for each file
    and ('dir', rel + '/', path) for each directory that holds nothing (an ensemble's ``1/``).
    What a repository may contain is defined once, in tritonfleet.model_repo.contents (shared
    with ``tritonfleet validate``): symlinks inside it are followed (the host gets what a link
    points to, as Triton reads it through the link); the first entry it refuses (a link out of
    the repository or to an absolute path, a broken link, a link cycle, a FIFO/socket/device, a
    name with a line break or that is not UTF-8, a top-level name starting with
    '.tritonfleet-') raises RepositoryError naming the path and the fix."""
    repo = Path(repo)
    entries, refusals = contents.scan(repo)
    if refusals:
        first = refusals[0]
        more = f" (and {len(refusals) - 1} more: `tritonfleet validate {repo}` lists them)" if len(refusals) > 1 else ""
        raise RepositoryError(f"model repository {repo}: {first.rel}: {first.message}{more}")
    for e in entries:
        yield e.kind, e.rel, e.path


def manifest(repo: Path) -> dict[str, list]:
    """{relative path: [size, sha256]} for every file in ``repo``, and {'dir/': [0, 'dir']} for
    every directory that holds nothing (see :func:`walk`: hidden files and empty directories
    are part of the release; symlinks are followed)."""
    cache_path = _hash_cache_file()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    out: dict[str, list] = {}
    used: dict[str, str] = {}
    for kind, rel, p in walk(repo):
        if kind == "dir":
            out[rel] = [0, "dir"]
            continue
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
    """Replace top-level fields of a config.pbtxt (Triton's ModelConfig schema) by ``override``.

    The answer is remembered (CACHE_DIR/overrides) under everything it depends on: the config's
    text, the override, this module's and the validator's source with the schema loader,
    tritonfleet's version, the schema tritonclient ships and protobuf's version. A converged
    host's no-op then neither imports protobuf (16 ms) nor parses; a refusal (a field the schema
    lacks) is never remembered, so it is raised again."""
    from .derived import remembered_key

    key = remembered_key(
        "overrides", config_text, json.dumps(override, sort_keys=True, default=repr), Path(__file__).read_bytes()
    )
    path = CACHE_DIR / "overrides" / f"{key}.pbtxt"
    text = local_cache.read(path)
    if text is None:
        text = _apply_overrides(config_text, override)
        local_cache.write(path, text)
    return text


def _apply_overrides(config_text: str, override: dict) -> str:
    from google.protobuf import json_format, text_format

    from ..core.triton_schema import model_config

    model_config_pb2 = model_config()  # the schema alone (not tritonclient.grpc's client)

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


def _placed(text: str, model: str, placement: dict | None) -> str:
    """``text`` (a model's config.pbtxt) with the host's instance-group placement applied
    (tritonfleet.gpu.placement.place; ``placement``: {"gpus": N, "policy": ..., "models": {...}})."""
    if not placement or int(placement.get("gpus") or 1) <= 1:
        return text
    return place(
        text, int(placement["gpus"]), policy_for(model, placement.get("policy") or "spread", placement.get("models"))
    )


def _placement_changes(src: Path, placement: dict | None) -> bool:
    """Whether the placement changes any config.pbtxt of ``src`` as written."""
    if not placement or int(placement.get("gpus") or 1) <= 1:
        return False
    for kind, rel, s in walk(src):
        parts = rel.split("/")
        if kind == "file" and len(parts) == 2 and parts[1] == "config.pbtxt":
            text = s.read_text()
            if _placed(text, parts[0], placement) != text:
                return True
    return False


def render(src: Path, overrides: dict | None, dest_root: Path | None = None, placement: dict | None = None) -> Path:
    """The repository as a host of this class serves it: ``src`` with ``overrides``
    ({model: {field: value}}) applied, then the instance groups placed on the host's GPUs
    (``placement``, tritonfleet.gpu.placement). Without overrides and with nothing to place, ``src``
    itself.

    Each run renders into a directory of its own (rendered/<key>.<run id>, removed when the
    run ends; what killed runs left is removed by the next): a second operator's run never
    replaces the files a first one is sending."""
    overrides = overrides or {}
    if not overrides and not _placement_changes(src, placement):
        return src
    key = hashlib.sha256(
        json.dumps([overrides, placement], sort_keys=True).encode() + str(src.resolve()).encode()
    ).hexdigest()[:12]
    root = dest_root or CACHE_DIR / "rendered"
    root.mkdir(parents=True, exist_ok=True)
    _prune_rendered(root)
    dest = root / f"{key}.{runid.RUN_ID}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}.{runid.RUN_ID}.", dir=root))
    for kind, rel, s in walk(src):
        d = tmp / rel
        if kind == "dir":
            d.mkdir(parents=True, exist_ok=True)
            continue
        d.parent.mkdir(parents=True, exist_ok=True)
        parts = rel.split("/")
        model = parts[0]
        if len(parts) == 2 and parts[1] == "config.pbtxt" and model in overrides:
            try:
                d.write_text(_placed(apply_overrides(s.read_text(), overrides[model]), model, placement))
            except Exception as e:  # protobuf parse errors: name the file
                shutil.rmtree(tmp, ignore_errors=True)
                raise ValueError(f"{s}: cannot apply model_overrides[{model!r}]: {e}") from e
        elif (
            len(parts) == 2 and parts[1] == "config.pbtxt" and _placed(text := s.read_text(), model, placement) != text
        ):
            try:
                d.write_text(_placed(text, model, placement))
            except Exception as e:
                shutil.rmtree(tmp, ignore_errors=True)
                raise ValueError(f"{s}: cannot place its instance groups on {placement['gpus']} GPUs: {e}") from e
        else:
            try:
                os.link(s, d)  # follows a symlink: the rendered copy holds what it points to
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


@cache
def _rendered(src: str, overrides_json: str, placement_json: str = "null") -> tuple[str, str, str]:
    rendered = render(Path(src), json.loads(overrides_json), placement=json.loads(placement_json))
    man = manifest(rendered)
    return str(rendered), json.dumps(man, sort_keys=True), release_id(man)


def placement_of(settings: Settings, gpus: int) -> dict:
    """The placement for a host with ``gpus`` GPUs whose tunables ``settings`` holds."""
    policy = settings.get("gpu_placement") or "spread"
    per_model = dict(settings.get("gpu_placement_models") or {})
    for name, p in [("*", policy), *per_model.items()]:
        if p not in POLICIES:
            raise ValueError(
                f"gpu_placement{'' if name == '*' else '_models[' + repr(name) + ']'} is {p!r}, "
                f"not one of {', '.join(POLICIES)} (group data)"
            )
    return {"gpus": int(gpus), "policy": policy, "models": per_model}


def host_repository(settings: Settings, gpus: int | None = None) -> tuple[Path, dict, str]:
    """(rendered local repository, manifest, release id) for the host whose tunables ``settings``
    holds: ``model_repository`` with the host's ``model_overrides``, its instance groups placed on
    ``gpus`` GPUs (None: as written), rendered and hashed once per run."""
    src = Path(settings.get("model_repository")).resolve()
    overrides = settings.get("model_overrides") or {}
    placement = placement_of(settings, gpus or 1)
    if placement["gpus"] <= 1:
        placement = None  # one GPU: nothing to place (the configs as written)
    path, man, rid = _rendered(str(src), json.dumps(overrides, sort_keys=True), json.dumps(placement, sort_keys=True))
    return Path(path), json.loads(man), rid


def current_host_repository(settings: Settings) -> tuple[Path, dict, str]:
    """``host_repository`` of the host being deployed (its settings: ``settings``), its instance
    groups placed on its GPUs (tritonfleet.gpu.facts.placement_gpus)."""

    return host_repository(settings, placement_gpus(settings))
