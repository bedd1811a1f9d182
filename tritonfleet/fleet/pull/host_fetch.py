"""Pull mode, the host side: what a self-converging host takes from the origin and what it
accepts of it (tritonfleet.fleet.pull.host_run runs it), and the state it keeps.

The release this host should run is its signed pointer on the origin, or the release its
bootstrap pinned; a look at the pointer alone is one conditional GET. A pointer that does not
verify, names another host or no release id, or is older than the generation floor (the
bootstrap's ``min_generation`` and the highest generation this host accepted, kept in its own
file) is refused; an unreadable state or generation file refuses everything until the operator
removes it. An expired pointer (a frozen origin) is a stale origin. The host's data comes in its
own signed pointer (or its json when pinned), never another host's. A release is fetched and
checked by its sha256, its image archives by theirs; every download is capped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ...core.errors import TritonfleetError
from ...settings.defaults import DEFAULTS
from .origin import (
    MANIFEST,
    MAX_SMALL,
    SIGNERS_DOC,
    SIGNERS_NAMESPACE,
    is_release_id,
    parse_iso,
    printable,
    write_atomic,
)
from .signing import signers_text, verify

#: where the host keeps its state (tests and the environment point it elsewhere; host_run reads
#: it here at each use)
STATE_DIR = Path(os.environ.get("TRITONFLEET_PULL_STATE", "/var/lib/tritonfleet/pull"))
FETCH_TIMEOUT = 60


class RunError(TritonfleetError):
    """This run cannot go on; the message is what the report says."""


class Refused(RunError):
    """The origin offered something this host must not run (signature, host, generation)."""


class NotFound(RunError):
    """The origin has no such file (HTTP 404)."""


class Stale(RunError):
    """The origin serves an expired pointer: this host keeps running what it ran."""


def state_dir() -> Path:
    """The state directory, root's alone (it holds this host's data and logs)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(STATE_DIR, 0o700)
    return STATE_DIR


def _state_path() -> Path:
    return STATE_DIR / "state.json"


def load_state() -> dict:
    """The last run's state; {} before the first. A state that cannot be read fails closed
    (RunError): its pointer cache and generation are not to be guessed."""
    try:
        state = json.loads(_state_path().read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise RunError(
            f"state {_state_path()} unreadable ({e}): nothing followed until it is removed (the generation floor stays)"
        ) from None
    if not isinstance(state, dict):
        raise RunError(f"state {_state_path()} is not a state object: nothing followed until it is removed")
    return state


def save_state(state: dict) -> None:
    state_dir()
    write_atomic(_state_path(), json.dumps(state, indent=1, sort_keys=True).encode(), 0o600)


def _generation_path() -> Path:
    return STATE_DIR / "generation"


def generation_floor(cfg: dict) -> int:
    """The oldest pointer generation this host may accept: the bootstrap's pin (min_generation)
    or the highest it accepted (its own file, apart from state.json), whichever is higher. An
    unreadable generation file fails closed (RunError)."""
    pinned = cfg.get("min_generation") or 0
    try:
        kept = int(_generation_path().read_text().strip() or 0)
    except FileNotFoundError:
        kept = 0
    except (OSError, ValueError) as e:
        raise Refused(
            f"generation file {_generation_path()} unreadable ({e}): nothing followed until it is "
            f"removed (then the bootstrap's floor {pinned} holds)"
        ) from None
    return max(int(pinned), kept)


def keep_generation(generation: int) -> None:
    state_dir()
    write_atomic(_generation_path(), f"{generation}\n".encode(), 0o600)


def origin_url(cfg: dict, rel: str) -> str:
    return f"{cfg['origin'].rstrip('/')}/{rel}"


def fetch(url: str, headers: dict | None = None, limit: int = MAX_SMALL) -> tuple[int, bytes, dict]:
    """(HTTP status, body, headers); 304 with an empty body when unchanged. RunError when the
    origin cannot be reached or answers an error; Refused for a body over ``limit`` bytes."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=FETCH_TIMEOUT) as r:
            body = r.read(limit + 1)
            if len(body) > limit:
                raise Refused(f"{url}: more than {limit} bytes: not a pointer; nothing run")
            return r.status, body, dict(r.headers)
    except urllib.error.HTTPError as e:
        if e.code == 304:
            return 304, b"", dict(e.headers)
        raise (NotFound if e.code == 404 else RunError)(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise RunError(f"{url}: {getattr(e, 'reason', e)}") from None


def fetch_to(url: str, dest: Path, sha256: str, limit: int) -> None:
    """``url`` into ``dest``, kept only when its sha256 is ``sha256``; refused (and deleted) as
    soon as it passes ``limit`` bytes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    req = urllib.request.Request(url)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    got = 0
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(req, timeout=FETCH_TIMEOUT) as r:
            while chunk := r.read(1 << 20):
                got += len(chunk)
                if got > limit:
                    raise Refused(f"{url}: more than the {limit} bytes it may be; deleted, nothing run")
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha256:
            raise Refused(
                f"{url}: sha256 {h.hexdigest()[:16]}..., not {sha256[:16]}...: not the release (or "
                "archive) that was signed or pinned; nothing run"
            )
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError) as e:
        raise RunError(f"{url}: {getattr(e, 'reason', e)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def desired(cfg: dict, state: dict, now: float | None = None) -> dict:
    """{"release", "generation", "host_data", "release_size"} this host should run now. Refused
    when the pointer is not for this host, not signed by a release signer, names no release id or
    is below the generation floor; Stale when it expired."""
    if cfg.get("release"):  # pinned by the bootstrap: pointers are not followed
        if not is_release_id(cfg["release"]):
            raise Refused(f"pinned release {printable(cfg['release'])[:40]!r} is not a release id")
        return {"release": cfg["release"], "generation": 0, "host_data": cfg.get("host_data")}
    now = time.time() if now is None else now
    floor = generation_floor(cfg)
    name = f"desired/{cfg['host']}.json"
    headers = {}
    cache = state.get("pointer") or {}
    if cache.get("etag"):
        headers["If-None-Match"] = cache["etag"]
    if cache.get("last_modified"):
        headers["If-Modified-Since"] = cache["last_modified"]
    status, body, hdrs = fetch(origin_url(cfg, name), headers)
    if status == 304 and isinstance(cache.get("payload"), dict):
        want = cache["payload"]
    else:
        try:
            outer = json.loads(body)
            payload_raw = outer["payload"].encode()
            payload = json.loads(payload_raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise Refused(f"{name} is not a release pointer") from None
        why = verify(Path(cfg["signers"]), payload_raw, str(outer.get("signature", "")))
        if why:
            raise Refused(f"{name}: signature does not verify against {cfg['signers']}: {why}")
        if not isinstance(payload, dict) or payload.get("host") != cfg["host"]:
            got = payload.get("host") if isinstance(payload, dict) else None
            raise Refused(f"{name} names host {printable(got)[:40]!r}, not this one")
        generation = payload.get("generation")
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise Refused(f"{name}: generation {printable(generation)[:40]!r} is not a whole number")
        want = {
            "release": payload.get("release"),
            "generation": generation,
            "host_data": payload.get("host_data"),
            "release_size": payload.get("release_size"),
            "expires": payload.get("expires"),
        }
    if not is_release_id(want.get("release")):
        raise Refused(
            f"{name}: release {printable(want.get('release'))[:40]!r} is not a release id "
            "(64 lowercase hex digits); nothing run"
        )
    if want["generation"] < max(floor, int(state.get("generation") or 0)):
        raise Refused(
            f"{name} is generation {want['generation']}, older than the "
            f"{max(floor, int(state.get('generation') or 0))} this host accepted or was pinned to: an old "
            "pointer served again; not followed"
        )
    expires = parse_iso(want.get("expires"))
    if expires is None or expires <= now:
        raise Stale(
            f"stale origin: {name} expired at {printable(want.get('expires'))[:40]} (re-sign the "
            "live pointers: tritonfleet pull refresh)"
        )
    if want["generation"] > floor:
        keep_generation(want["generation"])
    state["pointer"] = {"etag": hdrs.get("ETag", ""), "last_modified": hdrs.get("Last-Modified", ""), "payload": want}
    return want


def update_signers(cfg: dict, state: dict) -> str:
    """Install the origin's signers document (signers.json: the release signers' keys, key
    rotation) when it is newer than the one installed and verifies against the signers this host
    trusts now; "" when nothing changed, else what did. None on the origin: nothing to do.
    Refused for a document that does not verify, is malformed, or is older than the installed one."""
    if cfg.get("release") or not cfg.get("signers"):
        return ""
    cache = state.get("signers_doc") or {}
    headers = {
        k: v for k, v in (("If-None-Match", cache.get("etag")), ("If-Modified-Since", cache.get("last_modified"))) if v
    }
    try:
        status, body, hdrs = fetch(origin_url(cfg, SIGNERS_DOC), headers)
    except NotFound:
        return ""
    if status == 304:
        return ""
    path = Path(cfg["signers"])
    try:
        outer = json.loads(body)
        raw = outer["payload"].encode()
        doc = json.loads(raw)
        keys, generation = doc["keys"], doc["generation"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise Refused(f"{SIGNERS_DOC} is not a signers document") from None
    why = verify(path, raw, str(outer.get("signature", "")), namespace=SIGNERS_NAMESPACE)
    if why:
        raise Refused(f"{SIGNERS_DOC}: signature does not verify against {path}: {why}")
    if (
        type(generation) is not int
        or not isinstance(keys, list)
        or not keys
        or not all(
            isinstance(k, str) and re.fullmatch(r"[a-z0-9@.-]+ [A-Za-z0-9+/=]+( [^\n\r\x00]*)?", k) for k in keys
        )
    ):
        raise Refused(f"{SIGNERS_DOC}: malformed (keys: a list of public keys; generation: a whole number)")
    installed = _signers_generation(path)
    if generation < installed:
        raise Refused(
            f"{SIGNERS_DOC} is generation {generation}, older than the {installed} installed: an old "
            "signers document served again; not installed"
        )
    state["signers_doc"] = {"etag": hdrs.get("ETag", ""), "last_modified": hdrs.get("Last-Modified", "")}
    if generation == installed:
        return ""
    write_atomic(path, signers_text(keys, generation).encode())
    return f"release signers generation {generation} installed ({len(keys)} key(s))"


def _signers_generation(path: Path) -> int:
    try:
        first = path.read_text().split("\n", 1)[0]
    except OSError:
        return 0
    m = re.fullmatch(r"# tritonfleet release signers, generation (\d+)", first)
    return int(m.group(1)) if m else 0


def _limit(cfg: dict, declared: object = None) -> int:
    """Bytes a download may have: what the signed pointer declared, else the configured ceiling."""
    if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 0:
        return declared
    return int(cfg.get("download_limit") or DEFAULTS["pull_download_limit"])


def unpack(cfg: dict, sha: str, size: object = None) -> Path:
    """The release's files on this host (fetched and checked once, kept for a few releases).
    ``sha`` must be a release id: it is a path here."""
    if not is_release_id(sha):
        raise Refused(f"release {printable(sha)[:40]!r} is not a release id (64 lowercase hex digits); nothing run")
    state_dir()
    root = STATE_DIR / "releases" / sha
    if (root / MANIFEST).is_file():
        return root
    archive = STATE_DIR / "releases" / f"{sha}.tar.gz"
    if not archive.is_file():
        fetch_to(origin_url(cfg, f"releases/{sha}.tar.gz"), archive, sha, _limit(cfg, size))
    tmp = root.with_name(f".{sha}.incoming")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    extract(archive, tmp)
    os.replace(tmp, root)
    archive.unlink()
    return root


def extract(archive: Path, dest: Path) -> None:
    """A release archive's regular files under ``dest``; anything else in it (links, devices, a
    path leaving ``dest``) refuses the release (its sha256 matched: the publisher made it so)."""
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar:
            parts = Path(m.name).parts
            if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                raise Refused(f"{archive.name}: {m.name!r} is not a plain file of the release; nothing run")
            target = dest.joinpath(*parts)
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)


def localise(cfg: dict, data: dict) -> dict:
    """The host's data with its image archives fetched (checked by sha256) to this host's disk."""
    data = dict(data)
    archives = {}
    for image, ref in (data.get("image_archives") or {}).items():
        if (
            not is_release_id(ref.get("blob"))
            or not isinstance(ref.get("name"), str)
            or "/" in ref["name"]
            or ref["name"] in ("", ".", "..")
        ):
            raise Refused(f"image archive of {printable(image)[:60]}: not a blob reference; nothing run")
        path = STATE_DIR / "blobs" / f"{ref['blob'][:16]}-{ref['name']}"
        if not path.is_file():
            fetch_to(origin_url(cfg, f"blobs/{ref['blob']}"), path, ref["blob"], _limit(cfg, ref.get("size")))
        archives[image] = str(path)
    if archives:
        data["image_archives"] = archives
    bind = data.get("triton_http_bind") or ""
    # the health gate reaches Triton on this host: its bind address, or loopback
    data["ssh_hostname"] = bind if bind and bind not in ("0.0.0.0", "::") else "127.0.0.1"
    return data
