"""The table of model origin stores, by URL scheme: the one place a kind of origin is named.

Each store (tritonfleet.model_repo.origin: ``S3Store``, ``HttpStore``) declares its schemes, the
shape of its URL for messages and its URL rule; ``tritonfleet.model_repo.origin`` puts them into
:data:`STORES` when it is imported. The table sits in the settings layer so that the settings
check (``model_origin``, checked at load) reads the allowed schemes and each store's URL rule
from it without importing the model repository: one rule, written once, in the store. The
modules that run the settings check (tritonfleet.inventory.roster, tritonfleet.preflight) import
tritonfleet.model_repo.origin, so the table is full wherever a check runs.

Adding a store: its class (the :class:`OriginKind` part here, the rest in
tritonfleet.model_repo.origin's ``OriginStore``) and one line in ``STORES`` per scheme.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit


class OriginKind(Protocol):
    """What the settings check needs of a model origin store."""

    kind: ClassVar[str]  # its name, as Origin.kind holds it ("s3", "http")
    shape: ClassVar[str]  # its URL as messages show it: "s3://bucket/prefix"

    @classmethod
    def url_problem(cls, url: str) -> str | None:
        """Why ``url`` (of this store's scheme, with a server part, URL_SAFE) is not an origin of
        this kind, in the words that follow "must be <a URL>: " (None: it is)."""
        ...

    @classmethod
    def login_in_clear(cls, user: Any, upload: Any) -> bool:
        """Whether an upload login ``user`` to ``upload`` would cross the network in clear."""
        ...


#: URL scheme -> store (filled by tritonfleet.model_repo.origin)
STORES: dict[str, Any] = {}


def store_of(url: Any) -> Any:
    """The store ``url``'s scheme names (None: no store, or no URL)."""
    return STORES.get(urlsplit(url).scheme) if isinstance(url, str) else None


def schemes() -> tuple[str, ...]:
    return tuple(STORES)


def shapes() -> str:
    """Every kind's URL shape, for "is neither ... nor ..." (in the table's order, once each)."""
    seen = list(dict.fromkeys(s.shape for s in STORES.values()))
    return " nor ".join(seen) if len(seen) <= 2 else ", ".join(seen[:-1]) + " nor " + seen[-1]


def login_problem(data: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(tunable, URL) where an upload login would cross the network in clear, or None."""
    user = data.get("model_origin_upload_user")
    upload = data.get("model_origin_upload_url") or data.get("model_origin")
    store = store_of(data.get("model_origin"))
    if store is not None and store.login_in_clear(user, upload):
        return ("model_origin_upload_url" if data.get("model_origin_upload_url") else "model_origin"), upload
    return None
