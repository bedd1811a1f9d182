"""Pull mode's origin: what the control side and the hosts share (the origin's file names, the
signature namespaces, release ids, the times reports and pointers carry), writing a file so that
a server never serves it half-written, and the origin directory itself (``PullSite``)."""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ...core.errors import TritonfleetError, UsageError

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


class PullSite:
    """The origin directory (``root``) and the URL the hosts reach it at (``url``)."""

    def __init__(self, root: str | os.PathLike, url: str = ""):
        if URL_LIKE.match(str(root)):  # Path() would fold its '//' into '/'
            raise UsageError(
                f"origin {root} is an address: give the origin directory this machine writes (the one "
                "served at that address to the hosts), e.g. /srv/tritonfleet-origin"
            )
        self.root = Path(root)
        self.url = url.rstrip("/")
        if not self.root.is_dir():
            raise UsageError(
                f"origin {self.root} is not a directory: create it, and serve it to the hosts "
                "over HTTP(S) (docs/fleet-operations.md, Pull mode)"
            )

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
                raise PullError(
                    f"origin {self.root} is being published by another run ({f.read().strip() or '?'}): let it finish"
                ) from None
            f.seek(0)
            f.truncate()
            f.write(f"{what}, pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            f.flush()
            try:
                yield
            finally:
                f.truncate(0)
