"""Pull mode, the control side: hosts that converge themselves from a release they fetch.

The control machine never connects to a host here. It writes an **origin**: a directory that any
HTTP(S) server serves to the hosts (nginx, a bucket's website, Python's http.server), laid out as

    releases/<sha256>.tar.gz   the operator's repository release: the deploy and the model
                               repository (no host's inventory data); named by its own sha256,
                               which the host checks
    blobs/<sha256>             image archives the inventory names (image_archives), by content
    desired/<host>.json        the release this host should run: {host, release, generation,
                               expires, host_data (this host's own inventory entry)}, signed with
                               the operator's key (ssh-keygen -Y sign), so a host follows only
                               what the key signed, for itself, never an older or expired one
    reports/<host>.json        what the host last did (release, generation, result, times), signed
                               with the host's own report key and PUT there by the host (the
                               server must accept PUT for reports/)
    host-signers               the hosts' report keys (allowed signers: principal = host name),
                               enrolled by `tritonfleet bootstrap`
    signers.json               optional: the release signers' keys, signed by a key the hosts
                               trust (`tritonfleet pull rotate-key`)
    dist/                      the pinned agent: tritonfleet's wheel and its dependencies
                               (tritonfleet.fleet.bootstrap)

A pull-mode rollout (``rollout``) is the push rollout's plan (canary, batches, failure budget,
rollback, journal) with each batch published instead of deployed: the batch's pointers name the
new release, and the rollout waits for those hosts' reports; a failed host's pointer goes back to
the release it ran before. Reading a report is a stat and, when it changed, a small JSON file:
the control machine's cost per host is the publishing and that read, not an SSH session.

Signatures are OpenSSH's (``ssh-keygen -Y sign`` / ``-Y verify``, OpenSSH 8.1 and newer: the
ssh-keygen(1) manual page, "-Y sign" and "ALLOWED SIGNERS"): every host already has ssh-keygen
(openssh-client), the key is an ordinary SSH key, and an ssh-agent can hold it.
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

from ..core.errors import TritonfleetError, UsageError
from ..settings.defaults import DEFAULTS

FORMAT = 1
MANIFEST = "tritonfleet-release.json"
REPO = "repo"  # the repository's files inside a release archive
NAMESPACE = "tritonfleet-release"  # ssh-keygen -Y namespace: a signature made for nothing else
SIGNER = "tritonfleet-release"  # the identity in the hosts' allowed-signers file
REPORT_NAMESPACE = "tritonfleet-report"  # a host's signature of its own report
SIGNERS_NAMESPACE = "tritonfleet-signers"  # the release signers' document (key rotation)
HOST_SIGNERS = "host-signers"  # on the origin: the hosts' report keys (public halves)
SIGNERS_DOC = "signers.json"  # on the origin: the release signers, signed (key rotation)
MAX_SMALL = 1 << 20  # bytes: a pointer, a report or a signers document is never larger
ISO = "%Y-%m-%dT%H:%M:%SZ"
_ISO_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_RELEASE_RE = re.compile(r"[0-9a-f]{64}")
_PRINCIPAL_RE = re.compile(r"[A-Za-z0-9._@-]+")
# inventory data that is the control machine's business only: how it connects (a self-converging
# host runs its deploy through pyinfra's @local connector as root)
CONTROL_ONLY_PREFIXES = ("ssh_", "_")
# what a release holds by default besides the deploy: the model repository lives under files/
INCLUDE = ("deploys", "files")
RESULTS = ("ok", "failed", "refused")  # a report's final results ("running" while it runs)


def is_release_id(value: object) -> bool:
    """A release id is a sha256: 64 lowercase hex digits, nothing else (it becomes a path)."""
    return isinstance(value, str) and _RELEASE_RE.fullmatch(value) is not None


def parse_iso(value: object) -> float | None:
    """Unix time of ``value`` in the reports' and pointers' form (2026-01-02T03:04:05Z); None when
    it is not that form."""
    if not isinstance(value, str) or not _ISO_RE.fullmatch(value):
        return None
    try:
        return float(calendar.timegm(time.strptime(value, ISO)))
    except ValueError:
        return None


def iso(ts: float) -> str:
    return time.strftime(ISO, time.gmtime(ts))


def printable(text: object) -> str:
    """``text`` for a terminal: control characters (escape sequences, newlines) escaped."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


class PullError(TritonfleetError):
    """A pull-mode step that could not be done (origin, signing, a host's report)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """``data`` at ``path`` (``mode``), never half-written: what a server serves is the old file or
    the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


#: a URL given where the origin directory belongs (``scheme://``)
URL_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class Origin:
    """The origin directory (``root``) and the URL the hosts reach it at (``url``)."""

    def __init__(self, root: str | os.PathLike, url: str = ""):
        if URL_LIKE.match(str(root)):  # Path() would fold its '//' into '/'
            raise UsageError(f"origin {root} is an address: give the origin directory this machine writes (the one "
                             "served at that address to the hosts), e.g. /srv/tritonfleet-origin")
        self.root = Path(root)
        self.url = url.rstrip("/")
        if not self.root.is_dir():
            raise UsageError(f"origin {self.root} is not a directory: create it, and serve it to the hosts "
                             "over HTTP(S) (docs/fleet-operations.md, Pull mode)")

    def release(self, sha: str) -> Path:
        return self.root / "releases" / f"{sha}.tar.gz"

    def blob(self, sha: str) -> Path:
        return self.root / "blobs" / sha

    def pointer(self, host: str) -> Path:
        return self.root / "desired" / f"{host}.json"

    def report(self, host: str) -> Path:
        return self.root / "reports" / f"{host}.json"

    @contextlib.contextmanager
    def lock(self, what: str) -> Iterator[None]:
        """One publisher at a time: two rollouts moving the same hosts' pointers would undo each
        other's waves. Refused at once, naming the holder."""
        path = self.root / ".tritonfleet-publish.lock"
        with open(path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                raise PullError(f"origin {self.root} is being published by another run ({f.read().strip() or '?'}): "
                                "let it finish") from None
            f.seek(0)
            f.truncate()
            f.write(f"{what}, pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            f.flush()
            try:
                yield
            finally:
                f.truncate(0)


# --- releases ----------------------------------------------------------------------------------

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
        data["image_archives"] = {image: _blob(fh.name, Path(path), repo_root, blobs)
                                  for image, path in archives.items()}
    repo = fh.get("model_repository") or DEFAULTS["model_repository"]
    if Path(repo).is_absolute():
        try:
            data["model_repository"] = str(Path(repo).resolve().relative_to(repo_root.resolve()))
        except ValueError:
            raise UsageError(f"{fh.name}: model_repository {repo} is outside the repository ({repo_root}): a "
                             "self-converging host gets the model repository inside its release; keep it in "
                             "the repository (files/model_repository)") from None
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
            raise UsageError(f"{top} not found: a release holds {', '.join(include)} of the repository "
                             f"({repo_root}); name what exists with --include")
        items = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        files += [p for p in items if "__pycache__" not in p.parts]
    return files


def host_entries(hosts: list, repo_root: Path) -> tuple[dict[str, dict], dict[str, Path]]:
    """Each host's entry (host_entry) and the blobs they name (sha -> local file)."""
    blobs: dict[str, Path] = {}
    return {fh.name: host_entry(fh, repo_root, blobs) for fh in hosts}, blobs


def build_release(hosts: list, deploy: str, repo_root: Path, include: tuple[str, ...] = INCLUDE
                  ) -> tuple[bytes, str, dict[str, Path]]:
    """The release archive of ``repo_root`` for ``hosts`` (deterministic: the same files make the
    same bytes, so publishing twice is one release), its sha256, and the blobs their data names.
    The archive holds no host's data: every host fetching it may read it."""
    deploy_rel = Path(deploy)
    if deploy_rel.is_absolute():
        deploy_rel = deploy_rel.resolve().relative_to(repo_root.resolve())
    if not (repo_root / deploy_rel).is_file():
        raise UsageError(f"deploy {deploy} not found in {repo_root}")
    include = tuple(dict.fromkeys((*include, str(deploy_rel.parent) if str(deploy_rel.parent) != "." else str(deploy_rel))))
    entries, blobs = host_entries(hosts, repo_root)
    for fh in hosts:
        repo = Path(entries[fh.name]["data"].get("model_repository") or DEFAULTS["model_repository"])
        if not any(repo == Path(i) or Path(i) in repo.parents for i in include):
            raise UsageError(f"{fh.name}: model_repository {repo} is not in the release ({', '.join(include)}): "
                             f"add it with --include {repo}")
    # no host's data: each host's entry travels in its own signed pointer (host_entries)
    manifest = {"format": FORMAT, "deploy": str(deploy_rel),
                "blobs": {sha: {"name": p.name, "size": p.stat().st_size} for sha, p in sorted(blobs.items())}}
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, json.dumps(manifest, sort_keys=True, indent=1).encode(), 0o644)
        for path in _included(repo_root, include):
            _add(tar, f"{REPO}/{path.relative_to(repo_root).as_posix()}", path.read_bytes(),
                 0o755 if os.access(path, os.X_OK) else 0o644)
    data = raw.getvalue()
    return data, hashlib.sha256(data).hexdigest(), blobs


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = \
        len(data), mode, 0, 0, 0, "root", "root"
    tar.addfile(info, io.BytesIO(data))


def publish_release(origin: Origin, hosts: list, deploy: str, repo_root: Path,
                    include: tuple[str, ...] = INCLUDE) -> str:
    """Build the release and put it (and its blobs) on the origin; its id (sha256)."""
    data, sha, blobs = build_release(hosts, deploy, repo_root, include)
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
            part = names[start:start + batch]
            files = []
            for i, name in enumerate(part):
                p = Path(tmp) / f"{start + i}"
                p.write_bytes(payloads[name])
                files.append(p)
            res = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", namespace,
                                  *map(str, files)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if res.returncode != 0:
                raise PullError(f"signing with {key} failed: {res.stderr.strip()[-400:]} (an unencrypted key, or "
                                "the public key with the private one in ssh-agent)")
            for name, p in zip(part, files, strict=True):
                out[name] = Path(f"{p}.sig").read_text()
    return out


def verify(signers: Path, payload: bytes, signature: str, identity: str = SIGNER,
           namespace: str = NAMESPACE) -> str:
    """"" when ``signature`` is a valid signature of ``payload`` by a key of ``signers`` for
    ``identity`` in ``namespace``; else why not (ssh-keygen's words)."""
    if not signature.strip():
        return "not signed"
    with tempfile.NamedTemporaryFile("w", suffix=".sig") as sig:
        sig.write(signature)
        sig.flush()
        res = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I", identity, "-n", namespace,
                              "-s", sig.name], input=payload, capture_output=True)
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
        return None, f"pointer {path.parent.name}/{path.name} names no release id ({printable(ptr.get('release'))[:40]})"
    return ptr, ""


def current_generation(origin: Origin) -> int:
    """The generation of the origin's newest pointers (0 before any)."""
    try:
        return int((origin.root / "desired" / ".generation").read_text().strip())
    except (OSError, ValueError):
        return 0


def publish_desired(origin: Origin, key: Path, desired: dict[str, str], rollout_id: str,
                    host_data: dict[str, dict] | None = None, ttl: float | None = None) -> int:
    """Point each host of ``desired`` at its release, with its own inventory entry (``host_data``:
    {groups, data}; a host receives only its own) and an expiry ``ttl`` seconds ahead; the
    generation these pointers carry (higher than any before on this origin, so a host never goes
    back to an older pointer). Only release ids are signed."""
    if not desired:
        return 0
    bad = {h: r for h, r in desired.items() if not is_release_id(r)}
    if bad:
        raise PullError(f"not signed: {', '.join(f'{h} -> {printable(r)[:40]!r}' for h, r in bad.items())} "
                        "(a release id is a sha256)")
    generation = max(current_generation(origin) + 1, int(time.time() * 1000))
    now = time.time()
    ttl = float(DEFAULTS["pull_pointer_ttl"] if ttl is None else ttl)
    payloads = {}
    for host, release in desired.items():
        size = origin.release(release).stat().st_size if origin.release(release).is_file() else None
        payloads[host] = json.dumps({
            "format": FORMAT, "host": host, "release": release, "release_size": size, "generation": generation,
            "rollout": rollout_id, "published": iso(now), "expires": iso(now + ttl),
            "host_data": (host_data or {}).get(host)}, sort_keys=True).encode()
    sigs = sign(key, payloads)
    write_atomic(origin.root / "desired" / ".generation", f"{generation}\n".encode())
    for host, payload in payloads.items():
        write_atomic(origin.pointer(host), json.dumps({"payload": payload.decode(), "signature": sigs[host]}).encode())
    return generation


def refresh(origin: Origin, key: Path, ttl: float | None = None) -> tuple[int, list[str]]:
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

def signers_doc(origin: Origin) -> dict | None:
    """The origin's current signers document payload (its own file), None when there is none."""
    try:
        doc = json.loads(json.loads((origin.root / SIGNERS_DOC).read_bytes())["payload"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return doc if isinstance(doc, dict) else None


def rotate_key(origin: Origin, key: Path, new: Path | None = None, retire: Path | None = None) -> dict:
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
    payload = {"format": FORMAT, "keys": keys, "generation": int((current or {}).get("generation") or 0) + 1,
               "published": iso(time.time())}
    raw = json.dumps(payload, sort_keys=True).encode()
    sig = sign(key, {"d": raw}, namespace=SIGNERS_NAMESPACE)["d"]
    write_atomic(origin.root / SIGNERS_DOC, json.dumps({"payload": raw.decode(), "signature": sig}).encode())
    return payload


def signers_text(keys: list[str], generation: int) -> str:
    """A hosts' allowed-signers file for ``keys`` (the generation of the document it came from on
    its first line, a comment to ssh-keygen)."""
    return f"# tritonfleet release signers, generation {generation}\n" + "".join(
        f'{SIGNER} namespaces="{NAMESPACE},{SIGNERS_NAMESPACE}" {k}\n' for k in keys)


# --- the hosts' report keys ----------------------------------------------------------------------

def make_key(path: Path, comment: str) -> str:
    """A new ed25519 key pair at ``path`` (private half 0600 in a 0700 directory); its public half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    for p in (path, Path(f"{path}.pub")):
        p.unlink(missing_ok=True)
    res = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise PullError(f"ssh-keygen could not make {path}: {res.stderr.strip()}")
    os.chmod(path, 0o600)
    return Path(f"{path}.pub").read_text().split("\n")[0].strip()


def host_signers(origin: Origin) -> dict[str, str]:
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


def enrol(origin: Origin, keys: dict[str, str]) -> None:
    """``keys`` ({host: public key}) into the origin's host-signers, replacing those hosts' keys."""
    odd = [h for h in keys if not _PRINCIPAL_RE.fullmatch(h)]
    if odd:  # a principal is a pattern in an allowed-signers file: '*' or ',' would match other hosts
        raise UsageError(f"host name(s) {', '.join(map(repr, odd))} cannot hold a report key: letters, digits, "
                         "'.', '_', '-' and '@' only")
    have = {**host_signers(origin), **keys}
    write_atomic(origin.root / HOST_SIGNERS, "".join(
        f'{h} namespaces="{REPORT_NAMESPACE}" {k}\n' for h, k in sorted(have.items())).encode())


# --- reports ----------------------------------------------------------------------------------

class Reports:
    """The hosts' signed reports on the origin, read and verified again only when a file changed
    (a stat a host). A report counts only when its host's report key signed it (host-signers)."""

    def __init__(self, origin: Origin):
        self.origin = origin
        self._seen: dict[str, tuple[int, int, dict | None, str]] = {}

    def read(self, host: str) -> dict | None:
        """The host's report when it is signed by the host and well formed, else None."""
        return self.check(host)[0]

    def check(self, host: str) -> tuple[dict | None, str]:
        """(the report, "") or (None, why not): "no report", or the report is unreadable, not
        signed, its signature refused, or malformed."""
        path = self.origin.report(host)
        try:
            st = path.stat()
        except OSError:
            return None, "no report"
        seen = self._seen.get(host)
        if seen and seen[:2] == (st.st_mtime_ns, st.st_size):
            return seen[2], seen[3]
        rep, why = self._verify(host, path, st.st_size)
        self._seen[host] = (st.st_mtime_ns, st.st_size, rep, why)
        return rep, why

    def _verify(self, host: str, path: Path, size: int) -> tuple[dict | None, str]:
        if size > MAX_SMALL:
            return None, f"report unreadable: {size} bytes (more than {MAX_SMALL})"
        try:
            outer = json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            return None, f"report unreadable: {printable(e)[:120]}"
        if not isinstance(outer, dict) or not isinstance(outer.get("payload"), str):
            return None, "report not signed (no signed payload: its host runs an older agent, or it is forged)"
        signature = outer.get("signature")
        if not isinstance(signature, str) or not signature.strip():
            return None, "report not signed (no signature)"
        signers = self.origin.root / HOST_SIGNERS
        if not signers.is_file():
            return None, f"report signature refused: {signers} missing (tritonfleet bootstrap enrols the hosts' keys)"
        why = verify(signers, outer["payload"].encode(), signature, identity=host, namespace=REPORT_NAMESPACE)
        if why:
            return None, f"report signature refused: {printable(why)[:160]}"
        try:
            rep = json.loads(outer["payload"])
        except ValueError as e:
            return None, f"report malformed: {printable(e)[:120]}"
        bad = report_problem(host, rep)
        return (None, f"report malformed: {bad}") if bad else (rep, "")


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def report_problem(host: str, rep: object) -> str:
    """What is wrong with a report payload's shape ("" when nothing): what the rollout and status
    read of it has the types they expect."""
    if not isinstance(rep, dict):
        return "not an object"
    checks = (
        ("host", rep.get("host") == host, f"names host {printable(rep.get('host'))[:40]!r}"),
        ("release", rep.get("release") is None or is_release_id(rep.get("release")), "release is not a release id"),
        ("generation", rep.get("generation") is None or _int(rep.get("generation")), "generation is not a whole number"),
        ("result", rep.get("result") in (*RESULTS, "running"), "result is not ok, failed, refused or running"),
        ("started", rep.get("started") is None or parse_iso(rep.get("started")) is not None,
         "started is not a time like 2026-01-02T03:04:05Z"),
        ("finished", rep.get("finished") is None or parse_iso(rep.get("finished")) is not None,
         "finished is not a time like 2026-01-02T03:04:05Z"),
        ("error", isinstance(rep.get("error", ""), str), "error is not text"),
        ("stale", isinstance(rep.get("stale", ""), str), "stale is not text"),
        ("changed", rep.get("changed") is None or _int(rep.get("changed")), "changed is not a whole number"),
        ("failure", rep.get("failure") is None or isinstance(rep.get("failure"), dict), "failure is not an object"),
    )
    return next((why for _, ok, why in checks if not ok), "")


def short(release: str | None) -> str:
    return printable(release or "-")[:12]


def describe(rep: dict | None, why: str = "") -> str:
    """One line of a host's report for a person (control characters escaped)."""
    if not rep:
        return why or "no report"
    when = rep.get("finished") or rep.get("started") or "?"
    text = f"{rep.get('result', '?')} on {short(rep.get('release'))} at {when}"
    return printable(f"{text}: {rep['error']}" if rep.get("error") else text)


# --- the pull-mode rollout ----------------------------------------------------------------------

def rollout(inventory: str, deploy: str, origin: Origin, key: Path, *, limit: list[str] | None = None,
            canary: int = 1, batch: str | int = "25%", max_fail: str | int = 0, data: dict | None = None,
            timeout: float | None = None, include: tuple[str, ...] = INCLUDE,
            echo: Callable[[str], None] = print, poll: float = 1.0):
    """Publish the repository (``deploy`` and what ``include`` names, from the current directory)
    as a release, then move the targets to it batch by batch: canary first, each batch's pointers
    published and its hosts' reports awaited; a host that fails (or does not report within
    ``timeout``) is pointed back at the release it ran before; more than ``max_fail`` failures
    halt the rollout, the hosts not reached yet keep their pointers. Returns the push rollout's
    Report (tritonfleet.fleet.rollout), so both modes print and exit alike."""
    from . import inventory as fleet
    from .rollout.journal import JOURNAL, Journal
    from .rollout.plan import RolloutError, parse_max_fail, plan_batches
    from .rollout.report import HostResult, Report

    parse_max_fail(max_fail, 0)  # its form (N or P%), before anything runs
    check_sign_key(key)
    t_start = time.monotonic()
    try:
        hosts = fleet.load_inventory(inventory, data=data, limit=limit)
        batches = plan_batches([h.name for h in hosts], canary, batch)
        max_fail = parse_max_fail(max_fail, len(hosts))  # P%: of the targets, rounded down
    except (fleet.FleetError, RolloutError) as e:
        raise UsageError(str(e)) from e
    names = [h.name for h in hosts]
    wait = float(timeout if timeout is not None else hosts[0].get("pull_report_timeout", DEFAULTS["pull_report_timeout"]))
    report = Report(inventory, deploy, batches, [HostResult(n) for n in names])
    with origin.lock(f"pull rollout of {deploy}"):
        sha = publish_release(origin, hosts, deploy, Path.cwd(), include)
        entries, _ = host_entries(hosts, Path.cwd())
        ttl = float(hosts[0].get("pull_pointer_ttl", DEFAULTS["pull_pointer_ttl"]))
        rollout_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{sha[:8]}"
        logs = Path(os.environ.get("TRITONFLEET_LOG_DIR", ".tritonfleet/rollouts")) / rollout_id
        logs.mkdir(parents=True, exist_ok=True)
        report.log_dir = str(logs)
        journal = Journal(logs / JOURNAL)
        journal.write("start", mode="pull", inventory=inventory, deploy=deploy, origin=str(origin.root),
                      release=sha, limit=list(limit or []), canary=canary, batch=str(batch), max_fail=max_fail,
                      batches=batches, hosts=names, cwd=os.getcwd(), pid=os.getpid())
        echo(f"pull rollout of release {short(sha)} ({deploy}) to {len(names)} host(s) of {inventory} through "
             f"{origin.root}: {len(batches)} batch(es) {[len(b) for b in batches]}, canary {min(canary, len(names))}, "
             f"max {max_fail} failure(s), {wait:.0f} s a batch for the reports; journal in {logs}")
        reports = Reports(origin)
        run = _PullRun(origin, key, sha, rollout_id, report, journal, reports, echo, wait, poll, max_fail, canary)
        run.entries, run.ttl = entries, ttl
        try:
            run.before()
            if run.failures <= max_fail:
                run.batches(batches)
            else:
                report.halted = f"{run.failures} host(s) never reported (not converging themselves; max {max_fail})"
        except KeyboardInterrupt:
            report.halted = (f"interrupted (Ctrl-C) during {run.current or 'the start'}: the pointers published so far "
                             "stay; `tritonfleet status --pull ORIGIN` shows where each host is")
        report.seconds = time.monotonic() - t_start
        for r in report.hosts:
            if r.result == "not touched" and r.after == "-":
                r.after = r.before
        if report.halted:
            echo(f"HALTED: {report.halted}")
        journal.write("end", ok=report.ok, halted=report.halted,
                      results={r.host: asdict(r) for r in report.hosts if r.batch})
    return report


class _PullRun:
    def __init__(self, origin, key, sha, rollout_id, report, journal, reports, echo, wait, poll, max_fail, canary):
        self.origin, self.key, self.sha, self.rollout_id = origin, key, sha, rollout_id
        self.report, self.journal, self.reports, self.echo = report, journal, reports, echo
        self.wait, self.poll, self.max_fail, self.canary = wait, poll, max_fail, canary
        self.results = {r.host: r for r in report.hosts}
        self.was: dict[str, dict | None] = {}  # each host's own earlier pointer (release, host data)
        self.entries: dict[str, dict] = {}  # each host's data for the new release
        self.ttl: float | None = None
        self.unreachable: list[str] = []
        self.failures = 0
        self.current = ""

    def before(self) -> None:
        """Where every target is: its pointer's release and its last report. A host that never
        reported is not converging itself (no bootstrap, or gone): not touched, a failure."""
        for name, r in self.results.items():
            # what a host goes back to comes from the control machine's own pointer, never a report
            self.was[name], _ = pointer_release(self.origin.pointer(name))
            rep, why = self.reports.check(name)
            r.before = short((rep or {}).get("release"))
            if rep is None:
                r.result = "unreachable"
                r.detail = ("no report on the origin: not converging itself (bootstrap it)" if why == "no report"
                            else f"{why}: not counted")
                self.unreachable.append(name)
        self.failures = len(self.unreachable)
        self.journal.write("before", hosts={n: {"pointer": (self.was[n] or {}).get("release"),
                                                "report": self.reports.read(n)} for n in self.results})
        if self.unreachable:
            self.echo(f"never reported (not touched): {', '.join(self.unreachable)}")

    def batches(self, batches: list[list[str]]) -> None:
        for i, b in enumerate(batches, 1):
            todo = [n for n in b if n not in self.unreachable]
            if not todo:
                continue
            label = "canary" if i == 1 and self.canary else f"batch {i}/{len(batches)}"
            self.current = label
            t0 = time.monotonic()
            gen = publish_desired(self.origin, self.key, dict.fromkeys(todo, self.sha), self.rollout_id,
                                  {n: self.entries.get(n) for n in todo}, self.ttl)
            self.journal.write("batch", index=i, hosts=todo, generation=gen)
            self.echo(f"[{label}] release {short(self.sha)} published for {len(todo)} host(s); waiting for their reports")
            outcome = self.await_reports(todo, gen, self.sha)
            failed = {n: why for n, (ok, why, _) in outcome.items() if not ok}
            elapsed = time.monotonic() - t0
            for n in todo:
                r = self.results[n]
                r.batch, r.seconds = i, elapsed
                rep = outcome[n][2]
                r.after = short((rep or {}).get("release"))
                if n in failed:
                    r.result, r.detail = "failed", failed[n]
                    r.failure = (rep or {}).get("failure")
                else:
                    r.result = "updated" if (rep or {}).get("changed", 1) else "unchanged"
            if failed:
                self.echo(f"[{label}] failed: " + "; ".join(f"{n}: {w}" for n, w in failed.items()))
                self.roll_back(list(failed), i)
            self.failures += len(failed)
            self.journal.write("batch-done", index=i, failures=self.failures,
                               results={n: asdict(self.results[n]) for n in todo})
            self.echo(f"[{label}] done in {elapsed:.1f}s: " + ", ".join(f"{n} {self.results[n].result}" for n in todo))
            if self.failures > self.max_fail:
                left = sum(len([n for n in bb if n not in self.unreachable]) for bb in batches[i:])
                self.report.halted = (f"{self.failures} failure(s), more than --max-fail {self.max_fail}: halted after "
                                      f"{label}; {left} host(s) not touched")
                return

    def await_reports(self, hosts: list[str], generation: int, release: str) -> dict[str, tuple[bool, str, dict | None]]:
        """Each host's verdict once its report of ``generation`` (or a later one) is final: (ok,
        why not, the report); a host with no such report within the wait is failed."""
        pending, out = set(hosts), {}
        deadline = time.monotonic() + self.wait
        while pending:
            for n in sorted(pending):
                rep = self.reports.read(n)  # signed by the host and well formed, else None
                if not rep or (rep.get("generation") or 0) < generation or rep.get("result") not in RESULTS:
                    continue
                ok = rep["result"] == "ok" and rep.get("release") == release
                out[n] = (ok, "" if ok else describe(rep), rep)
                pending.discard(n)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        for n in pending:
            rep, why = self.reports.check(n)
            out[n] = (False, f"no report of release {short(release)} within {self.wait:.0f} s "
                             f"(last: {describe(rep, why)})", rep)
        return out

    def roll_back(self, failed: list[str], index: int) -> None:
        # back to the host's own earlier pointer: its release and its data (a rollout of new data
        # alone keeps the release id)
        back = {n: self.was[n]["release"] for n in failed
                if self.was.get(n) and is_release_id(self.was[n]["release"])
                and (self.was[n]["release"] != self.sha or self.was[n].get("host_data") != self.entries.get(n))}
        for n in failed:
            if n not in back:
                self.results[n].detail += " (no earlier release on the origin: nothing to roll back to)"
        if not back:
            return
        self.echo(f"rolling back {', '.join(back)} to the release each ran before")
        gen = publish_desired(self.origin, self.key, back, self.rollout_id,
                              {n: (self.was[n] or {}).get("host_data") for n in back}, self.ttl)
        self.journal.write("rollback", index=index, hosts=back, generation=gen)
        by_release: dict[str, list[str]] = {}
        for n, rel in back.items():
            by_release.setdefault(rel, []).append(n)
        for rel, names in by_release.items():
            for n, (ok, why, rep) in self.await_reports(names, gen, rel).items():
                r = self.results[n]
                r.after = short((rep or {}).get("release"))
                if ok:
                    r.result = "rolled back"
                else:
                    r.result, r.detail = "rollback failed", f"{r.detail}; rollback: {why}"


# --- status -------------------------------------------------------------------------------------

def status(hosts: list, origin: Origin, now: float | None = None) -> list[dict]:
    """Each host as its own signed report says (no SSH): the release it should run (its pointer),
    the one it ran last, the result, when; ``drift`` says what is not right (no report, an
    unsigned, forged or malformed one, an unreadable pointer, a failed run, a stale origin, not on
    its desired release, no run for longer than two converge intervals). Never raises for what a
    report or pointer holds."""
    now = time.time() if now is None else now
    reports = Reports(origin)
    rows = []
    for fh in hosts:
        got, why = reports.check(fh.name)
        rep = got or {}
        ptr, ptr_why = pointer_release(origin.pointer(fh.name))
        want = (ptr or {}).get("release")
        drift = []
        if ptr_why:
            drift.append(ptr_why)
        finished = rep.get("finished")
        stamp = parse_iso(finished)
        age = None if stamp is None else now - stamp
        if why == "no report":
            drift.append("no report (not converging itself: bootstrap it)")
        elif why:
            drift.append(why)
        elif rep.get("result") in ("failed", "refused"):
            drift.append(printable(f"last run {rep['result']}: {rep.get('error') or '?'}"))
        if rep.get("stale"):
            drift.append(printable(rep["stale"]))
        if rep and want and rep.get("release") != want and rep.get("result") != "running":
            drift.append(f"runs {short(rep.get('release'))}, should run {short(want)}")
        limit = 2 * float(fh.get("pull_converge_interval", DEFAULTS["pull_converge_interval"])) + \
            float(fh.get("pull_poll_interval", DEFAULTS["pull_poll_interval"]))
        if age is not None and age > limit:
            drift.append(f"no run for {age / 60:.0f} min (its timer stopped, or it cannot reach the origin)")
        rows.append({"host": fh.name, "desired": want, "release": rep.get("release"), "result": rep.get("result"),
                     "finished": finished, "age_seconds": None if age is None else round(age),
                     "generation": rep.get("generation"), "error": printable(rep.get("error") or ""), "drift": drift})
    return rows
