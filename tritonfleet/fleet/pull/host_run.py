"""Pull mode, the host side: one converge run of a host on itself (``tritonfleet converge``,
started by its systemd timer: tritonfleet.fleet.pull.bootstrap).

A run: find the release this host should run and fetch it (tritonfleet.fleet.pull.host_fetch),
fetch the image archives it names, and run the deploy with pyinfra on this host itself (a local
connector that keeps the host's inventory name) with the host's own inventory data from the
release. Then the state (release, generation, result, times) goes where it is read:
/var/lib/tritonfleet/pull/state.json, a node exporter textfile for Prometheus, and the origin's
reports/<host>.json for `tritonfleet status --pull` and a pull-mode rollout.

A run is due when the pointer names another release or generation than the last run did, when
the last run is older than ``converge_interval`` (drift comes back), or with ``--force``. A
refused pointer is reported and nothing runs. When the origin cannot be reached or is stale the
host converges to the release it last ran, on its interval. Reports are signed with the host's
report key.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ...core.checks import is_check
from ...core.errors import UsageError
from ...core.report import CHANNEL_ENV, read_channel
from ...pyinfra_ext import compat
from ...pyinfra_ext.compat import PyinfraChanged
from . import host_fetch
from .host_fetch import (
    FETCH_TIMEOUT,
    Refused,
    RunError,
    Stale,
    desired,
    load_state,
    localise,
    origin_url,
    save_state,
    state_dir,
    unpack,
    update_signers,
)
from .origin import FORMAT, MANIFEST, REPO, REPORT_NAMESPACE, PullError, iso, write_atomic
from .reports import describe, short
from .signing import sign

CONFIG = Path(os.environ.get("TRITONFLEET_PULL_CONFIG", "/etc/tritonfleet/pull.json"))
HOST_DATA_ENV = "TRITONFLEET_PULL_HOST_DATA"  # the run's host data file, read by local_inventory.py
KEEP_RELEASES = 3
KEEP_LOGS = 10
REPORT_KEY = "/etc/tritonfleet/pull/report-key"  # the host's own report key (tritonfleet bootstrap)


def load_config(path: Path = CONFIG) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(
            f"{path}: {e.strerror}: this host was not bootstrapped for pull mode (tritonfleet bootstrap writes it)"
        ) from None
    except ValueError as e:
        raise UsageError(f"{path}: not JSON ({e}): write it again with tritonfleet bootstrap") from None
    missing = [k for k in ("host", "origin") if not cfg.get(k)]
    if missing or (not cfg.get("release") and not cfg.get("signers")):
        raise UsageError(
            f"{path}: needs host, origin and a signers file or a pinned release "
            f"(missing: {', '.join(missing) or 'signers/release'})"
        )
    return cfg


def due(cfg: dict, state: dict, want: dict, now: float, force: bool) -> str:
    """Why a run is due now ("" when it is not)."""
    if force:
        return "forced"
    if want["release"] != state.get("release"):
        return f"release {short(want['release'])} (ran {short(state.get('release'))})"
    if want["generation"] != state.get("generation"):
        return f"pointer generation {want['generation']}"
    if now - float(state.get("finished_ts") or 0) >= float(cfg.get("converge_interval") or 1800):
        return "converge interval"
    return ""


def run_deploy(cfg: dict, root: Path, manifest: dict, data: dict, groups: list[str], log: Path) -> dict:
    """The deploy on this host; {"ok", "changed", "failure", "error"}. Refused (PyinfraChanged)
    before it starts when the pyinfra internals it relies on (its connector, its JSON results) are
    not the checked ones (tritonfleet.pyinfra_ext.compat)."""
    compat.ensure("self_connector", "rollout_json")

    work = host_fetch.STATE_DIR / "run"
    shutil.rmtree(work, ignore_errors=True)
    (work / "failures").mkdir(parents=True)
    host_file = work / "host.json"
    write_atomic(host_file, json.dumps({"name": cfg["host"], "groups": groups, "data": data}).encode(), 0o600)
    pyinfra = Path(sys.executable).parent / "pyinfra"
    cmd = [
        str(pyinfra) if pyinfra.exists() else sys.executable,
        *([] if pyinfra.exists() else ["-m", "pyinfra"]),
        "-y",
        "--json",
        str(Path(__file__).with_name("local_inventory.py")),
        manifest["deploy"],
    ]
    env = dict(
        os.environ,
        **{HOST_DATA_ENV: str(host_file), CHANNEL_ENV: str(work / "failures")},
        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
    )
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(f"$ {' '.join(cmd)}  (in {root / REPO})\n")
        out.flush()
        res = subprocess.run(
            cmd, cwd=root / REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out, text=True
        )
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
    host_fetch.STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(host_fetch.STATE_DIR / "converge.lock", "w") as f:
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
            rep = {
                "format": FORMAT,
                "host": cfg["host"],
                "release": None,
                "generation": None,
                "result": "refused",
                "error": str(e),
                "started": None,
                "finished": iso(now),
            }
            send_report(cfg, rep)
            echo(f"{cfg['host']}: {describe(rep)}")
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
            echo(f"{stale}: staying on release {short(state['release'])}")
            want = _last(state)
        except Refused as e:
            return _finish(
                cfg,
                state,
                {"release": state.get("release"), "generation": state.get("generation")},
                "refused",
                str(e),
                now,
                echo,
            )
        except RunError as e:
            if not state.get("release"):
                return _finish(cfg, state, {"release": None, "generation": 0}, "failed", f"origin: {e}", now, echo)
            echo(f"origin unreachable ({e}): staying on release {short(state['release'])}")
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
        echo(f"converging to release {short(want['release'])} ({why})")
        return _run(cfg, state, want, now, echo)


def _last(state: dict) -> dict:
    """What this host ran last, to run again while the origin is unreachable or stale."""
    return {
        "release": state["release"],
        "generation": state.get("generation") or 0,
        "host_data": state.get("host_data"),
    }


def _run(cfg: dict, state: dict, want: dict, now: float, echo) -> int:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    send_report(
        cfg,
        {
            **_report(cfg, state),
            "release": want["release"],
            "generation": want["generation"],
            "result": "running",
            "started": started,
            "finished": None,
            "error": "",
        },
    )
    logs = state_dir() / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    log = logs / f"{started.replace(':', '')}.log"
    try:
        entry = want.get("host_data")
        if not isinstance(entry, dict) or not isinstance(entry.get("data"), dict):
            raise RunError(
                f"the pointer for release {short(want['release'])} carries no data for host "
                f"{cfg['host']} (publish it again with this tritonfleet: the host's data travels in its "
                "own signed pointer)"
            )
        root = unpack(cfg, want["release"], want.get("release_size"))
        manifest = json.loads((root / MANIFEST).read_text())
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
    _prune(
        host_fetch.STATE_DIR / "releases",
        KEEP_RELEASES,
        lambda p: p.is_dir() and not p.name.startswith("."),
        keep_name=want["release"],
    )
    return rc


def _finish(cfg: dict, state: dict, want: dict, result: str, error: str, started: float, echo) -> int:
    finished = time.time()
    if result != "refused":  # a refused offer changes nothing: the host stays on what it ran
        state.update(release=want["release"], generation=want["generation"])
    state.update(
        result=result, error=error, started_ts=started, finished_ts=finished, seconds=round(finished - started, 1)
    )
    if result != "ok":
        state.setdefault("changed", 0)
    save_state(state)
    write_textfile(cfg, state)
    rep = {**_report(cfg, state), "result": result, "error": error}
    if result == "refused":
        rep.update(release=want.get("release"), generation=want.get("generation"))
    send_report(cfg, rep)
    echo(f"{cfg['host']}: {describe(rep)}")
    return 0 if result == "ok" else 1


def _iso(ts) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(ts))) if ts else None


def _report(cfg: dict, state: dict) -> dict:
    return {
        "format": FORMAT,
        "host": cfg["host"],
        "release": state.get("release"),
        "generation": state.get("generation"),
        "result": state.get("result"),
        "error": state.get("error", ""),
        "stale": state.get("stale") or "",
        "started": _iso(state.get("started_ts")),
        "finished": _iso(state.get("finished_ts")),
        "seconds": state.get("seconds"),
        "changed": state.get("changed"),
        "failure": state.get("failure"),
    }


def signed_report(cfg: dict, report: dict) -> bytes:
    """The report as the control side reads it: {"payload": its JSON, "signature": made with this
    host's report key (namespace tritonfleet-report)}; an empty signature when the key is missing
    or cannot sign (the control side shows that host's report as not signed)."""
    payload = json.dumps(report, sort_keys=True)
    key = Path(cfg.get("report_key") or REPORT_KEY)
    signature = ""
    if key.is_file():
        try:
            signature = sign(key, {"r": payload.encode()}, namespace=REPORT_NAMESPACE)["r"]
        except (PullError, OSError) as e:
            print(f"report not signed with {key}: {e}", file=sys.stderr)
    else:
        print(f"report not signed: no report key {key} (tritonfleet bootstrap writes it)", file=sys.stderr)
    return json.dumps({"payload": payload, "signature": signature}).encode()


def send_report(cfg: dict, report: dict) -> None:
    """PUT the signed report where the control side reads it (best effort: a host whose report
    cannot be sent still converges; the rollout waiting for it counts it as not reported)."""
    base = cfg.get("reports", origin_url(cfg, "reports"))
    if not base:
        return
    req = urllib.request.Request(
        f"{base.rstrip('/')}/{cfg['host']}.json",
        data=signed_report(cfg, report),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=FETCH_TIMEOUT):
            pass
    except (urllib.error.URLError, OSError) as e:
        print(f"report not sent to {base}: {getattr(e, 'reason', e)}", file=sys.stderr)


METRICS = (
    ("tritonfleet_pull_last_run_timestamp_seconds", "When this host's last converge run finished (Unix time)."),
    (
        "tritonfleet_pull_last_run_success",
        "1 when this host's last converge run succeeded, 0 when it failed or refused what the origin offered.",
    ),
    ("tritonfleet_pull_last_run_duration_seconds", "How long this host's last converge run took."),
    ("tritonfleet_pull_last_check_timestamp_seconds", "When this host last looked at its desired release."),
    ("tritonfleet_pull_release_info", "The release this host converged to last (label release: sha256 prefix)."),
)


def textfile(state: dict) -> str:
    """The node exporter textfile (Prometheus text format 0.0.4)."""
    values = {
        "tritonfleet_pull_last_run_timestamp_seconds": state.get("finished_ts") or 0,
        "tritonfleet_pull_last_run_success": 1 if state.get("result") == "ok" else 0,
        "tritonfleet_pull_last_run_duration_seconds": state.get("seconds") or 0,
        "tritonfleet_pull_last_check_timestamp_seconds": state.get("checked_ts") or state.get("finished_ts") or 0,
    }
    out = []
    for name, help_ in METRICS:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        if name == "tritonfleet_pull_release_info":
            rel, res = short(state.get("release")), state.get("result") or "none"
            out.append(f'{name}{{release="{rel}",result="{res}",generation="{state.get("generation") or 0}"}} 1')
        else:
            out.append(f"{name} {float(values[name]):.3f}")
    return "\n".join(out) + "\n"


def write_textfile(cfg: dict, state: dict) -> None:
    path = cfg.get("textfile")
    if not path:
        return
    try:
        write_atomic(Path(path), textfile(state).encode())
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
