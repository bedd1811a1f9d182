"""The S3-compatible model origin store (``s3://bucket/prefix``: AWS S3, GCS through its
interoperability API, MinIO, Ceph, rclone's ``serve s3``), through boto3 on the control machine
and curl's SigV4 on a host that signs for itself."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ..core.errors import UsageError
from ..settings.access import Settings
from .origin_store import OBJECTS, Finding, Origin, OriginError, trimmed_url

#: what to do when boto3 is missing: the locked, hashed install of README (requirements-s3.lock)
BOTO3_MISSING = (
    "model_origin is an s3:// URL, but boto3 is not installed on this machine: install the locked "
    "S3 client from tritonfleet's checkout, "
    "`pip install --require-hashes --no-deps -r requirements-s3.lock` (README, Install)"
)


#: an S3 bucket name as S3 accepts it (AWS S3 user guide, "General purpose bucket naming rules"):
#: 3-63 lower-case letters, digits, dots and hyphens, a letter or digit at each end
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def bucket_problem(bucket: str) -> str | None:
    """Why S3 would refuse ``bucket`` as a bucket name (None: it would not)."""
    if not _BUCKET.match(bucket) or ".." in bucket or _IP.match(bucket):
        return (
            "its bucket name must be 3 to 63 lower-case letters, digits, dots or hyphens, a letter or digit at "
            "each end, not an IP address (S3's bucket naming rules)"
        )
    return None


class S3Store:
    """An S3-compatible bucket through boto3 (the control machine's own credentials: the
    environment, ~/.aws, or its instance role, as boto3 finds them)."""

    kind: ClassVar[str] = "s3"
    schemes: ClassVar[tuple[str, ...]] = ("s3",)
    shape: ClassVar[str] = "s3://bucket/prefix"

    @classmethod
    def url_problem(cls, url: str) -> str | None:
        return bucket_problem(urlsplit(url).netloc)

    @classmethod
    def login_in_clear(cls, user: Any, upload: Any) -> bool:
        return False  # no upload login: boto3's own credentials sign

    @classmethod
    def from_settings(cls, url: str, auth: str, expiry: int, settings: Settings) -> Origin:
        return Origin(
            cls.kind,
            url,
            auth,
            trimmed_url(settings.get("model_origin_endpoint")),
            settings.get("model_origin_region"),
            expiry,
            credentials_file=str(settings.get("model_origin_credentials_file")),
        )

    @classmethod
    def pull_problem(cls, origin: Origin) -> str | None:
        if origin.auth == "presigned":
            return (
                f"pull mode: the host fetches from the model origin {origin.url} itself, and only the control "
                "machine could sign its URLs: set model_origin_auth = 'host' (the host's own read-only "
                "credentials) or use an HTTP origin"
            )
        return None

    def findings(self) -> list[Finding]:
        import boto3

        if boto3.session.Session().get_credentials() is None:
            return [
                Finding(
                    True,
                    "this machine has no S3 credentials (boto3 found none)",
                    "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, write ~/.aws/credentials, or give "
                    "this machine an instance role that may read and write the bucket",
                    hosts=False,
                )
            ]
        if self.origin.auth == "host":
            return [
                Finding(
                    False,
                    "the hosts sign their own requests with the credentials in "
                    f"{self.origin.credentials_file}: not checked here (no SSH)",
                    "make sure every host has that file (a fetch names a missing one)",
                )
            ]
        return []

    def root_url(self) -> str | None:
        return None  # the listing of check() names a missing bucket

    def host_fetch_config(self) -> tuple[str, str] | None:
        """The host signs (``auth = "host"``) with its own credentials file: curl's SigV4."""
        return (self.origin.credentials_file, self.origin.region or "us-east-1") if self.origin.auth == "host" else None

    def __init__(self, origin: Origin):
        self.origin = origin
        try:
            import boto3
            from botocore.config import Config
        except ImportError as e:
            raise UsageError(BOTO3_MISSING) from e
        cfg = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path" if origin.endpoint else "auto"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=10,
            read_timeout=60,
        )
        self.client = boto3.client(
            "s3", endpoint_url=origin.endpoint, region_name=origin.region or "us-east-1", config=cfg
        )
        self._unsigned: Any = None  # boto3's client for plain URLs, made on first use

    def _errors(self):
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        return (BotoCoreError, ClientError, S3UploadFailedError, OSError)

    def _fail(self, doing: str, e: Exception) -> OriginError:
        return OriginError(
            f"model origin {self.origin.url}"
            f"{f' (endpoint {self.origin.endpoint})' if self.origin.endpoint else ''}: {doing} "
            f"failed: {e}"
        )

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
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.origin.bucket, Prefix=start):
                for item in page.get("Contents", []):
                    sha = item["Key"][len(start) :]
                    if sha in shas:
                        out[sha] = int(item["Size"])
        except self._errors() as e:
            raise self._fail("listing the objects", e) from e
        return out

    def put_file(self, path: Path, sha: str) -> None:
        from boto3.s3.transfer import TransferConfig

        try:
            self.client.upload_file(
                str(path),
                self.origin.bucket,
                self.origin.object_key(sha),
                Config=TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4),
            )
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
            self.client.put_object(Bucket=self.origin.bucket, Key=key, Body=data, ContentType="application/json")
        except self._errors() as e:
            raise self._fail(f"writing {key}", e) from e

    def urls(self, shas: list[str]) -> dict[str, str]:
        """{sha: URL a host fetches it from}: presigned (expiring) or plain (the host signs)."""
        if self.origin.auth == "presigned":
            return {
                s: self.client.generate_presigned_url(
                    "get_object",
                    Params={"Bucket": self.origin.bucket, "Key": self.origin.object_key(s)},
                    ExpiresIn=self.origin.expiry,
                )
                for s in shas
            }
        if self._unsigned is None:
            import boto3
            from botocore import UNSIGNED
            from botocore.config import Config

            self._unsigned = boto3.client(
                "s3",
                endpoint_url=self.origin.endpoint,
                region_name=self.origin.region or "us-east-1",
                config=Config(
                    signature_version=UNSIGNED, s3={"addressing_style": "path" if self.origin.endpoint else "auto"}
                ),
            )
        return {
            s: self._unsigned.generate_presigned_url(
                "get_object", Params={"Bucket": self.origin.bucket, "Key": self.origin.object_key(s)}
            )
            for s in shas
        }
