"""Pull mode's origin and signing key: the one place `tritonfleet check` reads tritonfleet.fleet.pull's
files (its pointers, signatures and reports), kept apart so that it follows that package's changes."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from ...core.errors import UsageError
from ..pull.origin import NAMESPACE, SIGNER, PullSite
from ..pull.reports import Reports
from ..pull.signing import read_pointer, verify
from .rows import (
    FAIL,
    OK,
    WARN,
    Row,
    Wiring,
    grouped,
)

# --------------------------------------------------------------------------- pull mode


def pull_origin_rows(w: Wiring) -> list[Row]:
    """--pull-origin DIR (and --sign-key KEY): the origin's layout, the key's two halves, each
    host's pointer (readable, for that host, naming a release that is there, signed by KEY) and
    report (readable). The one place that reads tritonfleet.fleet.pull's files for the check."""
    if w.pull_origin is None:
        return []
    c = "pull origin"
    try:
        origin = PullSite(w.pull_origin)
    except UsageError as e:
        return [Row(FAIL, c, str(e), "give the directory the hosts' origin URL serves")]
    rows = [
        Row(WARN, c, f"{w.pull_origin} has no {d}/", f"`tritonfleet {how}` writes it")
        for d, how in (("releases", "pull publish"), ("desired", "pull publish"), ("dist", "bootstrap"))
        if not (w.pull_origin / d).is_dir()
    ]
    signers = None
    found = []
    if w.sign_key is not None:
        key_rows, signers = _key_halves(w.sign_key)
        rows += key_rows
        if signers and w.bootstrap_dir is not None:
            trusted = signers.read_text().split()
            found += [_host_signers(w.bootstrap_dir, h.name, trusted, w.sign_key) for h in w.hosts or []]
    reports = Reports(origin)
    try:
        for h in w.hosts or []:
            found += _pointer_findings(origin, h.name, signers, w.sign_key)
            if origin.report(h.name).exists() and reports.read(h.name) is None:
                found.append(
                    (
                        h.name,
                        FAIL,
                        f"reports/{h.name}.json is unreadable (not a JSON report of this host)",
                        "the host writes it again at its next run; only the hosts may PUT under reports/",
                    )
                )
            elif not origin.report(h.name).exists():
                found.append((h.name, WARN, "no report yet", "a host reports after its first run (bootstrap it)"))
    finally:
        if signers:
            signers.unlink()
    rows += grouped(c, found)
    if not any(r.status != OK for r in rows):
        rows.append(Row(OK, c, f"{w.pull_origin}: laid out, {len(w.hosts or [])} pointer(s) and report(s) read"))
    return rows


def _key_halves(key: Path) -> tuple[list[Row], Path | None]:
    """The public half derived from KEY (ssh-keygen -y) against KEY.pub; a signers file for it."""
    c = "pull origin"
    res = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30
    )
    if res.returncode != 0:
        fix = (
            f"give the private half to --sign-key ({str(key)[:-4]}, not {key})"
            if str(key).endswith(".pub")
            else "give the private half to --sign-key (a key with a passphrase: compare `ssh-keygen -y -f KEY` with "
            "KEY.pub by hand)"
        )
        return [
            Row(FAIL, c, f"signing key {key}: ssh-keygen -y cannot read it: {res.stderr.strip()[-200:]}", fix)
        ], None
    derived = res.stdout.split()[:2]
    pub = Path(f"{key}.pub")
    rows = []
    if pub.is_file() and pub.read_text().split()[:2] != derived:
        rows.append(
            Row(
                FAIL,
                c,
                f"{pub} is not the public half of {key} (ssh-keygen -y {key} derives another key)",
                f"write it again: ssh-keygen -y -f {key} > {pub}; hosts bootstrapped with the wrong "
                "half trust no pointer (bootstrap them again)",
            )
        )
    fd, name = tempfile.mkstemp(prefix="tritonfleet-signers-")
    with os.fdopen(fd, "w") as f:
        f.write(f'{SIGNER} namespaces="{NAMESPACE}" {" ".join(derived)}\n')
    return rows, Path(name)


def _host_signers(out: Path, host: str, trusted: list[str], key: Path) -> tuple[str, str, str, str]:
    """The key a host trusts, from the bootstrap script written for it (its release-signers file)."""
    script = out / host / "bootstrap.sh"
    try:
        lines = script.read_text().splitlines()
    except OSError:
        return host, WARN, f"no {script.name} under {out}/<host>/ (bootstrapped elsewhere?)", "bootstrap it"
    marks = [i for i, ln in enumerate(lines) if ln.startswith("cat > ") and "release-signers" in ln]
    if not marks or marks[0] + 1 >= len(lines):
        return host, OK, "pinned to a release (no signers file)", ""
    # the heredoc's key lines: after a rotation it is the signers list, under a comment line
    body = []
    for ln in lines[marks[0] + 1 :]:
        if ln == "TRITONFLEET_EOF":
            break
        if not ln.startswith("#"):
            body.append(ln)
    if not any(trusted[-1] in ln.split() for ln in body):  # the key's base64 (a comment may follow it)
        return (
            host,
            FAIL,
            f"its bootstrap script trusts another key than {key}: the pointers {key} signs are refused there",
            f"bootstrap the host again with --sign-key {key} (and replace its user-data)",
        )
    return host, OK, f"trusts {key}", ""


def _pointer_findings(
    origin: PullSite, host: str, signers: Path | None, key: Path | None
) -> list[tuple[str, str, str, str]]:
    path = origin.pointer(host)
    if not path.exists():
        return [(host, WARN, "no pointer under desired/", "tritonfleet pull publish (or pull rollout) writes it")]
    payload = read_pointer(path)
    if not isinstance(payload, dict) or payload.get("host") != host or not payload.get("release"):
        return [
            (
                host,
                FAIL,
                f"desired/{host}.json is not a release pointer for this host",
                "publish it again: tritonfleet pull publish",
            )
        ]
    out = []
    if not origin.release(str(payload["release"])).is_file():
        out.append(
            (
                host,
                FAIL,
                f"its pointer names release {str(payload['release'])[:12]}, which is not under releases/",
                "publish the release again (tritonfleet pull publish)",
            )
        )
    if signers is not None:
        doc = json.loads(path.read_bytes())
        why = verify(signers, str(doc.get("payload", "")).encode(), str(doc.get("signature", "")))
        if why:
            out.append(
                (
                    host,
                    FAIL,
                    f"its pointer's signature does not verify against {key}: {why.splitlines()[-1]}",
                    f"publish again with the key the hosts trust (tritonfleet pull publish --sign-key {key})",
                )
            )
    return out
