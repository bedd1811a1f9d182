"""The model origin, control side: where hosts fetch a release's contents from, instead of the
control machine sending every byte over SSH.

An origin is an S3-compatible bucket and prefix (``s3://bucket/prefix``: AWS S3, GCS through its
interoperability API, MinIO, Ceph, rclone's ``serve s3``; the control machine's client is boto3)
or a plain HTTP(S) server (``https://server/path``: nginx in an air-gapped site; the control
machine uploads with HTTP PUT, which nginx's ``dav_methods PUT`` accepts). Either holds::

    <prefix>/objects/sha256/<hex>        every file's content, named by its SHA-256 (immutable)
    <prefix>/releases/<release id>.json  the release manifest (the host's marker text: every
                                         path, size and sha256)

The control machine uploads only the objects the origin lacks (a listing, or a HEAD per object,
compared by name and size) and then the manifest; hosts fetch only the objects their release
cache lacks (tritonfleet.model_repo.release decides which, tritonfleet.model_repo.fetch fetches and
verifies them). Credentials stay on the control machine where the operator wants that
(``model_origin_auth = "presigned"``: each host gets URLs signed here that expire after
``model_origin_url_expiry`` seconds) or are the host's own (``"host"``: plain URLs for an HTTP
origin, signed on the host with the credentials in ``model_origin_credentials_file`` for S3).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import TritonfleetError, UsageError
from ..settings.access import Settings

# URL_SAFE: characters a URL of ours may hold: the host-side fetch writes URLs into curl's config
# file in double quotes, where a quote, a backslash or white space would change its meaning (the
# settings check refuses a tunable's URL by the same rule)
from ..settings.rules import URL_SAFE

KINDS = ("s3", "http")
AUTHS = ("presigned", "host")
OBJECTS = "objects/sha256"
RELEASES = "releases"
GROUP_DATA = "inventories/group_data"
# set by tritonfleet.fleet.converge for the deploy a pull-mode host runs on itself
PULL_HOST_ENV = "TRITONFLEET_PULL_HOST_DATA"
EMPTY = hashlib.sha256(b"").hexdigest()  # the object of every empty file


#: what to do when boto3 is missing: the locked, hashed install of README (requirements-s3.lock)
BOTO3_MISSING = ("model_origin is an s3:// URL, but boto3 is not installed on this machine: install the locked "
                 "S3 client from tritonfleet's checkout, "
                 "`pip install --require-hashes --no-deps -r requirements-s3.lock` (README, Install)")


class OriginError(TritonfleetError):
    """The origin could not be read or written (unreachable, refused, not found)."""


@dataclass(frozen=True)
class Origin:
    """One origin, as the tunables name it (see :func:`from_settings`)."""

    kind: str  # "s3" | "http"
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


def from_settings(settings: Settings) -> Origin | None:
    """The origin a host's ``settings`` name (None: releases are pushed over SSH).
    UsageError, naming the tunable and where to set it, for a value that cannot work."""
    url = settings.get("model_origin")
    if not url:
        return None
    url = str(url)
    scheme = urlsplit(url).scheme
    kind = "s3" if scheme == "s3" else "http" if scheme in ("http", "https") else None
    where = f"({GROUP_DATA}/all.py or the inventory)"
    if kind is None or not urlsplit(url).netloc:
        raise UsageError(f"model_origin {url!r} is neither s3://bucket/prefix nor http(s)://server/path {where}")
    if not URL_SAFE.match(url):
        raise UsageError(f"model_origin {url!r} holds white space, a quote or a backslash: percent-encode them {where}")
    auth = str(settings.get("model_origin_auth"))
    if auth not in AUTHS:
        raise UsageError(f"model_origin_auth must be one of {', '.join(AUTHS)}, not {auth!r} {where}")
    if kind == "http" and auth == "presigned":
        auth = "host"  # a plain HTTP server has no signed URLs: the site's network grants access (no .netrc is read)
    try:
        expiry = int(settings.get("model_origin_url_expiry"))
    except (TypeError, ValueError):
        expiry = 0
    if not 60 <= expiry <= 7 * 24 * 3600:
        raise UsageError(f"model_origin_url_expiry must be seconds between 60 and 604800 (S3's limit for a "
                         f"presigned URL), not {settings.get('model_origin_url_expiry')!r} {where}")
    endpoint = settings.get("model_origin_endpoint")
    upload = settings.get("model_origin_upload_url")
    for name, value in (("model_origin_endpoint", endpoint), ("model_origin_upload_url", upload)):
        if value and (urlsplit(str(value)).scheme not in ("http", "https") or not URL_SAFE.match(str(value))):
            raise UsageError(f"{name} {value!r} must be an http(s):// URL {where}")
    user = settings.get("model_origin_upload_user")
    why = clear_text_login(kind, user, upload or url)
    if why:
        raise UsageError(f"{why} {where}")
    return Origin(kind, url, auth, str(endpoint).rstrip("/") if endpoint else None,
                  settings.get("model_origin_region"), expiry, str(upload).rstrip("/") if upload else None,
                  user, settings.get("model_origin_upload_password_env"),
                  str(settings.get("model_origin_credentials_file")))


def clear_text_login(kind: str | None, user, upload) -> str | None:
    """Why an upload login cannot be used (HTTP basic auth over plain http:// sends the password
    in clear to anyone on the path), or None."""
    if kind == "http" and user and urlsplit(str(upload)).scheme == "http":
        return (f"model_origin_upload_user {user!r} would send its password in clear to {upload}: upload over "
                "https:// (model_origin_upload_url), or upload without a login on a network that is the "
                "origin's own")
    return None


# --------------------------------------------------------------------------- stores

class S3Store:
    """An S3-compatible bucket through boto3 (the control machine's own credentials: the
    environment, ~/.aws, or its instance role, as boto3 finds them)."""

    def __init__(self, origin: Origin):
        self.origin = origin
        try:
            import boto3
            from botocore.config import Config
        except ImportError as e:
            raise UsageError(BOTO3_MISSING) from e
        cfg = Config(signature_version="s3v4", s3={"addressing_style": "path" if origin.endpoint else "auto"},
                     retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=60)
        self.client = boto3.client("s3", endpoint_url=origin.endpoint, region_name=origin.region or "us-east-1",
                                   config=cfg)
        self._unsigned: Any = None  # boto3's client for plain URLs, made on first use

    def _errors(self):
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        return (BotoCoreError, ClientError, S3UploadFailedError, OSError)

    def _fail(self, doing: str, e: Exception) -> OriginError:
        return OriginError(f"model origin {self.origin.url}"
                           f"{f' (endpoint {self.origin.endpoint})' if self.origin.endpoint else ''}: {doing} "
                           f"failed: {e}")

    def check(self, write: bool = True) -> None:
        """One listing (the control machine's credentials read the bucket; an upload it is
        refused shows at publishing, where nothing is left half-written: the manifest goes last)."""
        try:
            self.client.list_objects_v2(Bucket=self.origin.bucket, Prefix=self.origin.prefix, MaxKeys=1)
        except self._errors() as e:
            raise self._fail("listing the bucket", e) from e

    def sizes(self, shas: set[str]) -> dict[str, int]:
        """{sha: size} of the objects the origin holds (one listing of the prefix)."""
        out: dict[str, int] = {}
        start = f"{self.origin.prefix}{OBJECTS}/"
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.origin.bucket,
                                                                              Prefix=start):
                for item in page.get("Contents", []):
                    sha = item["Key"][len(start):]
                    if sha in shas:
                        out[sha] = int(item["Size"])
        except self._errors() as e:
            raise self._fail("listing the objects", e) from e
        return out

    def put_file(self, path: Path, sha: str) -> None:
        from boto3.s3.transfer import TransferConfig

        try:
            self.client.upload_file(str(path), self.origin.bucket, self.origin.object_key(sha),
                                    Config=TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20,
                                                          max_concurrency=4))
        except self._errors() as e:
            raise self._fail(f"uploading {path}", e) from e

    def has(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.origin.bucket, Key=key)
            return True
        except self._errors() as e:
            if getattr(e, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail(f"reading {key}", e) from e

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.origin.bucket, Key=key, Body=data,
                                   ContentType="application/json")
        except self._errors() as e:
            raise self._fail(f"writing {key}", e) from e

    def urls(self, shas: list[str]) -> dict[str, str]:
        """{sha: URL a host fetches it from}: presigned (expiring) or plain (the host signs)."""
        if self.origin.auth == "presigned":
            return {s: self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.origin.bucket, "Key": self.origin.object_key(s)},
                ExpiresIn=self.origin.expiry) for s in shas}
        if self._unsigned is None:
            import boto3
            from botocore import UNSIGNED
            from botocore.config import Config

            self._unsigned = boto3.client(
                "s3", endpoint_url=self.origin.endpoint, region_name=self.origin.region or "us-east-1",
                config=Config(signature_version=UNSIGNED,
                              s3={"addressing_style": "path" if self.origin.endpoint else "auto"}))
        return {s: self._unsigned.generate_presigned_url(
            "get_object", Params={"Bucket": self.origin.bucket, "Key": self.origin.object_key(s)})
            for s in shas}


def _read_fix(status: int, wrote: bool) -> str:
    if status == 404:
        return ("nothing at that path: model_origin's path is not where the server keeps the objects "
                + ("(or model_origin_upload_url writes elsewhere)" if wrote else
                   "(or no release was published there yet: `tritonfleet pull publish`)"))
    if status in (401, 403):
        return ("the server refuses to read it: the hosts fetch with plain URLs and no login, so allow GET and "
                "HEAD there for the hosts and this machine (the site's network decides who may)")
    if status >= 500:
        return "the server failed: see its error log"
    return "expected 200: model_origin must be the URL the objects are read from"


def _write_fix(status: int, origin: Origin) -> str:
    if status in (401, 403):
        return ("the server refuses the upload: check model_origin_upload_user and "
                f"${origin.upload_password_env}, or the server's access rules for PUT")
    if status in (404, 405, 409, 501):
        return "the server does not accept PUT there: nginx `dav_methods PUT; create_full_put_path on;`"
    if status >= 500:
        return "the server failed: see its error log"
    return "expected 200, 201 or 204"


class HttpStore:
    """A plain HTTP(S) server: objects read with GET (HEAD to see what it has), written with PUT
    (nginx: ``dav_methods PUT; create_full_put_path on;`` on the upload location)."""

    def __init__(self, origin: Origin):
        import requests

        self.origin = origin
        self.session = requests.Session()
        self.session.trust_env = False  # no proxy variables: the origin is addressed as configured
        self.upload = origin.upload_url or origin.base
        self._auth: tuple[str, str] | None = None

    @property
    def auth(self) -> tuple[str, str] | None:
        """The upload login, read from the environment when this machine first uploads (a
        pull-mode host only reads, and holds no upload password)."""
        if self.origin.upload_user and self._auth is None:
            secret = os.environ.get(self.origin.upload_password_env or "")
            if not secret:
                raise UsageError(f"model_origin_upload_user is {self.origin.upload_user!r} but "
                                 f"${self.origin.upload_password_env} is empty on the control machine: export the "
                                 "upload password there (model_origin_upload_password_env names the variable)")
            self._auth = (self.origin.upload_user, secret)
        return self._auth

    def has(self, key: str) -> bool:
        """Whether the origin holds ``key`` (a HEAD where the hosts read); OriginError for an answer
        that is neither 200 nor 404."""
        import requests

        url = f"{self.origin.base}/{self._below(key)}"
        try:
            r = self.session.head(url, timeout=30)
        except requests.RequestException as e:
            raise self._fail(f"HEAD {url}", e) from e
        if r.status_code in (200, 404):
            return r.status_code == 200
        raise self._fail(f"HEAD {url}", f"HTTP {r.status_code}: {_read_fix(r.status_code, False)}")

    def _fail(self, doing: str, e) -> OriginError:
        return OriginError(f"model origin {self.origin.url}: {doing} failed: {e}")

    def _object(self, base: str, sha: str) -> str:
        return f"{base}/{OBJECTS}/{sha}"

    def check(self, write: bool = True) -> None:
        """The origin reads and (``write``) accepts uploads. Writing: the empty object is PUT
        (content-addressed, so it is what the origin holds for every empty file; nothing else is
        left there), then read back with HEAD where the hosts read. Reading only: HEAD of the
        empty object, which every publish puts there. OriginError naming the status and the fix."""
        import requests

        target = self._object(self.origin.base, EMPTY)
        try:
            if write:
                put = self._object(self.upload, EMPTY)
                r = self.session.put(put, data=b"", auth=self.auth, timeout=10)
                if r.status_code not in (200, 201, 204):
                    raise self._fail(f"PUT {put}", f"HTTP {r.status_code}: {_write_fix(r.status_code, self.origin)}")
            r = self.session.head(target, timeout=10)
        except requests.RequestException as e:
            raise self._fail("connecting", e) from e
        if r.status_code != 200:
            raise self._fail(f"HEAD {target}", f"HTTP {r.status_code}: {_read_fix(r.status_code, write)}")

    def sizes(self, shas: set[str]) -> dict[str, int]:
        import requests

        def size(sha: str) -> tuple[str, int | None]:
            r = self.session.head(self._object(self.origin.base, sha), timeout=30)
            if r.status_code == 200:
                return sha, int(r.headers.get("Content-Length", -1))
            if r.status_code in (403, 404, 410):
                return sha, None
            raise self._fail(f"HEAD of object {sha}", f"HTTP {r.status_code}")

        try:
            with ThreadPoolExecutor(8) as pool:
                found = list(pool.map(size, sorted(shas)))
        except requests.RequestException as e:
            raise self._fail("reading what it holds", e) from e
        return {s: n for s, n in found if n is not None}

    def _put(self, url: str, body) -> None:
        import requests

        try:
            r = self.session.put(url, data=body, auth=self.auth, timeout=(10, 600))
        except requests.RequestException as e:
            raise self._fail(f"PUT {url}", e) from e
        if r.status_code not in (200, 201, 204):
            raise self._fail(f"PUT {url}", f"HTTP {r.status_code} {r.text[:200]!r} (the server must accept "
                                          "PUT there: nginx `dav_methods PUT; create_full_put_path on;`)")

    def put_file(self, path: Path, sha: str) -> None:
        with open(path, "rb") as f:
            self._put(self._object(self.upload, sha), f)

    def _below(self, key: str) -> str:
        """An origin key (which starts with the URL's path, as an S3 key starts with the prefix)
        relative to the origin's URL."""
        return key[len(self.origin.prefix):] if key.startswith(self.origin.prefix) else key

    def put_bytes(self, key: str, data: bytes) -> None:
        self._put(f"{self.upload}/{self._below(key)}", data)

    def urls(self, shas: list[str]) -> dict[str, str]:
        return {s: self._object(self.origin.base, s) for s in shas}


def store(origin: Origin):
    return S3Store(origin) if origin.kind == "s3" else HttpStore(origin)


_stores: dict[Origin, object] = {}
_lock = threading.Lock()


def store_for(origin: Origin):
    """One store (one client, one connection pool) per origin per run."""
    with _lock:
        if origin not in _stores:
            _stores[origin] = store(origin)
        return _stores[origin]


# --------------------------------------------------------------------------- publishing

@dataclass
class Published:
    release: str
    objects: int  # distinct objects the release has
    uploaded: int = 0
    uploaded_bytes: int = 0
    seconds: float = 0.0
    replaced: list[str] = field(default_factory=list)  # at the origin with the wrong size: uploaded again

    def __str__(self) -> str:
        return (f"origin has release {self.release}: {self.uploaded} of {self.objects} objects uploaded "
                f"({self.uploaded_bytes / 1e6:.1f} MB) in {self.seconds:.1f}s"
                + (f"; {len(self.replaced)} had the wrong size there and were replaced" if self.replaced else ""))


def objects_of(manifest: dict[str, list]) -> dict[str, tuple[int, str]]:
    """{sha: (size, first path holding it)} of a release manifest's files (empty directories
    have no object)."""
    out: dict[str, tuple[int, str]] = {}
    for path, (size, sha) in sorted(manifest.items()):
        if not path.endswith("/"):
            out.setdefault(sha, (int(size), path))
    return out


def missing(wanted: dict[str, tuple[int, str]], have: dict[str, int]) -> list[str]:
    """The objects to upload: absent at the origin, or there with another size (a cut upload
    through a server that does not write atomically)."""
    return sorted(s for s, (size, _) in wanted.items() if have.get(s) != size)


_published: dict[tuple[Origin, str], Published] = {}
_publish_lock = threading.Lock()


def publish(origin: Origin, root: Path, manifest: dict[str, list], release: str) -> Published:
    """Make the origin hold every object of ``release`` (the repository at ``root``) and its
    manifest; uploads only what it lacks. Once per origin and release per run (every host of a
    class asks for the same release). OriginError when it cannot."""
    from .release import marker_text

    key = (origin, release)
    with _publish_lock:  # hosts run concurrently: the first uploads, the others wait for it
        if key in _published:
            return _published[key]
        t0 = time.monotonic()
        st = store_for(origin)
        wanted = objects_of(manifest)
        have = st.sizes(set(wanted))
        todo = missing(wanted, have)
        result = Published(release, len(wanted), replaced=[s for s in todo if s in have])
        for sha in todo:
            size, path = wanted[sha]
            st.put_file(Path(root) / path, sha)
            result.uploaded += 1
            result.uploaded_bytes += size
        st.put_bytes(origin.manifest_key(release), marker_text(release, manifest).encode())
        result.seconds = time.monotonic() - t0
        _published[key] = result
        return result


def published(origin: Origin, manifest: dict[str, list], release: str) -> Published:
    """Where this run does not publish (a pull-mode host): the release's manifest must be at the
    origin already (the control machine put it there at `tritonfleet pull publish`, after every
    object). Reads only; OriginError naming the fix when it is not there."""
    key = origin.manifest_key(release)
    if not store_for(origin).has(key):
        raise OriginError(f"model origin {origin.url}: model release {release} is not there ({key}): in pull mode "
                          "the control machine publishes it with the repository release (`tritonfleet pull publish` "
                          "or `tritonfleet pull rollout`, with this host in the inventory), and the host only reads it")
    return Published(release, len(objects_of(manifest)))


_checked: dict[Origin, OriginError | None] = {}


def publishes_here() -> bool:
    """Whether this run uploads releases to the origin: not on a pull-mode host, which only reads
    it (the control machine published at `tritonfleet pull publish`)."""
    return not os.environ.get(PULL_HOST_ENV)


def check(origin: Origin) -> None:
    """One cheap request to the origin (once per run): OriginError, naming the status and the fix,
    when it does not read (or, where this run publishes, does not accept uploads)."""
    with _publish_lock:
        if origin not in _checked:
            try:
                store_for(origin).check(write=publishes_here())
                _checked[origin] = None
            except OriginError as e:
                _checked[origin] = e
    if _checked[origin] is not None:
        raise _checked[origin]


def urls(origin: Origin, shas: list[str]) -> dict[str, str]:
    """{sha: URL} a host fetches each object from (presigned now when the origin signs)."""
    out = store_for(origin).urls(sorted(set(shas)))
    bad = [u for u in out.values() if not URL_SAFE.match(u)]
    if bad:
        raise OriginError(f"model origin {origin.url}: a URL holds characters the host-side fetch cannot pass "
                          f"to curl: {bad[0][:120]}")
    return out

