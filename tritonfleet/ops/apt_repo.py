"""An apt source whose signing key is trusted only after its fingerprint is checked on the host."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import File

from .. import keys
from ..facts import memo
from ..facts.host import KeyringFingerprints
from ..keys import normalize_fingerprint  # noqa: F401 - imported from here elsewhere
from ..shell import q
from . import converged


def fetch_key_command(url: str, fingerprint: str, keyring: str) -> str:
    """Shell that downloads a key, refuses it unless it holds exactly one primary key, the pinned
    one (tritonfleet.keys), then installs it (dearmored) as ``keyring`` after checking the keyring
    it made the same way. Nothing is trusted on a mismatch."""
    fpr = normalize_fingerprint(fingerprint)
    key, made = '"$t/key"', '"$t/keyring"'
    refuse = (f"not trusted ({keys.RULE}). If the vendor rotated its key, check the new fingerprint "
              "against the vendor's documentation and set it in group data.")
    return (
        "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        f"curl -fsSL --retry 3 -o \"$t/key\" {q(url)}; "
        f"if ! {{ {keys.trusted_shell(key, fpr)}; }}; then "
        f"echo {q(f'signing key at {url} has primary key(s) ')}\"${{found:-none}}\"{q(f', pinned {fpr}: ' + refuse)} >&2; "
        "exit 1; fi; "
        "if head -c 5 \"$t/key\" | grep -q -- '-----'; then "
        "gpg --batch --yes --dearmor -o \"$t/keyring\" \"$t/key\"; "
        "else cp \"$t/key\" \"$t/keyring\"; fi; "
        f"if ! {{ {keys.trusted_shell(made, fpr)}; }}; then "
        f"echo {q(f'the keyring made from the signing key at {url} holds primary key(s) ')}\"${{found:-none}}\"{q(f', pinned {fpr}: ' + refuse)} >&2; "
        "exit 1; fi; "
        f"install -D -m 0644 \"$t/keyring\" {q(keyring)}"
    )


@operation()
def signed_key(url: str, fingerprint: str, keyring: str):
    """Install the key at ``url`` as ``keyring`` if it is missing or not the pinned key."""
    if keys.trusted(memo.fact(KeyringFingerprints, path=keyring), fingerprint):
        host.noop(f"{keyring} holds the pinned key")
        return
    yield fetch_key_command(url, fingerprint, keyring)


def source_path(name: str) -> str:
    return f"/etc/apt/sources.list.d/{name}.list"


def source_file(name: str, line: str, _sudo=None):
    """/etc/apt/sources.list.d/<name>.list holding exactly ``line``."""
    from io import StringIO

    dest = source_path(name)
    return converged.put(
        name=f"apt source {name}",
        src=StringIO(line.rstrip() + "\n"),
        dest=dest,
        mode="644",
    )


def exists(path: str) -> bool:
    return bool(host.get_fact(File, path=path))
