"""What every model origin store shares: the :class:`Origin` the tunables name, the layout of
objects and manifests at an origin, the :class:`OriginStore` protocol each store
(tritonfleet.model_repo.s3_store, tritonfleet.model_repo.http_store) follows, and its errors.
tritonfleet.model_repo.origin holds the table of stores (``STORES``) and does the publishing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit

from ..core.errors import TritonfleetError
from ..settings import origin_stores
from ..settings.access import Settings

AUTHS = ("presigned", "host")
OBJECTS = "objects/sha256"
RELEASES = "releases"
EMPTY = hashlib.sha256(b"").hexdigest()  # the object of every empty file


class OriginError(TritonfleetError):
    """The origin could not be read or written (unreachable, refused, not found)."""


@dataclass(frozen=True)
class Origin:
    """One origin, as the tunables name it (see :func:`from_settings`)."""

    kind: str  # its store's kind (STORES)
    url: str  # as configured: s3://bucket/prefix or http(s)://server/path
    auth: str = "presigned"
    endpoint: str | None = None  # S3 API endpoint (None: AWS)
    region: str | None = None
    expiry: int = 1800
    upload_url: str | None = None  # HTTP: where PUT goes (None: url)
    upload_user: str | None = None
    upload_password_env: str | None = None
    credentials_file: str = "/etc/tritonfleet/origin-credentials"

    @property
    def bucket(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def prefix(self) -> str:
        """The key prefix inside the bucket, '' or ending in '/'."""
        p = urlsplit(self.url).path.strip("/")
        return f"{p}/" if p else ""

    @property
    def base(self) -> str:
        """HTTP: the URL objects and manifests are below (no trailing slash)."""
        return self.url.rstrip("/")

    def object_key(self, sha: str) -> str:
        return f"{self.prefix}{OBJECTS}/{sha}"

    def manifest_key(self, release: str) -> str:
        return f"{self.prefix}{RELEASES}/{release}.json"


def trimmed_url(value: Any) -> str | None:
    return str(value).rstrip("/") if value else None


@dataclass(frozen=True)
class Finding:
    """What `tritonfleet check` says of an origin before asking it anything: ``fatal`` (a FAIL
    that ends its rows) or a note (a WARN); ``hosts``: the row names the hosts that use it."""

    fatal: bool
    what: str
    fix: str
    hosts: bool = True


class OriginStore(origin_stores.OriginKind, Protocol):
    """What every model origin store does (``STORES`` maps each URL scheme to one). Its URL rule
    and schemes (tritonfleet.settings.origin_stores.OriginKind) serve the settings check; the rest
    serves publishing, pre-flight, `tritonfleet check` and the host-side fetch."""

    schemes: ClassVar[tuple[str, ...]]

    def __init__(self, origin: Origin) -> None: ...

    @classmethod
    def from_settings(cls, url: str, auth: str, expiry: int, settings: Settings) -> Origin:
        """The :class:`Origin` of ``url`` with this kind's own tunables read from ``settings``."""
        ...

    @classmethod
    def pull_problem(cls, origin: Origin) -> str | None:
        """Why a pull-mode host (which only reads, and signs nothing here) cannot use ``origin``."""
        ...

    def check(self, write: bool = True) -> None:
        """The origin reads and (``write``) takes uploads; OriginError naming the fix."""
        ...

    def findings(self) -> list[Finding]:
        """What this machine can tell of the origin without asking it (credentials found)."""
        ...

    def root_url(self) -> str | None:
        """A URL that answers (HEAD) when model_origin's path exists, or None."""
        ...

    def sizes(self, shas: set[str]) -> dict[str, int]: ...

    def has(self, key: str) -> bool: ...

    def put_file(self, path: Path, sha: str) -> None: ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def urls(self, shas: list[str]) -> dict[str, str]: ...

    def host_fetch_config(self) -> tuple[str, str] | None:
        """(credentials file on the host, region) the host-side fetch signs with, or None: plain URLs."""
        ...
