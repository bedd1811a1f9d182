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

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import UsageError
from ..settings import origin_stores
from ..settings.access import Settings

# URL_SAFE: characters a URL of ours may hold: the host-side fetch writes URLs into curl's config
# file in double quotes, where a quote, a backslash or white space would change its meaning (the
# settings check refuses a tunable's URL by the same rule)
from ..settings.rules import URL_SAFE
from ..settings.rules import url as url_rule
from .http_store import HttpStore
from .origin_store import AUTHS, EMPTY, OBJECTS, RELEASES, Finding, Origin, OriginError, OriginStore
from .s3_store import S3Store

__all__ = [
    "AUTHS",
    "EMPTY",
    "OBJECTS",
    "RELEASES",
    "STORES",
    "Finding",
    "HttpStore",
    "Origin",
    "OriginError",
    "OriginStore",
    "S3Store",
    "check",
    "from_settings",
    "publish",
    "published",
    "store",
    "store_for",
    "urls",
]

GROUP_DATA = "inventories/group_data"
# set by tritonfleet.fleet.converge for the deploy a pull-mode host runs on itself
PULL_HOST_ENV = "TRITONFLEET_PULL_HOST_DATA"
# model_origin_endpoint and model_origin_upload_url: the settings check's rule for them
_HTTP_URL = url_rule("http", "https")


def from_settings(settings: Settings) -> Origin | None:
    """The origin a host's ``settings`` name (None: releases are pushed over SSH): the store its
    URL's scheme names in :data:`STORES`, which reads its own tunables. UsageError, naming the
    tunable and where to set it, for a value that cannot work."""
    url = settings.get("model_origin")
    if not url:
        return None
    url = str(url)
    kind = origin_stores.store_of(url)
    where = f"({GROUP_DATA}/all.py or the inventory)"
    if kind is None or not urlsplit(url).netloc:
        raise UsageError(f"model_origin {url!r} is neither {origin_stores.shapes()} {where}")
    if not URL_SAFE.match(url):
        raise UsageError(f"model_origin {url!r} holds white space, a quote or a backslash: percent-encode them {where}")
    auth = str(settings.get("model_origin_auth"))
    if auth not in AUTHS:
        raise UsageError(f"model_origin_auth must be one of {', '.join(AUTHS)}, not {auth!r} {where}")
    try:
        expiry = int(settings.get("model_origin_url_expiry"))
    except (TypeError, ValueError):
        expiry = 0
    if not 60 <= expiry <= 7 * 24 * 3600:
        raise UsageError(
            f"model_origin_url_expiry must be seconds between 60 and 604800 (S3's limit for a "
            f"presigned URL), not {settings.get('model_origin_url_expiry')!r} {where}"
        )
    endpoint = settings.get("model_origin_endpoint")
    upload = settings.get("model_origin_upload_url")
    for name, value in (("model_origin_endpoint", endpoint), ("model_origin_upload_url", upload)):
        if value and _HTTP_URL.problem(str(value)):
            raise UsageError(f"{name} {value!r} must be an http(s):// URL {where}")
    user = settings.get("model_origin_upload_user")
    if kind.login_in_clear(user, upload or url):
        raise UsageError(
            f"model_origin_upload_user {user!r} would send its password in clear to {upload or url}: "
            "upload over https:// (model_origin_upload_url), or upload without a login on a network "
            f"that is the origin's own {where}"
        )
    why = kind.url_problem(url)
    if why:
        raise UsageError(f"model_origin {url!r} must be {kind.shape}: {why} {where}")
    return kind.from_settings(url, auth, expiry, settings)


#: URL scheme -> store: adding a kind of origin is its store class and its lines here. The table
#: is tritonfleet.settings.origin_stores.STORES, where the settings check reads the schemes and
#: each store's URL rule.
STORES = origin_stores.STORES
STORES.update({"s3": S3Store, "http": HttpStore, "https": HttpStore})


def store_class(origin: Origin) -> Any:
    """The store of ``origin``'s URL scheme (UsageError: no store has it)."""
    kind = origin_stores.store_of(origin.url)
    if kind is None:
        raise UsageError(
            f"model origin {origin.url}: no store reads {urlsplit(origin.url).scheme}:// URLs "
            f"(model_origin is {origin_stores.shapes()})"
        )
    return kind


def store(origin: Origin) -> Any:
    return store_class(origin)(origin)


_stores: dict[Origin, Any] = {}
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
        return (
            f"origin has release {self.release}: {self.uploaded} of {self.objects} objects uploaded "
            f"({self.uploaded_bytes / 1e6:.1f} MB) in {self.seconds:.1f}s"
            + (f"; {len(self.replaced)} had the wrong size there and were replaced" if self.replaced else "")
        )


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
        raise OriginError(
            f"model origin {origin.url}: model release {release} is not there ({key}): in pull mode "
            "the control machine publishes it with the repository release (`tritonfleet pull publish` "
            "or `tritonfleet pull rollout`, with this host in the inventory), and the host only reads it"
        )
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
        raise OriginError(
            f"model origin {origin.url}: a URL holds characters the host-side fetch cannot pass to curl: {bad[0][:120]}"
        )
    return out
