"""Pull mode's releases: the operator's repository as a deterministic archive named by its sha256,
each host's own inventory entry (its pointer carries it, never the archive), and the image
archives the entries name, put on the origin as blobs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from ...core.errors import UsageError
from ...model_repo.pull_publish import publish_models
from ...settings.defaults import DEFAULTS
from .origin import (
    CONTROL_ONLY_PREFIXES,
    FORMAT,
    INCLUDE,
    MANIFEST,
    REPO,
    PullSite,
    sha256_file,
    write_atomic,
)


def host_entry(fh, repo_root: Path, blobs: dict[str, Path]) -> dict:
    """What a host needs of the inventory to run its deploy itself: its groups and its data that
    differs from the package's defaults, without the control machine's connection settings.
    Image archives become blobs of the origin (``blobs``: sha -> local file, filled here)."""
    data = {}
    for key, value in fh.data.items():
        if key.startswith(CONTROL_ONLY_PREFIXES) or (key in DEFAULTS and DEFAULTS[key] == value):
            continue
        data[key] = value
    archives = data.get("image_archives") or {}
    if archives:
        data["image_archives"] = {
            image: _blob(fh.name, Path(path), repo_root, blobs) for image, path in archives.items()
        }
    repo = fh.get("model_repository") or DEFAULTS["model_repository"]
    if Path(repo).is_absolute():
        try:
            data["model_repository"] = str(Path(repo).resolve().relative_to(repo_root.resolve()))
        except ValueError:
            raise UsageError(
                f"{fh.name}: model_repository {repo} is outside the repository ({repo_root}): a "
                "self-converging host gets the model repository inside its release; keep it in "
                "the repository (files/model_repository)"
            ) from None
    try:
        json.dumps(data)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{fh.name}: inventory data that is not plain JSON cannot go into a release: {e}") from None
    return {"groups": list(fh.groups), "data": data}


_HASHED: dict[tuple[str, int, int], str] = {}


def _blob(host: str, path: Path, repo_root: Path, blobs: dict[str, Path]) -> dict:
    local = path if path.is_absolute() else repo_root / path
    try:
        st = local.stat()
    except OSError as e:
        raise UsageError(f"{host}: image archive {path} (image_archives) cannot be read: {e}") from None
    key = (str(local), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(local)
    blobs[_HASHED[key]] = local
    return {"blob": _HASHED[key], "name": local.name, "size": st.st_size}


def _included(repo_root: Path, include: tuple[str, ...]) -> list[Path]:
    files = []
    for rel in include:
        top = repo_root / rel
        if not top.exists():
            raise UsageError(
                f"{top} not found: a release holds {', '.join(include)} of the repository "
                f"({repo_root}); name what exists with --include"
            )
        items = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        files += [p for p in items if "__pycache__" not in p.parts]
    return files


def host_entries(hosts: list, repo_root: Path) -> tuple[dict[str, dict], dict[str, Path]]:
    """Each host's entry (host_entry) and the blobs they name (sha -> local file)."""
    blobs: dict[str, Path] = {}
    return {fh.name: host_entry(fh, repo_root, blobs) for fh in hosts}, blobs


def build_release(
    hosts: list, deploy: str, repo_root: Path, include: tuple[str, ...] = INCLUDE
) -> tuple[bytes, str, dict[str, Path]]:
    """The release archive of ``repo_root`` for ``hosts`` (deterministic: the same files make the
    same bytes, so publishing twice is one release), its sha256, and the blobs their data names.
    The archive holds no host's data: every host fetching it may read it."""
    deploy_rel = Path(deploy)
    if deploy_rel.is_absolute():
        deploy_rel = deploy_rel.resolve().relative_to(repo_root.resolve())
    if not (repo_root / deploy_rel).is_file():
        raise UsageError(f"deploy {deploy} not found in {repo_root}")
    include = tuple(
        dict.fromkeys((*include, str(deploy_rel.parent) if str(deploy_rel.parent) != "." else str(deploy_rel)))
    )
    entries, blobs = host_entries(hosts, repo_root)
    for fh in hosts:
        repo = Path(entries[fh.name]["data"].get("model_repository") or DEFAULTS["model_repository"])
        if not any(repo == Path(i) or Path(i) in repo.parents for i in include):
            raise UsageError(
                f"{fh.name}: model_repository {repo} is not in the release ({', '.join(include)}): "
                f"add it with --include {repo}"
            )
    # no host's data: each host's entry travels in its own signed pointer (host_entries)
    manifest = {
        "format": FORMAT,
        "deploy": str(deploy_rel),
        "blobs": {sha: {"name": p.name, "size": p.stat().st_size} for sha, p in sorted(blobs.items())},
    }
    raw = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        _add(tar, MANIFEST, json.dumps(manifest, sort_keys=True, indent=1).encode(), 0o644)
        for path in _included(repo_root, include):
            _add(
                tar,
                f"{REPO}/{path.relative_to(repo_root).as_posix()}",
                path.read_bytes(),
                0o755 if os.access(path, os.X_OK) else 0o644,
            )
    data = raw.getvalue()
    return data, hashlib.sha256(data).hexdigest(), blobs


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = (
        len(data),
        mode,
        0,
        0,
        0,
        "root",
        "root",
    )
    tar.addfile(info, io.BytesIO(data))


def publish_release(
    origin: PullSite, hosts: list, deploy: str, repo_root: Path, include: tuple[str, ...] = INCLUDE
) -> str:
    """Build the release and put it (and its blobs) on the origin; its id (sha256)."""
    data, sha, blobs = build_release(hosts, deploy, repo_root, include)
    publish_models(hosts, repo_root)  # a model origin's releases: the hosts only read it
    if not origin.release(sha).is_file():
        write_atomic(origin.release(sha), data)
    for bsha, local in blobs.items():
        dest = origin.blob(bsha)
        if dest.is_file():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{bsha}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(local, tmp)  # same file system: no copy of a multi-GB archive
        except OSError:
            with open(local, "rb") as src, open(tmp, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    return sha
