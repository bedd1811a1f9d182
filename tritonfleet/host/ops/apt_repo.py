"""An apt source whose signing key is trusted only after its fingerprint is checked on the host:
``vendor_source`` installs a vendor repository of tritonfleet.host.vendor_repos (key, source, apt
update when either changes)."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import operation

from ...core.shell import q
from ...pyinfra_ext import memo
from ...pyinfra_ext.check import will_change
from .. import signing_keys
from ..facts import KeyringFingerprints
from ..signing_keys import normalize_fingerprint
from ..vendor_repos import VendorRepo, source_path
from . import aptlock, converged


def fetch_key_command(url: str, fingerprint: str, keyring: str) -> str:
    """Shell that downloads a key, refuses it unless it holds exactly one primary key, the pinned
    one (tritonfleet.host.signing_keys), then installs it (dearmored) as ``keyring`` after checking the keyring
    it made the same way. Nothing is trusted on a mismatch."""
    fpr = normalize_fingerprint(fingerprint)
    key, made = '"$t/key"', '"$t/keyring"'
    refuse = (
        f"not trusted ({signing_keys.RULE}). If the vendor rotated its key, check the new fingerprint "
        "against the vendor's documentation and set it in group data."
    )
    return (
        "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        f'curl -fsSL --retry 3 -o "$t/key" {q(url)}; '
        f"if ! {{ {signing_keys.trusted_shell(key, fpr)}; }}; then "
        f'echo {q(f"signing key at {url} has primary key(s) ")}"${{found:-none}}"{q(f", pinned {fpr}: " + refuse)} >&2; '
        "exit 1; fi; "
        "if head -c 5 \"$t/key\" | grep -q -- '-----'; then "
        'gpg --batch --yes --dearmor -o "$t/keyring" "$t/key"; '
        'else cp "$t/key" "$t/keyring"; fi; '
        f"if ! {{ {signing_keys.trusted_shell(made, fpr)}; }}; then "
        f'echo {q(f"the keyring made from the signing key at {url} holds primary key(s) ")}"${{found:-none}}"{q(f", pinned {fpr}: " + refuse)} >&2; '
        "exit 1; fi; "
        f'install -D -m 0644 "$t/keyring" {q(keyring)}'
    )


@operation()
def signed_key(url: str, fingerprint: str, keyring: str):
    """Install the key at ``url`` as ``keyring`` if it is missing or not the pinned key.

    + url: where the key is fetched (by the host)
    + fingerprint: the pinned fingerprint it must have
    + keyring: the keyring file it is installed as

    Changes: the keyring file, only when missing or not the pinned key.

    Tunables: none.

    **Example:**

    .. code:: python

        apt_repo.signed_key(name="CUDA repository key", url=KEY_URL, fingerprint=FPR,
                            keyring="/usr/share/keyrings/cuda-archive-keyring.gpg")
    """
    if signing_keys.trusted(memo.fact(KeyringFingerprints, path=keyring), fingerprint):
        host.noop(f"{keyring} holds the pinned key")
        return
    yield fetch_key_command(url, fingerprint, keyring)


def source_file(name: str, line: str):
    """/etc/apt/sources.list.d/<name>.list holding exactly ``line``."""
    return converged.put(
        name=f"apt source {name}",
        src=StringIO(line.rstrip() + "\n"),
        dest=source_path(name),
        mode="644",
    )


def vendor_source(repo: VendorRepo, also: list[tuple[str, str, str]] = ()) -> None:
    """``repo``'s signing key (fetched on the host, installed only with the pinned fingerprint)
    and its apt source; ``also``: more apt source files that come with it, as (operation name,
    path, text). apt's package lists are updated when any of them will change, and only then."""
    key = signed_key(name=repo.key_name, url=repo.key_url, fingerprint=repo.fingerprint, keyring=repo.keyring)
    src = source_file(repo.source, repo.line)
    extra = [converged.put(name=name, src=StringIO(text), dest=path, mode="644") for name, path, text in also]
    if will_change(key, src, *extra):
        aptlock.update(name=f"apt update ({repo.what} changed)", source=repo.url)
