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
or an older generation is refused (reported, nothing run). When the origin cannot be reached the
host converges to the release it last ran, on its interval.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
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
from . import pull

CONFIG = Path(os.environ.get("TRITONFLEET_PULL_CONFIG", "/etc/tritonfleet/pull.json"))
STATE_DIR = Path(os.environ.get("TRITONFLEET_PULL_STATE", "/var/lib/tritonfleet/pull"))
HOST_DATA_ENV = "TRITONFLEET_PULL_HOST_DATA"  # the run's host data file, read by local_inventory.py
KEEP_RELEASES = 3
KEEP_LOGS = 10
FETCH_TIMEOUT = 60


class RunError(TritonfleetError):
    """This run cannot go on; the message is what the report says."""


class Refused(RunError):
    """The origin offered something this host must not run (signature, host, generation)."""


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
    try:
        return json.loads(_state_path().read_text())
    except (OSError, ValueError):
        return {}


def save_state(state: dict) -> None:
    pull.write_atomic(_state_path(), json.dumps(state, indent=1, sort_keys=True).encode())


def _url(cfg: dict, rel: str) -> str:
    return f"{cfg['origin'].rstrip('/')}/{rel}"


def fetch(url: str, headers: dict | None = None) -> tuple[int, bytes, dict]:
    """(HTTP status, body, headers); 304 with an empty body when unchanged. RunError when the
    origin cannot be reached or answers an error."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=FETCH_TIMEOUT) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        if e.code == 304:
            return 304, b"", dict(e.headers)
        raise RunError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise RunError(f"{url}: {getattr(e, 'reason', e)}") from None


def fetch_to(url: str, dest: Path, sha256: str) -> None:
    """``url`` into ``dest``, kept only when its sha256 is ``sha256``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    req = urllib.request.Request(url)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(req, timeout=FETCH_TIMEOUT) as r:
            while chunk := r.read(1 << 20):
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


def desired(cfg: dict, state: dict) -> dict:
    """{"release", "generation"} this host should run now."""
    if cfg.get("release"):  # pinned by the bootstrap: pointers are not followed
        return {"release": cfg["release"], "generation": 0}
    headers = {}
    cache = state.get("pointer") or {}
    if cache.get("etag"):
        headers["If-None-Match"] = cache["etag"]
    if cache.get("last_modified"):
        headers["If-Modified-Since"] = cache["last_modified"]
    status, body, hdrs = fetch(_url(cfg, f"desired/{cfg['host']}.json"), headers)
    if status == 304 and cache.get("payload"):
        return cache["payload"]
    try:
        outer = json.loads(body)
        payload_raw = outer["payload"].encode()
        payload = json.loads(payload_raw)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise Refused(f"desired/{cfg['host']}.json is not a release pointer") from None
    why = pull.verify(Path(cfg["signers"]), payload_raw, str(outer.get("signature", "")))
    if why:
        raise Refused(f"desired/{cfg['host']}.json: signature does not verify against {cfg['signers']}: {why}")
    if payload.get("host") != cfg["host"]:
        raise Refused(f"desired/{cfg['host']}.json names host {payload.get('host')!r}, not this one")
    if int(payload.get("generation") or 0) < int(state.get("generation") or 0):
        raise Refused(f"desired/{cfg['host']}.json is generation {payload.get('generation')}, older than the "
                      f"{state.get('generation')} this host ran: an old pointer served again; not followed")
    want = {"release": str(payload["release"]), "generation": int(payload["generation"])}
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


def unpack(cfg: dict, sha: str) -> Path:
    """The release's files on this host (fetched and checked once, kept for a few releases)."""
    root = STATE_DIR / "releases" / sha
    if (root / pull.MANIFEST).is_file():
        return root
    archive = STATE_DIR / "releases" / f"{sha}.tar.gz"
    if not archive.is_file():
        fetch_to(_url(cfg, f"releases/{sha}.tar.gz"), archive, sha)
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
        path = STATE_DIR / "blobs" / f"{ref['blob'][:16]}-{ref['name']}"
        if not path.is_file():
            fetch_to(_url(cfg, f"blobs/{ref['blob']}"), path, ref["blob"])
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
    host_file.write_text(json.dumps({"name": cfg["host"], "groups": groups, "data": data}))
    pyinfra = Path(sys.executable).parent / "pyinfra"
    cmd = [str(pyinfra) if pyinfra.exists() else sys.executable, *([] if pyinfra.exists() else ["-m", "pyinfra"]),
           "-y", "--json", str(Path(__file__).with_name("local_inventory.py")), manifest["deploy"]]
    env = dict(os.environ, **{HOST_DATA_ENV: str(host_file), CHANNEL_ENV: str(work / "failures")},
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}")
    with open(log, "w") as out:
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
        state = load_state()
        now = time.time()
        try:
            want = desired(cfg, state)
        except Refused as e:
            return _finish(cfg, state, {"release": state.get("release"), "generation": state.get("generation")},
                           "refused", str(e), now, echo)
        except RunError as e:
            if not state.get("release"):
                return _finish(cfg, state, {"release": None, "generation": 0}, "failed", f"origin: {e}", now, echo)
            echo(f"origin unreachable ({e}): staying on release {pull.short(state['release'])}")
            want = {"release": state["release"], "generation": state.get("generation") or 0}
        why = due(cfg, state, want, now, force)
        state["checked_ts"] = now
        if not why:
            save_state(state)
            write_textfile(cfg, state)
            return 0 if state.get("result") == "ok" else 1
        echo(f"converging to release {pull.short(want['release'])} ({why})")
        return _run(cfg, state, want, now, echo)


def _run(cfg: dict, state: dict, want: dict, now: float, echo) -> int:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    send_report(cfg, {**_report(cfg, state), "release": want["release"], "generation": want["generation"],
                      "result": "running", "started": started, "finished": None, "error": ""})
    logs = STATE_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{started.replace(':', '')}.log"
    try:
        root = unpack(cfg, want["release"])
        manifest = json.loads((root / pull.MANIFEST).read_text())
        entry = manifest.get("hosts", {}).get(cfg["host"])
        if entry is None:
            raise RunError(f"release {pull.short(want['release'])} has no data for host {cfg['host']} (not in the "
                           "inventory it was published from)")
        outcome = run_deploy(cfg, root, manifest, localise(cfg, entry["data"]), entry.get("groups") or [], log)
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
            "started": _iso(state.get("started_ts")), "finished": _iso(state.get("finished_ts")),
            "seconds": state.get("seconds"), "changed": state.get("changed"), "failure": state.get("failure")}


def send_report(cfg: dict, report: dict) -> None:
    """PUT the report where the control side reads it (best effort: a host whose report cannot be
    sent still converges; the rollout waiting for it counts it as not reported)."""
    base = cfg.get("reports", _url(cfg, "reports"))
    if not base:
        return
    req = urllib.request.Request(f"{base.rstrip('/')}/{cfg['host']}.json", data=json.dumps(report).encode(),
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
