"""The plain HTTP(S) model origin store (``https://server/path``: nginx in an air-gapped site;
the control machine uploads with HTTP PUT, which nginx's ``dav_methods PUT`` accepts)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ..core.errors import UsageError
from ..settings.access import Settings
from .origin_store import EMPTY, OBJECTS, Finding, Origin, OriginError, trimmed_url


def _read_fix(status: int, wrote: bool) -> str:
    if status == 404:
        return "nothing at that path: model_origin's path is not where the server keeps the objects " + (
            "(or model_origin_upload_url writes elsewhere)"
            if wrote
            else "(or no release was published there yet: `tritonfleet pull publish`)"
        )
    if status in (401, 403):
        return (
            "the server refuses to read it: the hosts fetch with plain URLs and no login, so allow GET and "
            "HEAD there for the hosts and this machine (the site's network decides who may)"
        )
    if status >= 500:
        return "the server failed: see its error log"
    return "expected 200: model_origin must be the URL the objects are read from"


def _write_fix(status: int, origin: Origin) -> str:
    if status in (401, 403):
        return (
            "the server refuses the upload: check model_origin_upload_user and "
            f"${origin.upload_password_env}, or the server's access rules for PUT"
        )
    if status in (404, 405, 409, 501):
        return "the server does not accept PUT there: nginx `dav_methods PUT; create_full_put_path on;`"
    if status >= 500:
        return "the server failed: see its error log"
    return "expected 200, 201 or 204"


class HttpStore:
    """A plain HTTP(S) server: objects read with GET (HEAD to see what it has), written with PUT
    (nginx: ``dav_methods PUT; create_full_put_path on;`` on the upload location)."""

    kind: ClassVar[str] = "http"
    schemes: ClassVar[tuple[str, ...]] = ("http", "https")
    shape: ClassVar[str] = "http(s)://server/path"

    @classmethod
    def url_problem(cls, url: str) -> str | None:
        return None

    @classmethod
    def login_in_clear(cls, user: Any, upload: Any) -> bool:
        """HTTP basic auth over plain http:// sends the password in clear to anyone on the path."""
        return bool(user) and isinstance(upload, str) and urlsplit(upload).scheme == "http"

    @classmethod
    def from_settings(cls, url: str, auth: str, expiry: int, settings: Settings) -> Origin:
        # a plain HTTP server has no signed URLs: the site's network grants access (no .netrc is read)
        return Origin(
            cls.kind,
            url,
            "host",
            expiry=expiry,
            upload_url=trimmed_url(settings.get("model_origin_upload_url")),
            upload_user=settings.get("model_origin_upload_user"),
            upload_password_env=settings.get("model_origin_upload_password_env"),
            credentials_file=str(settings.get("model_origin_credentials_file")),
        )

    @classmethod
    def pull_problem(cls, origin: Origin) -> str | None:
        return None

    def findings(self) -> list[Finding]:
        return []

    def root_url(self) -> str | None:
        """A typo in the path shows here first: the upload probe would only say PUT is refused there."""
        return f"{self.origin.base}/"

    def host_fetch_config(self) -> tuple[str, str] | None:
        return None  # plain URLs, no login

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
                raise UsageError(
                    f"model_origin_upload_user is {self.origin.upload_user!r} but "
                    f"${self.origin.upload_password_env} is empty on the control machine: export the "
                    "upload password there (model_origin_upload_password_env names the variable)"
                )
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
            raise self._fail(
                f"PUT {url}",
                f"HTTP {r.status_code} {r.text[:200]!r} (the server must accept "
                "PUT there: nginx `dav_methods PUT; create_full_put_path on;`)",
            )

    def put_file(self, path: Path, sha: str) -> None:
        with open(path, "rb") as f:
            self._put(self._object(self.upload, sha), f)

    def _below(self, key: str) -> str:
        """An origin key (which starts with the URL's path, as an S3 key starts with the prefix)
        relative to the origin's URL."""
        return key[len(self.origin.prefix) :] if key.startswith(self.origin.prefix) else key

    def put_bytes(self, key: str, data: bytes) -> None:
        self._put(f"{self.upload}/{self._below(key)}", data)

    def urls(self, shas: list[str]) -> dict[str, str]:
        return {s: self._object(self.origin.base, s) for s in shas}
