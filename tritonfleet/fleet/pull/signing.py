"""Pull mode's signatures (OpenSSH's ``ssh-keygen -Y sign`` / ``-Y verify``): the hosts'
signed pointers (the release each should run, with its data, a generation and an expiry), the
release signers' rotation with an overlap (signers.json), and the hosts' own report keys
(host-signers)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from ...core.errors import UsageError
from ...settings.defaults import DEFAULTS
from .origin import (
    FORMAT,
    HOST_SIGNERS,
    NAMESPACE,
    REPORT_NAMESPACE,
    SIGNER,
    SIGNERS_DOC,
    SIGNERS_NAMESPACE,
    PullError,
    PullSite,
    is_release_id,
    iso,
    printable,
    write_atomic,
)

# --- signed pointers -------------------------------------------------------------------------

#: one line of an OpenSSH public key: its type, then base64 (ssh-keygen -y writes it)
PUBLIC_KEY_LINE = re.compile(r"^(ssh|ecdsa|sk)-[A-Za-z0-9@.-]+ [A-Za-z0-9+/]+={0,2}( .*)?$")


def public_key(key: Path) -> str:
    """The public half of the signing key: ``key`` itself when it is a public key (key.pub),
    else ``key``.pub beside it, else derived from the private key with ssh-keygen -y."""
    try:
        first = key.read_text(errors="replace").split("\n")[0].strip()
    except OSError:
        first = ""
    if PUBLIC_KEY_LINE.match(first):
        return first
    pub = Path(f"{key}.pub")
    if pub.is_file():
        return pub.read_text().split("\n")[0].strip()
    res = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise UsageError(f"signing key {key}: {res.stderr.strip() or 'ssh-keygen -y failed'}")
    return res.stdout.strip()


def check_sign_key(key: Path) -> None:
    """A signing key that is not there is bad input (exit status 2), refused before anything is
    published."""
    if not key.is_file() and not Path(f"{key}.pub").is_file():
        raise UsageError(f"signing key {key} not found (the key whose public half the hosts' bootstrap trusts)")


def allowed_signers(key: Path) -> str:
    """The hosts' allowed-signers file for ``key`` (ssh-keygen(1), ALLOWED SIGNERS: principal,
    then the key; ``namespaces=`` limits it to release pointers and signers documents)."""
    return f'{SIGNER} namespaces="{NAMESPACE},{SIGNERS_NAMESPACE}" {public_key(key)}\n'


def sign(key: Path, payloads: dict[str, bytes], batch: int = 500, namespace: str = NAMESPACE) -> dict[str, str]:
    """The signature of each payload (armored, as ssh-keygen writes it), made by one ssh-keygen
    process per ``batch`` payloads."""
    out: dict[str, str] = {}
    names = list(payloads)
    with tempfile.TemporaryDirectory(prefix="tritonfleet-sign-") as tmp:
        for start in range(0, len(names), batch):
            part = names[start : start + batch]
            files = []
            for i, name in enumerate(part):
                p = Path(tmp) / f"{start + i}"
                p.write_bytes(payloads[name])
                files.append(p)
            res = subprocess.run(
                ["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", namespace, *map(str, files)],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            if res.returncode != 0:
                raise PullError(
                    f"signing with {key} failed: {res.stderr.strip()[-400:]} (an unencrypted key, or "
                    "the public key with the private one in ssh-agent)"
                )
            for name, p in zip(part, files, strict=True):
                out[name] = Path(f"{p}.sig").read_text()
    return out


def verify(signers: Path, payload: bytes, signature: str, identity: str = SIGNER, namespace: str = NAMESPACE) -> str:
    """ "" when ``signature`` is a valid signature of ``payload`` by a key of ``signers`` for
    ``identity`` in ``namespace``; else why not (ssh-keygen's words)."""
    if not signature.strip():
        return "not signed"
    with tempfile.NamedTemporaryFile("w", suffix=".sig") as sig:
        sig.write(signature)
        sig.flush()
        res = subprocess.run(
            ["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I", identity, "-n", namespace, "-s", sig.name],
            input=payload,
            capture_output=True,
        )
    return "" if res.returncode == 0 else (res.stderr.decode(errors="replace").strip() or "signature refused")


def read_pointer(path: Path) -> dict | None:
    """A pointer file's payload as the control machine wrote it (not verified: its own file);
    None when it is missing or not a pointer."""
    try:
        payload = json.loads(json.loads(path.read_bytes())["payload"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return payload if isinstance(payload, dict) else None


def pointer_release(path: Path) -> tuple[dict | None, str]:
    """(the payload, "") of a pointer that names a release id; (None, why) for a missing or
    unreadable pointer or one whose release is not a release id."""
    if not path.exists():
        return None, ""
    ptr = read_pointer(path)
    if ptr is None:
        return None, f"pointer {path.parent.name}/{path.name} unreadable (not a signed pointer)"
    if not is_release_id(ptr.get("release")):
        return (
            None,
            f"pointer {path.parent.name}/{path.name} names no release id ({printable(ptr.get('release'))[:40]})",
        )
    return ptr, ""


def current_generation(origin: PullSite) -> int:
    """The generation of the origin's newest pointers (0 before any)."""
    try:
        return int((origin.root / "desired" / ".generation").read_text().strip())
    except (OSError, ValueError):
        return 0


def publish_desired(
    origin: PullSite,
    key: Path,
    desired: dict[str, str],
    rollout_id: str,
    host_data: dict[str, dict] | None = None,
    ttl: float | None = None,
) -> int:
    """Point each host of ``desired`` at its release, with its own inventory entry (``host_data``:
    {groups, data}; a host receives only its own) and an expiry ``ttl`` seconds ahead; the
    generation these pointers carry (higher than any before on this origin, so a host never goes
    back to an older pointer). Only release ids are signed."""
    if not desired:
        return 0
    bad = {h: r for h, r in desired.items() if not is_release_id(r)}
    if bad:
        raise PullError(
            f"not signed: {', '.join(f'{h} -> {printable(r)[:40]!r}' for h, r in bad.items())} "
            "(a release id is a sha256)"
        )
    generation = max(current_generation(origin) + 1, int(time.time() * 1000))
    now = time.time()
    ttl = float(DEFAULTS["pull_pointer_ttl"] if ttl is None else ttl)
    payloads = {}
    for host, release in desired.items():
        size = origin.release(release).stat().st_size if origin.release(release).is_file() else None
        payloads[host] = json.dumps(
            {
                "format": FORMAT,
                "host": host,
                "release": release,
                "release_size": size,
                "generation": generation,
                "rollout": rollout_id,
                "published": iso(now),
                "expires": iso(now + ttl),
                "host_data": (host_data or {}).get(host),
            },
            sort_keys=True,
        ).encode()
    sigs = sign(key, payloads)
    write_atomic(origin.root / "desired" / ".generation", f"{generation}\n".encode())
    for host, payload in payloads.items():
        write_atomic(origin.pointer(host), json.dumps({"payload": payload.decode(), "signature": sigs[host]}).encode())
    return generation


def refresh(origin: PullSite, key: Path, ttl: float | None = None) -> tuple[int, list[str]]:
    """Re-sign every live pointer of the origin: the same release and host data, a new generation
    and expiry (run from a timer well within pull_pointer_ttl, so hosts can tell a live origin
    from a frozen one). Returns (the generation, the hosts); a pointer that names no release id
    is left alone and named in the PullError raised after the others are signed."""
    desired, data, bad = {}, {}, []
    for path in sorted((origin.root / "desired").glob("*.json")):
        ptr, why = pointer_release(path)
        if ptr is None or ptr.get("host") != path.stem:
            bad.append(why or f"{path.name} names host {printable(ptr.get('host') if ptr else None)!r}")
            continue
        desired[path.stem], data[path.stem] = ptr["release"], ptr.get("host_data")
    gen = publish_desired(origin, key, desired, f"refresh-{time.strftime('%Y%m%dT%H%M%S')}", data, ttl)
    if bad:
        raise PullError(f"refreshed {len(desired)} pointer(s) (generation {gen}); not refreshed: {'; '.join(bad)}")
    return gen, sorted(desired)


# --- the release signers: rotation with an overlap ---------------------------------------------------


def signers_doc(origin: PullSite) -> dict | None:
    """The origin's current signers document payload (its own file), None when there is none."""
    try:
        doc = json.loads(json.loads((origin.root / SIGNERS_DOC).read_bytes())["payload"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return doc if isinstance(doc, dict) else None


def rotate_key(origin: PullSite, key: Path, new: Path | None = None, retire: Path | None = None) -> dict:
    """Publish the hosts' next release-signers list, signed by ``key`` (a key they trust now):
    the current list (or ``key`` alone) plus ``new``, less ``retire``. A host installs it on its
    next converge, after checking it against the signers it has; so a rotation is two steps: add
    the new key (both verify), move the pointers to it (`pull refresh --sign-key NEW`), then retire
    the old one. Returns the payload published."""
    current = signers_doc(origin)
    keys = list((current or {}).get("keys") or [public_key(key)])
    if new is not None and public_key(new) not in keys:
        keys.append(public_key(new))
    if retire is not None:
        keys = [k for k in keys if k.split(" ")[:2] != public_key(retire).split(" ")[:2]]
    if not keys:
        raise UsageError("that leaves the hosts no release signer: add the new key before retiring the old one")
    if public_key(key).split(" ")[:2] not in [k.split(" ")[:2] for k in (current or {}).get("keys") or keys]:
        raise UsageError(f"--sign-key {key} is not a signer the hosts trust now: sign with one of the current keys")
    payload = {
        "format": FORMAT,
        "keys": keys,
        "generation": int((current or {}).get("generation") or 0) + 1,
        "published": iso(time.time()),
    }
    raw = json.dumps(payload, sort_keys=True).encode()
    sig = sign(key, {"d": raw}, namespace=SIGNERS_NAMESPACE)["d"]
    write_atomic(origin.root / SIGNERS_DOC, json.dumps({"payload": raw.decode(), "signature": sig}).encode())
    return payload


def signers_text(keys: list[str], generation: int) -> str:
    """A hosts' allowed-signers file for ``keys`` (the generation of the document it came from on
    its first line, a comment to ssh-keygen)."""
    return f"# tritonfleet release signers, generation {generation}\n" + "".join(
        f'{SIGNER} namespaces="{NAMESPACE},{SIGNERS_NAMESPACE}" {k}\n' for k in keys
    )


# --- the hosts' report keys ----------------------------------------------------------------------

#: a host name that can be a principal of host-signers (a pattern there: no '*', ',' or space)
_PRINCIPAL_RE = re.compile(r"[A-Za-z0-9._@-]+")


def make_key(path: Path, comment: str) -> str:
    """A new ed25519 key pair at ``path`` (private half 0600 in a 0700 directory); its public half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    for p in (path, Path(f"{path}.pub")):
        p.unlink(missing_ok=True)
    res = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if res.returncode != 0:
        raise PullError(f"ssh-keygen could not make {path}: {res.stderr.strip()}")
    os.chmod(path, 0o600)
    return Path(f"{path}.pub").read_text().split("\n")[0].strip()


def host_signers(origin: PullSite) -> dict[str, str]:
    """The enrolled report keys: {host: public key}."""
    out: dict[str, str] = {}
    try:
        lines = (origin.root / HOST_SIGNERS).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(" ", 2)
        if len(parts) == 3 and not line.startswith("#"):
            out[parts[0]] = parts[2] if parts[1].startswith("namespaces=") else f"{parts[1]} {parts[2]}"
    return out


def enrol(origin: PullSite, keys: dict[str, str]) -> None:
    """``keys`` ({host: public key}) into the origin's host-signers, replacing those hosts' keys."""
    odd = [h for h in keys if not _PRINCIPAL_RE.fullmatch(h)]
    if odd:  # a principal is a pattern in an allowed-signers file: '*' or ',' would match other hosts
        raise UsageError(
            f"host name(s) {', '.join(map(repr, odd))} cannot hold a report key: letters, digits, "
            "'.', '_', '-' and '@' only"
        )
    have = {**host_signers(origin), **keys}
    write_atomic(
        origin.root / HOST_SIGNERS,
        "".join(f'{h} namespaces="{REPORT_NAMESPACE}" {k}\n' for h, k in sorted(have.items())).encode(),
    )
