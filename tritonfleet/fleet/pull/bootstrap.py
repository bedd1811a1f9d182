"""Hosts that converge themselves: what `tritonfleet bootstrap` gives a new machine, and the
systemd timer it leaves there.

``tritonfleet bootstrap`` publishes the agent on the origin (dist/: tritonfleet's wheel and the
wheels of everything it imports, each pinned by sha256 in dist/requirements-<its sha256>.txt) and writes, for
every host of the inventory, a plain shell script (for provisioners without cloud-init: run it as
root) and the same script as cloud-init user-data (``#cloud-config``: ``write_files`` puts it on
the machine, ``runcmd`` runs it once, at first boot: cloud-init's documentation, "Run commands on
first boot" and "Writing out arbitrary files"). The script needs only the distro's python3 (with
its venv module: ``python3-venv`` on Debian and Ubuntu, installed when missing), curl and the
origin: it fetches the requirements file its sha256 names and checks it, installs the agent
into /opt/tritonfleet/agent with pip (``--require-hashes``: nothing but the pinned files), writes
/etc/tritonfleet/pull.json (the host's name, the origin, the signers file or a pinned release
with the host's data, the generation floor, the intervals) and the host's report key, and
``tritonfleet converge --install`` puts the timer in place and starts the first run. From then
on the host needs nothing from the control machine.

Each host gets its own report key (ed25519, made here, kept in ``out``/<host>/report-key, its
public half enrolled in the origin's host-signers): the script and user-data hold that private
key, which can sign that host's reports and nothing else. A second bootstrap keeps the keys
(``rekey`` makes new ones).

The timer (systemd.timer(5)): ``OnBootSec`` (a rebooted host converges soon after boot, also in
the middle of a driver install that rebooted it), ``OnUnitInactiveSec`` = the poll interval
counted from the end of the last run (runs never overlap), ``RandomizedDelaySec`` (hosts that
booted together do not all ask the origin in the same second).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import shlex
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from ... import __version__
from ...core.errors import UsageError
from ...inventory import roster
from ...settings.defaults import DEFAULTS
from .origin import FORMAT, HOST_SIGNERS, PullSite, is_release_id, sha256_file, write_atomic
from .release import host_entries
from .signing import (
    allowed_signers,
    current_generation,
    enrol,
    host_signers,
    make_key,
    signers_doc,
    signers_text,
)

AGENT = "/opt/tritonfleet/agent"
CONFIG = "/etc/tritonfleet/pull.json"
SIGNERS = "/etc/tritonfleet/release-signers"
REPORT_KEY = "/etc/tritonfleet/pull/report-key"
UNIT = "tritonfleet-converge"
UNIT_DIR = Path("/etc/systemd/system")
DIST = "dist"


# --- the agent on the origin ---------------------------------------------------------------------


def runtime_closure(top: str = "tritonfleet") -> dict[str, str]:
    """Every distribution ``top`` needs at run time, as installed here ({canonical name:
    version}): its requirements and theirs, extras followed, environment markers evaluated for
    this machine (the hosts run the same distro family and Python)."""
    out: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(top, frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise UsageError(
                f"{name} is not installed here: the agent's dependencies are what this machine runs tritonfleet with"
            ) from None
        out[canonicalize_name(dist.metadata["Name"])] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return out


def requirements_name(sha: str) -> str:
    """The agent's requirements file on the origin, named by its content's sha256: a later
    bootstrap with another wheelhouse adds a file and never replaces one an earlier script
    (a launch template's user-data) fetches."""
    return f"requirements-{sha}.txt"


def publish_agent(origin: PullSite, wheelhouse: Path, wheel: Path, echo: Callable[[str], None] | None = None) -> str:
    """dist/ on the origin: tritonfleet's wheel (``wheel``: the one this machine installed, or
    `pip wheel --no-deps -w dist .` in a checkout) and its dependencies' wheels (from ``wheelhouse``:
    every distribution of ``runtime_closure()`` at the version installed here, e.g. filled with
    ``pip download``), an index page for pip, and the requirements file pinning each file by
    sha256 (dist/requirements-<sha256>.txt, and a copy as dist/requirements.txt: the newest).
    ``echo`` is told when the set differs from the newest one before. Returns the sha256 (what
    the bootstrap script fetches and checks)."""
    closure = runtime_closure()
    dist = origin.root / DIST / "wheels"
    dist.mkdir(parents=True, exist_ok=True)
    project, found, *_ = parse_wheel_filename(wheel.name)
    if project != "tritonfleet" or str(found) != __version__:
        raise UsageError(
            f"--wheel {wheel}: not tritonfleet {__version__}'s wheel (this machine runs {__version__}: "
            "the hosts get the same version)"
        )
    files: dict[str, list[Path]] = {"tritonfleet": [wheel]}
    for p in sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []:
        project, found, *_ = parse_wheel_filename(p.name)
        if closure.get(project) == str(found) and project != "tritonfleet":
            files.setdefault(project, []).append(p)
    missing = sorted(f"{n}=={v}" for n, v in closure.items() if n not in files)
    if missing:
        raise UsageError(
            f"wheelhouse {wheelhouse} lacks {len(missing)} of the agent's dependencies: "
            f"{' '.join(missing[:12])}{' ...' if len(missing) > 12 else ''}; fill it with "
            f"`pip download --only-binary=:all: --no-deps -d {wheelhouse} {' '.join(missing)}` "
            "(for the hosts' Python: --python-version/--platform)"
        )
    # a wheel already on the origin stays as it is: earlier requirements files pin its hash
    clash = [
        p.name
        for ps in files.values()
        for p in ps
        if (dist / p.name).is_file() and sha256_file(dist / p.name) != sha256_file(p)
    ]
    if clash:
        raise UsageError(
            f"wheelhouse {wheelhouse}: {', '.join(clash)} differ from the files of the same name on the "
            f"origin ({dist}), which earlier bootstrap scripts pin by sha256: use the origin's files, or "
            "remove them there once no host's script needs them"
        )
    lines = []
    for name in sorted(files):
        hashes = []
        for p in files[name]:
            dest = dist / p.name
            if not dest.is_file():
                shutil.copyfile(p, dest.with_name(f".{p.name}.tmp"))
                os.replace(dest.with_name(f".{p.name}.tmp"), dest)
            hashes.append(sha256_file(dest))
        version = closure.get(name) or parse_wheel_filename(files[name][0].name)[1]
        lines.append(f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(set(hashes))))
    # every wheel on the origin, so the sets of earlier scripts are found too (pip --find-links)
    links = [f'<a href="{html.escape(w.name)}">{html.escape(w.name)}</a><br>' for w in sorted(dist.glob("*.whl"))]
    write_atomic(
        dist / "index.html", ("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n").encode()
    )
    reqs = (
        "# the self-converging hosts' agent: every file pinned by sha256 (tritonfleet bootstrap)\n"
        + "\n".join(lines)
        + "\n"
    ).encode()
    sha = hashlib.sha256(reqs).hexdigest()
    newest = origin.root / DIST / "requirements.txt"
    try:
        before = hashlib.sha256(newest.read_bytes()).hexdigest()
    except OSError:
        before = None
    write_atomic(origin.root / DIST / requirements_name(sha), reqs)
    write_atomic(newest, reqs)
    if echo and before and before != sha:
        echo(
            f"the agent's requirements changed: {DIST}/{requirements_name(before)} -> {DIST}/{requirements_name(sha)} "
            "(scripts and user-data written before still install the earlier set, which stays on the origin; "
            "give new machines the ones written now)"
        )
    return sha


def check_url(value: str, option: str, what: str) -> None:
    """An http:// or https:// URL with a host, nothing else (a typo such as htp:// or http//
    would only show as hosts that never report)."""
    try:
        parts = urllib.parse.urlsplit(value or "")
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is no number, an unclosed [IPv6 address]
        ok = False
    if not ok or any(c.isspace() for c in value):
        raise UsageError(
            f"{option} {value!r}: {what} must be an http:// or https:// URL with a host, e.g. http://10.0.0.5:8080"
        )


# --- per host: the script and the user-data -------------------------------------------------------


def host_config(
    fh,
    origin_url: str,
    reports_url: str,
    signers: bool,
    release: str | None,
    min_generation: int = 0,
    host_data: dict | None = None,
) -> dict:
    """/etc/tritonfleet/pull.json for ``fh`` (its tunables from the inventory: a FleetHost is a
    Settings, the package's default where the inventory sets none). ``min_generation``: the
    origin's generation at bootstrap, below which the host follows no pointer; ``host_data``:
    the host's own entry, for a pinned release only (pointers carry it otherwise)."""
    return {
        "format": FORMAT,
        "host": fh.name,
        "origin": origin_url,
        "reports": reports_url,
        "signers": SIGNERS if signers else None,
        "release": release,
        "min_generation": min_generation,
        "host_data": host_data if release else None,
        "report_key": REPORT_KEY,
        "poll_interval": int(fh.get("pull_poll_interval")),
        "converge_interval": int(fh.get("pull_converge_interval")),
        "download_limit": int(fh.get("pull_download_limit")),
        "textfile": fh.get("pull_textfile") or "",
    }


def script(cfg: dict, requirements_sha256: str, signers_text: str | None, report_key: str = "") -> str:
    """The plain bootstrap script for one host (POSIX sh, run as root); ``report_key``: the
    host's private report key (written 0600, umask 077)."""
    origin = cfg["origin"]
    url = urllib.parse.urlsplit(origin)
    # pip takes an http:// index only from a host named trusted; every file is pinned by sha256
    trusted = f"--trusted-host {shlex.quote(url.netloc)} " if url.scheme == "http" else ""
    lines = [
        "#!/bin/sh",
        f"# tritonfleet bootstrap of {cfg['host']}: this host converges itself from {origin}",
        "# (written by `tritonfleet bootstrap`; run as root, once: a second run changes nothing)",
        "set -eu",
        "umask 022",
        f"ORIGIN={shlex.quote(origin)}",
        f"AGENT={AGENT}",
        "export DEBIAN_FRONTEND=noninteractive",
        "# the distro's python3 with its venv module, and curl",
        "if ! dpkg-query -W -f '${Status}' python3-venv 2>/dev/null | grep -q 'ok installed' || "
        "! command -v curl >/dev/null; then",
        "  apt-get update -q && apt-get install -y -q --no-install-recommends python3-venv curl ca-certificates",
        "fi",
        "tmp=$(mktemp -d)",
        "trap 'rm -rf \"$tmp\"' EXIT",
        "# the agent's files, each pinned by sha256 (the requirements file itself by the hash below)",
        'curl -fsS --retry 10 --retry-connrefused -o "$tmp/requirements.txt" '
        f'"$ORIGIN/{DIST}/{requirements_name(requirements_sha256)}"',
        f'echo "{requirements_sha256}  $tmp/requirements.txt" | sha256sum -c --quiet -',
        '[ -x "$AGENT/bin/pip" ] || python3 -m venv "$AGENT"',
        f'"$AGENT/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$ORIGIN/dist/wheels/" '
        f'{trusted}--require-hashes --no-deps -r "$tmp/requirements.txt"',
        "install -d -m 755 /etc/tritonfleet",
    ]
    if signers_text:
        lines += [
            f"cat > {SIGNERS}.tmp <<'TRITONFLEET_EOF'",
            signers_text.rstrip("\n"),
            "TRITONFLEET_EOF",
            f"mv {SIGNERS}.tmp {SIGNERS}",
        ]
    # root's alone from here: the host's data (pinned release), its report key, its state
    lines += ["umask 077", "install -d -m 700 /etc/tritonfleet/pull /var/lib/tritonfleet/pull"]
    if report_key:
        lines += [
            f"cat > {REPORT_KEY}.tmp <<'TRITONFLEET_EOF'",
            report_key.rstrip("\n"),
            "TRITONFLEET_EOF",
            f"chmod 600 {REPORT_KEY}.tmp",
            f"mv {REPORT_KEY}.tmp {REPORT_KEY}",
        ]
    lines += [
        f"cat > {CONFIG}.tmp <<'TRITONFLEET_EOF'",
        json.dumps(cfg, indent=1, sort_keys=True),
        "TRITONFLEET_EOF",
        f"chmod 600 {CONFIG}.tmp",
        f"mv {CONFIG}.tmp {CONFIG}",
        '"$AGENT/bin/tritonfleet" converge --install',
    ]
    return "\n".join(lines) + "\n"


def user_data(host: str, text: str) -> str:
    """cloud-init user-data running ``text`` (the plain script) once, at first boot."""
    path = "/var/lib/tritonfleet/bootstrap.sh"
    doc = {
        "write_files": [{"path": path, "permissions": "0700", "owner": "root:root", "content": text}],
        "runcmd": [["sh", path]],
    }
    return f"#cloud-config\n# tritonfleet bootstrap of {host} (tritonfleet bootstrap)\n" + yaml.safe_dump(
        doc, sort_keys=False, default_style=None, width=10_000
    )


def bootstrap(
    inventory: str,
    origin: PullSite,
    url: str,
    out: Path,
    *,
    wheelhouse: Path,
    wheel: Path,
    key: Path | None,
    release: str | None,
    reports_url: str | None = None,
    limit: list[str] | None = None,
    data: dict | None = None,
    rekey: bool = False,
    echo: Callable[[str], None] | None = None,
) -> list[Path]:
    """Publish the agent, make (or keep) every host's report key and enrol it on the origin, and
    write ``out``/<host>/{bootstrap.sh,user-data,report-key} (root's eyes only: 0600 in 0700
    directories) for every host; the directories written."""
    check_url(url, "--url", "the address the hosts reach the origin at")
    if reports_url:
        check_url(reports_url, "--reports", "where the hosts PUT their reports ('' for none)")
    if key and release:
        raise UsageError(
            "--sign-key and --release: choose one (--sign-key: hosts follow the release pointers it "
            "signs; --release: hosts stay on that one release and no signer is trusted)"
        )
    if not key and not release:
        raise UsageError(
            "give --sign-key (hosts follow the release pointers it signs: pull-mode rollouts) or "
            "--release SHA256 (hosts converge to that one release, pinned)"
        )
    if release and not is_release_id(release):
        raise UsageError(
            f"--release {release!r}: a release id is 64 lowercase hex digits (tritonfleet pull publish prints it)"
        )
    if release and not origin.release(release).is_file():
        raise UsageError(
            f"release {release} is not on the origin ({origin.release(release)}): publish it first "
            "(tritonfleet pull publish)"
        )
    try:
        hosts = roster.load_inventory(inventory, data=data, limit=limit)
    except roster.FleetError as e:
        raise UsageError(str(e)) from e
    doc = signers_doc(origin) if key else None  # after a key rotation: the current signers
    signers = (signers_text(doc["keys"], int(doc["generation"])) if doc else allowed_signers(key)) if key else None
    keys = report_keys([fh.name for fh in hosts], origin, out, rekey)
    reqs_sha = publish_agent(origin, wheelhouse, wheel, echo)
    entries = host_entries(hosts, Path.cwd())[0] if release else {}
    floor = current_generation(origin)
    written = []
    for fh in hosts:
        cfg = host_config(
            fh,
            url,
            reports_url if reports_url is not None else f"{url.rstrip('/')}/reports",
            bool(signers),
            release,
            floor,
            entries.get(fh.name),
        )
        text = script(cfg, reqs_sha, signers, keys[fh.name])
        d = out / fh.name
        _private(d / "bootstrap.sh", text, 0o700)
        _private(d / "user-data", user_data(fh.name, text), 0o600)
        written.append(d)
    return written


def _private(path: Path, text: str, mode: int) -> None:
    """``text`` at ``path`` with ``mode``, readable by its owner only from the start, in a 0700
    directory (the file holds the host's report key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    write_atomic(path, text.encode(), mode)


def report_keys(hosts: list[str], origin: PullSite, out: Path, rekey: bool = False) -> dict[str, str]:
    """Each host's private report key ({host: key text}): the one kept in ``out``/<host>/report-key,
    else a new one (``rekey``: new ones for all), enrolled in the origin's host-signers. A host
    enrolled with a key that is not in ``out`` is refused (its running agent would stop being
    believed): give the --out it was bootstrapped with, or rekey it."""
    enrolled = host_signers(origin)
    new, keys = {}, {}
    for host in hosts:
        path = out / host / "report-key"
        if path.is_file() and Path(f"{path}.pub").is_file() and not rekey:
            pub = Path(f"{path}.pub").read_text().split("\n")[0].strip()
            if enrolled.get(host) and enrolled[host].split(" ")[:2] != pub.split(" ")[:2]:
                new[host] = pub  # kept here, enrolled differently: this key is the host's
        elif enrolled.get(host) and not rekey:
            raise UsageError(
                f"{host}: its report key is enrolled in {origin.root / HOST_SIGNERS} but not in {path}: "
                "give the --out it was bootstrapped with, or --rekey (then give the host its new "
                "bootstrap: its reports stop counting until it has it)"
            )
        else:
            new[host] = make_key(path, f"tritonfleet-report {host}")
        keys[host] = path.read_text()
    if new:
        enrol(origin, new)
    return keys


# --- on the host: the timer ------------------------------------------------------------------------


def units(cfg: dict, agent: str = AGENT) -> dict[str, str]:
    """The service and timer of a self-converging host."""
    poll = int(cfg.get("poll_interval") or DEFAULTS["pull_poll_interval"])
    return {
        f"{UNIT}.service": (
            "[Unit]\n"
            "Description=tritonfleet: converge this host to its desired release\n"
            "Wants=network-online.target\nAfter=network-online.target\n\n"
            "[Service]\nType=oneshot\n"
            f"ExecStart={agent}/bin/tritonfleet converge\n"
            # a run may install a driver, pull an image, load models: no start timeout
            "TimeoutStartSec=infinity\n"
        ),
        f"{UNIT}.timer": (
            "[Unit]\nDescription=tritonfleet: look for this host's desired release, converge when due\n\n"
            "[Timer]\nOnBootSec=30\n"
            f"OnUnitInactiveSec={poll}\n"
            f"RandomizedDelaySec={max(1, min(poll // 10, 30))}\n"
            "AccuracySec=1\n\n"
            "[Install]\nWantedBy=timers.target\n"
        ),
    }


def install(cfg: dict, unit_dir: Path = UNIT_DIR, run=subprocess.run) -> None:
    """Write the units, enable the timer, start the first run (not waited for)."""
    for name, text in units(cfg, str(Path(sys.executable).parent.parent)).items():
        write_atomic(unit_dir / name, text.encode())
    for cmd in (
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", f"{UNIT}.timer"],
        ["systemctl", "start", "--no-block", f"{UNIT}.service"],
    ):
        res = run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise UsageError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
