"""The one rule a vendor signing key must pass before apt may trust it.

A key file is trusted only when it holds exactly one primary key and that key's fingerprint is
the pinned one (the pinned key's own subkeys belong to it: Docker's key signs with a subkey). A
file that holds the pinned key and any other key is refused as a whole, so no key rides along
into a keyring that apt trusts for the vendor's repository.

The rule is applied on the host, by the shell ``trusted_shell()`` returns: pre-flight runs it on
the file the host fetches (facts.host.RemoteKeyFingerprints), and the install step runs it on the
file it fetches again and on the keyring it is about to write (ops.apt_repo.fetch_key_command).
``trusted()`` is the same rule for fingerprints already read (an installed keyring); the tests
check that both answer alike.
"""

from __future__ import annotations

from ..core.shell import q

# Primary-key fingerprints from `gpg --with-colons`: the fpr record right after a pub record
# (subkeys have fpr records too, after their sub record).
PRIMARY_FPR_AWK = "awk -F: '/^pub:/{p=1; next} /^fpr:/{if (p) print $10; p=0; next} {p=0}'"

RULE = "a key file is trusted only when it holds exactly one primary key, the pinned one"


def normalize_fingerprint(fpr: str) -> str:
    return str(fpr).replace(" ", "").upper()


def primary_fingerprints_shell(path: str) -> str:
    """Shell printing the primary-key fingerprints of the key file at ``path`` (a shell word,
    quoted by the caller), one a line."""
    return f"gpg --batch --no-default-keyring --show-keys --with-colons {path} 2>/dev/null | {PRIMARY_FPR_AWK}"


def trusted_shell(path: str, fingerprint: str) -> str:
    """Shell that sets ``found`` to the primary-key fingerprints of ``path`` (space-separated)
    and exits 0 only when ``path`` holds exactly one primary key, the pinned one."""
    return (
        f'found=$(echo $({primary_fingerprints_shell(path)})); [ "$found" = {q(normalize_fingerprint(fingerprint))} ]'
    )


def trusted(found: list[str], fingerprint: str) -> bool:
    """The same rule for primary-key fingerprints already read."""
    return [normalize_fingerprint(f) for f in found] == [normalize_fingerprint(fingerprint)]
