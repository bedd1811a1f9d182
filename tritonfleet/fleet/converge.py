"""Pull mode, the host side: one converge run of a host on itself (``tritonfleet converge``,
started by its systemd timer: tritonfleet.fleet.bootstrap).

A run: find the release this host should run (its signed pointer on the origin, or the release
its bootstrap pinned), fetch it and check its sha256, fetch the image archives it names, and run
the deploy with pyinfra on this host itself (a local connector that keeps the host's inventory
name) with the host's own inventory data from the release. Then the state (release, generation,
result, times) goes where it is read: /var/lib/tritonfleet/pull/state.json, a node exporter
textfile for Prometheus, and the origin's reports/<host>.json for `tritonfleet status --pull` and
a pull-mode rollout.

A run is due when the pointer names another release or generation than the last run did, when
the last run is older than ``converge_interval`` (drift comes back), or with ``--force``; a look
at the pointer alone is one conditional GET. A pointer that does not verify, names another host
or no release id, or is older than the generation floor (the bootstrap's ``min_generation`` and
the highest generation this host accepted, kept in its own file) is refused (reported, nothing
run); an unreadable state or generation file refuses everything until the operator removes it.
An expired pointer (a frozen origin) is reported as a stale origin. When the origin cannot be
reached or is stale the host converges to the release it last ran, on its interval. The host's
data comes in its own signed pointer (or its pull.json when pinned), never another host's.
Reports are signed with the host's report key. Every download is capped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..core.errors import TritonfleetError, UsageError
from ..pyinfra_ext.compat import PyinfraChanged
from ..settings.defaults import DEFAULTS
from . import pull

CONFIG = Path(os.environ.get("TRITONFLEET_PULL_CONFIG", "/etc/tritonfleet/pull.json"))
STATE_DIR = Path(os.environ.get("TRITONFLEET_PULL_STATE", "/var/lib/tritonfleet/pull"))
HOST_DATA_ENV = "TRITONFLEET_PULL_HOST_DATA"  # the run's host data file, read by local_inventory.py
KEEP_RELEASES = 3
KEEP_LOGS = 10
FETCH_TIMEOUT = 60
REPORT_KEY = "/etc/tritonfleet/pull/report-key"  # the host's own report key (tritonfleet bootstrap)


class RunError(TritonfleetError):
    """This run cannot go on; the message is what the report says."""


class Refused(RunError):
    """The origin offered something this host must not run (signature, host, generation)."""


class NotFound(RunError):
    """The origin has no such file (HTTP 404)."""


class Stale(RunError):
    """The origin serves an expired pointer: this host keeps running what it ran."""


def _state_dir() -> Path:
    """The state directory, root's alone (it holds this host's data and logs)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(STATE_DIR, 0o700)
    return STATE_DIR


def load_config(path: Path = CONFIG) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}: this host was not bootstrapped for pull mode "
                         "(tritonfleet bootstrap writes it)") from None
    except ValueError as e:
        raise UsageError(f"{path}: not JSON ({e}): write it again with tritonfleet bootstrap") from None
    missing = [k for k in ("host", "origin") if not cfg.get(k)]
    if missing or (not cfg.get("release") and not cfg.get("signers")):
        raise UsageError(f"{path}: needs host, origin and a signers file or a pinned release "
                         f"(missing: {', '.join(missing) or 'signers/release'})")
    return cfg


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
        raise RunError(f"state {_state_path()} unreadable ({e}): nothing followed until it is removed "
                       "(the generation floor stays)") from None
    if not isinstance(state, dict):
        raise RunError(f"state {_state_path()} is not a state object: nothing followed until it is removed")
    return state


def save_state(state: dict) -> None:
    _state_dir()
    pull.write_atomic(_state_path(), json.dumps(state, indent=1, sort_keys=True).encode(), 0o600)


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
        raise Refused(f"generation file {_generation_path()} unreadable ({e}): nothing followed until it is "
                       f"removed (then the bootstrap's floor {pinned} holds)") from None
    return max(int(pinned), kept)


def keep_generation(generation: int) -> None:
    _state_dir()
    pull.write_atomic(_generation_path(), f"{generation}\n".encode(), 0o600)


def _url(cfg: dict, rel: str) -> str:
    return f"{cfg['origin'].rstrip('/')}/{rel}"


def fetch(url: str, headers: dict | None = None, limit: int = pull.MAX_SMALL) -> tuple[int, bytes, dict]:
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
            raise Refused(f"{url}: sha256 {h.hexdigest()[:16]}..., not {sha256[:16]}...: not the release (or "
                          "archive) that was signed or pinned; nothing run")
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
        if not pull.is_release_id(cfg["release"]):
            raise Refused(f"pinned release {pull.printable(cfg['release'])[:40]!r} is not a release id")
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
    status, body, hdrs = fetch(_url(cfg, name), headers)
    if status == 304 and isinstance(cache.get("payload"), dict):
        want = cache["payload"]
    else:
        try:
            outer = json.loads(body)
            payload_raw = outer["payload"].encode()
            payload = json.loads(payload_raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise Refused(f"{name} is not a release pointer") from None
        why = pull.verify(Path(cfg["signers"]), payload_raw, str(outer.get("signature", "")))
        if why:
            raise Refused(f"{name}: signature does not verify against {cfg['signers']}: {why}")
        if not isinstance(payload, dict) or payload.get("host") != cfg["host"]:
            got = payload.get("host") if isinstance(payload, dict) else None
            raise Refused(f"{name} names host {pull.printable(got)[:40]!r}, not this one")
        generation = payload.get("generation")
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise Refused(f"{name}: generation {pull.printable(generation)[:40]!r} is not a whole number")
        want = {"release": payload.get("release"), "generation": generation, "host_data": payload.get("host_data"),
                "release_size": payload.get("release_size"), "expires": payload.get("expires")}
    if not pull.is_release_id(want.get("release")):
        raise Refused(f"{name}: release {pull.printable(want.get('release'))[:40]!r} is not a release id "
                      "(64 lowercase hex digits); nothing run")
    if want["generation"] < max(floor, int(state.get("generation") or 0)):
        raise Refused(f"{name} is generation {want['generation']}, older than the "
                      f"{max(floor, int(state.get('generation') or 0))} this host accepted or was pinned to: an old "
                      "pointer served again; not followed")
    expires = pull.parse_iso(want.get("expires"))
    if expires is None or expires <= now:
        raise Stale(f"stale origin: {name} expired at {pull.printable(want.get('expires'))[:40]} (re-sign the "
                    "live pointers: tritonfleet pull refresh)")
    if want["generation"] > floor:
        keep_generation(want["generation"])
    state["pointer"] = {"etag": hdrs.get("ETag", ""), "last_modified": hdrs.get("Last-Modified", ""), "payload": want}
    return want


def due(cfg: dict, state: dict, want: dict, now: float, force: bool) -> str:
    """Why a run is due now ("" when it is not)."""
    if force:
        return "forced"
    if want["release"] != state.get("release"):
        return f"release {pull.short(want['release'])} (ran {pull.short(state.get('release'))})"
    if want["generation"] != state.get("generation"):
        return f"pointer generation {want['generation']}"
    if now - float(state.get("finished_ts") or 0) >= float(cfg.get("converge_interval") or 1800):
        return "converge interval"
    return ""


def update_signers(cfg: dict, state: dict) -> str:
    """Install the origin's signers document (signers.json: the release signers' keys, key
    rotation) when it is newer than the one installed and verifies against the signers this host
    trusts now; "" when nothing changed, else what did. None on the origin: nothing to do.
    Refused for a document that does not verify, is malformed, or is older than the installed one."""
    if cfg.get("release") or not cfg.get("signers"):
        return ""
    cache = state.get("signers_doc") or {}
    headers = {k: v for k, v in (("If-None-Match", cache.get("etag")), ("If-Modified-Since", cache.get("last_modified")))
               if v}
    try:
        status, body, hdrs = fetch(_url(cfg, pull.SIGNERS_DOC), headers)
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
        raise Refused(f"{pull.SIGNERS_DOC} is not a signers document") from None
    why = pull.verify(path, raw, str(outer.get("signature", "")), namespace=pull.SIGNERS_NAMESPACE)
    if why:
        raise Refused(f"{pull.SIGNERS_DOC}: signature does not verify against {path}: {why}")
    if type(generation) is not int or not isinstance(keys, list) or not keys or not all(
            isinstance(k, str) and re.fullmatch(r"[a-z0-9@.-]+ [A-Za-z0-9+/=]+( [^\n\r\x00]*)?", k) for k in keys):
        raise Refused(f"{pull.SIGNERS_DOC}: malformed (keys: a list of public keys; generation: a whole number)")
    installed = _signers_generation(path)
    if generation < installed:
        raise Refused(f"{pull.SIGNERS_DOC} is generation {generation}, older than the {installed} installed: an old "
                      "signers document served again; not installed")
    state["signers_doc"] = {"etag": hdrs.get("ETag", ""), "last_modified": hdrs.get("Last-Modified", "")}
    if generation == installed:
        return ""
    pull.write_atomic(path, pull.signers_text(keys, generation).encode())
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
    if not pull.is_release_id(sha):
        raise Refused(f"release {pull.printable(sha)[:40]!r} is not a release id (64 lowercase hex digits); nothing run")
    _state_dir()
    root = STATE_DIR / "releases" / sha
    if (root / pull.MANIFEST).is_file():
        return root
    archive = STATE_DIR / "releases" / f"{sha}.tar.gz"
    if not archive.is_file():
        fetch_to(_url(cfg, f"releases/{sha}.tar.gz"), archive, sha, _limit(cfg, size))
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
        if not pull.is_release_id(ref.get("blob")) or not isinstance(ref.get("name"), str) or \
                "/" in ref["name"] or ref["name"] in ("", ".", ".."):
            raise Refused(f"image archive of {pull.printable(image)[:60]}: not a blob reference; nothing run")
        path = STATE_DIR / "blobs" / f"{ref['blob'][:16]}-{ref['name']}"
        if not path.is_file():
            fetch_to(_url(cfg, f"blobs/{ref['blob']}"), path, ref["blob"], _limit(cfg, ref.get("size")))
        archives[image] = str(path)
    if archives:
        data["image_archives"] = archives
    bind = data.get("triton_http_bind") or ""
    # the health gate reaches Triton on this host: its bind address, or loopback
    data["ssh_hostname"] = bind if bind and bind not in ("0.0.0.0", "::") else "127.0.0.1"
    return data


def run_deploy(cfg: dict, root: Path, manifest: dict, data: dict, groups: list[str], log: Path) -> dict:
    """The deploy on this host; {"ok", "changed", "failure", "error"}. Refused (PyinfraChanged)
    before it starts when the pyinfra internals it relies on (its connector, its JSON results) are
    not the checked ones (tritonfleet.pyinfra_ext.compat)."""
    from ..core.checks import is_check
    from ..core.report import CHANNEL_ENV, read_channel
    from ..pyinfra_ext import compat

    compat.ensure("self_connector", "rollout_json")

    work = STATE_DIR / "run"
    shutil.rmtree(work, ignore_errors=True)
    (work / "failures").mkdir(parents=True)
    host_file = work / "host.json"
    pull.write_atomic(host_file, json.dumps({"name": cfg["host"], "groups": groups, "data": data}).encode(), 0o600)
    pyinfra = Path(sys.executable).parent / "pyinfra"
    cmd = [str(pyinfra) if pyinfra.exists() else sys.executable, *([] if pyinfra.exists() else ["-m", "pyinfra"]),
           "-y", "--json", str(Path(__file__).with_name("local_inventory.py")), manifest["deploy"]]
    env = dict(os.environ, **{HOST_DATA_ENV: str(host_file), CHANNEL_ENV: str(work / "failures")},
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}")
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(f"$ {' '.join(cmd)}  (in {root / pull.REPO})\n")
        out.flush()
        res = subprocess.run(cmd, cwd=root / pull.REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=out, text=True)
        out.write(res.stdout)
    try:
        result = json.loads(res.stdout) if res.stdout.strip() else {}
    except ValueError:
        result = {}
    ops = (result.get("results") or {}).get("operations", [])
    changed = sum(1 for op in ops if op.get("success") and not is_check(op["name"]))
    failures = read_channel(work / "failures")
    failure = next(iter(failures.values()), None)
    ok = res.returncode == 0
    error = ""
    if not ok:
        error = failure.short(240) if failure else _last_words(log)
    return {"ok": ok, "changed": changed, "failure": failure.to_json() if failure else None, "error": error}


def _last_words(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip() and not ln.startswith("{")]
    return (lines[-1] if lines else "the deploy failed")[:240] + f" (log: {log})"


@contextlib.contextmanager
def run_lock():
    """One converge run at a time on a host (the timer fires while a long run goes on)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "converge.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def converge(config: Path = CONFIG, force: bool = False, echo=print) -> int:
    """One converge run (or only a look at the pointer when none is due). Exit status 0 when the
    host runs the release it should, 1 when this run failed or refused the offer."""
    cfg = load_config(config)
    with run_lock() as mine:
        if not mine:
            echo("another converge run is in progress on this host")
            return 0
        now = time.time()
        try:
            state = load_state()
        except RunError as e:  # fail closed, and leave the file for the operator to look at
            rep = {"format": pull.FORMAT, "host": cfg["host"], "release": None, "generation": None,
                   "result": "refused", "error": str(e), "started": None, "finished": pull.iso(now)}
            send_report(cfg, rep)
            echo(f"{cfg['host']}: {pull.describe(rep)}")
            return 1
        stale = ""
        try:
            changed = update_signers(cfg, state)
            if changed:
                echo(changed)
            want = desired(cfg, state, now)
        except Stale as e:
            stale = str(e)
            if not state.get("release"):
                return _finish(cfg, state, {"release": None, "generation": 0}, "refused", stale, now, echo)
            echo(f"{stale}: staying on release {pull.short(state['release'])}")
            want = _last(state)
        except Refused as e:
            return _finish(cfg, state, {"release": state.get("release"), "generation": state.get("generation")},
                           "refused", str(e), now, echo)
        except RunError as e:
            if not state.get("release"):
                return _finish(cfg, state, {"release": None, "generation": 0}, "failed", f"origin: {e}", now, echo)
            echo(f"origin unreachable ({e}): staying on release {pull.short(state['release'])}")
            want = _last(state)
        was_stale, state["stale"] = state.get("stale") or "", stale
        why = due(cfg, state, want, now, force)
        state["checked_ts"] = now
        if not why:
            save_state(state)
            write_textfile(cfg, state)
            if stale != was_stale:  # the control side learns of a stale origin (or its end) at once
                send_report(cfg, _report(cfg, state))
            return 0 if state.get("result") == "ok" and not stale else 1
        echo(f"converging to release {pull.short(want['release'])} ({why})")
        return _run(cfg, state, want, now, echo)


def _last(state: dict) -> dict:
    """What this host ran last, to run again while the origin is unreachable or stale."""
    return {"release": state["release"], "generation": state.get("generation") or 0,
            "host_data": state.get("host_data")}


def _run(cfg: dict, state: dict, want: dict, now: float, echo) -> int:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    send_report(cfg, {**_report(cfg, state), "release": want["release"], "generation": want["generation"],
                      "result": "running", "started": started, "finished": None, "error": ""})
    logs = _state_dir() / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    log = logs / f"{started.replace(':', '')}.log"
    try:
        entry = want.get("host_data")
        if not isinstance(entry, dict) or not isinstance(entry.get("data"), dict):
            raise RunError(f"the pointer for release {pull.short(want['release'])} carries no data for host "
                           f"{cfg['host']} (publish it again with this tritonfleet: the host's data travels in its "
                           "own signed pointer)")
        root = unpack(cfg, want["release"], want.get("release_size"))
        manifest = json.loads((root / pull.MANIFEST).read_text())
        state["host_data"] = entry
        outcome = run_deploy(cfg, root, manifest, localise(cfg, entry["data"]), list(entry.get("groups") or []), log)
    except Refused as e:
        return _finish(cfg, state, want, "refused", str(e), now, echo)
    except PyinfraChanged as e:  # this host's pyinfra is not one the package was checked against
        return _finish(cfg, state, want, "failed", str(e), now, echo)
    except (RunError, OSError, tarfile.TarError, ValueError) as e:
        return _finish(cfg, state, want, "failed", str(e), now, echo)
    state["changed"], state["failure"], state["log"] = outcome["changed"], outcome["failure"], str(log)
    rc = _finish(cfg, state, want, "ok" if outcome["ok"] else "failed", outcome["error"], now, echo)
    _prune(logs, KEEP_LOGS, lambda p: p.suffix == ".log")
    _prune(STATE_DIR / "releases", KEEP_RELEASES, lambda p: p.is_dir() and not p.name.startswith("."),
           keep_name=want["release"])
    return rc


def _finish(cfg: dict, state: dict, want: dict, result: str, error: str, started: float, echo) -> int:
    finished = time.time()
    if result != "refused":  # a refused offer changes nothing: the host stays on what it ran
        state.update(release=want["release"], generation=want["generation"])
    state.update(result=result, error=error, started_ts=started, finished_ts=finished,
                 seconds=round(finished - started, 1))
    if result != "ok":
        state.setdefault("changed", 0)
    save_state(state)
    write_textfile(cfg, state)
    rep = {**_report(cfg, state), "result": result, "error": error}
    if result == "refused":
        rep.update(release=want.get("release"), generation=want.get("generation"))
    send_report(cfg, rep)
    echo(f"{cfg['host']}: {pull.describe(rep)}")
    return 0 if result == "ok" else 1


def _iso(ts) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(ts))) if ts else None


def _report(cfg: dict, state: dict) -> dict:
    return {"format": pull.FORMAT, "host": cfg["host"], "release": state.get("release"),
            "generation": state.get("generation"), "result": state.get("result"), "error": state.get("error", ""),
            "stale": state.get("stale") or "",
            "started": _iso(state.get("started_ts")), "finished": _iso(state.get("finished_ts")),
            "seconds": state.get("seconds"), "changed": state.get("changed"), "failure": state.get("failure")}


def signed_report(cfg: dict, report: dict) -> bytes:
    """The report as the control side reads it: {"payload": its JSON, "signature": made with this
    host's report key (namespace tritonfleet-report)}; an empty signature when the key is missing
    or cannot sign (the control side shows that host's report as not signed)."""
    payload = json.dumps(report, sort_keys=True)
    key = Path(cfg.get("report_key") or REPORT_KEY)
    signature = ""
    if key.is_file():
        try:
            signature = pull.sign(key, {"r": payload.encode()}, namespace=pull.REPORT_NAMESPACE)["r"]
        except (pull.PullError, OSError) as e:
            print(f"report not signed with {key}: {e}", file=sys.stderr)
    else:
        print(f"report not signed: no report key {key} (tritonfleet bootstrap writes it)", file=sys.stderr)
    return json.dumps({"payload": payload, "signature": signature}).encode()


def send_report(cfg: dict, report: dict) -> None:
    """PUT the signed report where the control side reads it (best effort: a host whose report
    cannot be sent still converges; the rollout waiting for it counts it as not reported)."""
    base = cfg.get("reports", _url(cfg, "reports"))
    if not base:
        return
    req = urllib.request.Request(f"{base.rstrip('/')}/{cfg['host']}.json", data=signed_report(cfg, report),
                                 method="PUT", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=FETCH_TIMEOUT):
            pass
    except (urllib.error.URLError, OSError) as e:
        print(f"report not sent to {base}: {getattr(e, 'reason', e)}", file=sys.stderr)


METRICS = (
    ("tritonfleet_pull_last_run_timestamp_seconds", "When this host's last converge run finished (Unix time)."),
    ("tritonfleet_pull_last_run_success", "1 when this host's last converge run succeeded, 0 when it failed or "
                                          "refused what the origin offered."),
    ("tritonfleet_pull_last_run_duration_seconds", "How long this host's last converge run took."),
    ("tritonfleet_pull_last_check_timestamp_seconds", "When this host last looked at its desired release."),
    ("tritonfleet_pull_release_info", "The release this host converged to last (label release: sha256 prefix)."),
)


def textfile(state: dict) -> str:
    """The node exporter textfile (Prometheus text format 0.0.4)."""
    values = {"tritonfleet_pull_last_run_timestamp_seconds": state.get("finished_ts") or 0,
              "tritonfleet_pull_last_run_success": 1 if state.get("result") == "ok" else 0,
              "tritonfleet_pull_last_run_duration_seconds": state.get("seconds") or 0,
              "tritonfleet_pull_last_check_timestamp_seconds": state.get("checked_ts") or state.get("finished_ts") or 0}
    out = []
    for name, help_ in METRICS:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        if name == "tritonfleet_pull_release_info":
            rel, res = pull.short(state.get("release")), state.get("result") or "none"
            out.append(f'{name}{{release="{rel}",result="{res}",generation="{state.get("generation") or 0}"}} 1')
        else:
            out.append(f"{name} {float(values[name]):.3f}")
    return "\n".join(out) + "\n"


def write_textfile(cfg: dict, state: dict) -> None:
    path = cfg.get("textfile")
    if not path:
        return
    try:
        pull.write_atomic(Path(path), textfile(state).encode())
    except OSError as e:
        print(f"node exporter textfile {path} not written: {e}", file=sys.stderr)


def _prune(d: Path, keep: int, which, keep_name: str | None = None) -> None:
    if not d.is_dir():
        return
    items = sorted((p for p in d.iterdir() if which(p) and p.name != keep_name), key=lambda p: p.stat().st_mtime)
    for p in items[: max(0, len(items) - keep)]:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
