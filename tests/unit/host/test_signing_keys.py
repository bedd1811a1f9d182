"""The key-fetch command, run for real with gpg and curl on local files."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet.host.ops.apt_repo import fetch_key_command


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    home = tmp_path_factory.mktemp("gnupg")
    os.chmod(home, 0o700)
    env = dict(os.environ, GNUPGHOME=str(home))
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Test Key <t@example.invalid>",
                    "ed25519", "sign", "never"], env=env, check=True, capture_output=True)
    out = subprocess.run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env, check=True,
                         capture_output=True, text=True).stdout
    fpr = next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr"))
    armored = home / "key.asc"
    subprocess.run(["gpg", "--batch", "--armor", "--export", "-o", str(armored)], env=env, check=True)
    binary = home / "key.gpg"
    subprocess.run(["gpg", "--batch", "--export", "-o", str(binary)], env=env, check=True)
    yield fpr, armored, binary
    subprocess.run(["gpgconf", "--kill", "all"], env=env, check=False)  # the agent gpg started


def run(cmd):
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)


@pytest.mark.parametrize("which", ["armored", "binary"])
def test_pinned_key_is_installed_dearmored(key, tmp_path, which):
    fpr, armored, binary = key
    src = armored if which == "armored" else binary
    keyring = tmp_path / "k" / "vendor.gpg"
    res = run(fetch_key_command(f"file://{src}", fpr.lower(), str(keyring)))
    assert res.returncode == 0, res.stderr
    shown = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons", str(keyring)],
                           capture_output=True, text=True).stdout
    assert fpr in shown
    assert not keyring.read_bytes().startswith(b"-----")


def test_wrong_fingerprint_trusts_nothing(key, tmp_path):
    fpr, armored, _ = key
    keyring = tmp_path / "vendor.gpg"
    wrong = "EB693B3035CD5710E231E123A4B469963BF863CC"
    res = run(fetch_key_command(f"file://{armored}", wrong, str(keyring)))
    assert res.returncode != 0
    assert "not trusted" in res.stderr and fpr in res.stderr and wrong in res.stderr
    assert f"file://{armored}" in res.stderr
    assert not keyring.exists()


def test_unreachable_key_fails(tmp_path):
    res = run(fetch_key_command(f"file://{tmp_path}/missing.asc", "AB" * 20, str(tmp_path / "k.gpg")))
    assert res.returncode != 0 and not (tmp_path / "k.gpg").exists()


@pytest.fixture(scope="module")
def key_with_subkey(tmp_path_factory):
    """A key like Docker's: the primary certifies, a subkey signs (two fpr records)."""
    home = tmp_path_factory.mktemp("gnupg2")
    os.chmod(home, 0o700)
    env = dict(os.environ, GNUPGHOME=str(home))
    gpg = ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run([*gpg, "--quick-gen-key", "Sub Key <s@example.invalid>", "ed25519", "cert", "never"],
                   env=env, check=True, capture_output=True)
    out = subprocess.run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env, check=True,
                         capture_output=True, text=True).stdout
    fpr = next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr"))
    subprocess.run([*gpg, "--quick-add-key", fpr, "ed25519", "sign", "never"], env=env, check=True,
                   capture_output=True)
    armored = home / "key.asc"
    subprocess.run(["gpg", "--batch", "--armor", "--export", "-o", str(armored)], env=env, check=True)
    yield fpr, armored
    subprocess.run(["gpgconf", "--kill", "all"], env=env, check=False)  # the agent gpg started


def test_facts_report_the_primary_fingerprint_only(key_with_subkey, tmp_path):
    """A key with a signing subkey is still one pinned fingerprint: installed once, then a no-op
    (comparing every fpr record would re-fetch Docker's key on every run)."""
    from tritonfleet.host.facts import KeyringFingerprints, RemoteKeyFingerprints

    fpr, armored = key_with_subkey
    shown = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons", str(armored)],
                           capture_output=True, text=True).stdout
    assert sum(line.startswith("fpr:") for line in shown.splitlines()) == 2
    keyring = tmp_path / "docker.gpg"
    assert run(fetch_key_command(f"file://{armored}", fpr, str(keyring))).returncode == 0
    fact = KeyringFingerprints()
    assert fact.process(run(fact.command(str(keyring))).stdout.splitlines()) == [fpr]
    assert fact.process(run(fact.command(str(tmp_path / "missing.gpg"))).stdout.splitlines()) == []
    remote = RemoteKeyFingerprints()

    def fetched(url):
        return remote.process(run(remote.command(url, fpr)).stdout.splitlines())

    assert fetched(f"file://{armored}") == {"fingerprints": [fpr], "trusted": True, "error": None}
    missing = fetched(f"file://{tmp_path}/nope.asc")
    assert missing["fingerprints"] == [] and "nope.asc" in missing["error"] and not missing["trusted"]
    (tmp_path / "junk").write_text("not a key\n")
    assert fetched(f"file://{tmp_path}/junk") == {"fingerprints": [], "trusted": False,
                                                  "error": "not an OpenPGP key"}


# ---------------------------------------------------------------- one rule: exactly the pinned key

@pytest.fixture(scope="module")
def pool(tmp_path_factory, key, key_with_subkey):
    """Three real keys (one with a signing subkey), each exported armored and binary."""
    home = tmp_path_factory.mktemp("gnupg3")
    os.chmod(home, 0o700)
    env = dict(os.environ, GNUPGHOME=str(home))
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "Other <o@example.invalid>",
                    "ed25519", "sign", "never"], env=env, check=True, capture_output=True)
    out = subprocess.run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env, check=True,
                         capture_output=True, text=True).stdout
    other = next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr"))
    armored = home / "other.asc"
    subprocess.run(["gpg", "--batch", "--armor", "--export", "-o", str(armored)], env=env, check=True)
    subprocess.run(["gpgconf", "--kill", "all"], env=env, check=False)
    keys = {key[0]: key[1], key_with_subkey[0]: key_with_subkey[1], other: armored}
    return {fpr: {"armored": path.read_bytes(), "binary": subprocess.run(
        ["gpg", "--batch", "--dearmor"], input=path.read_bytes(), capture_output=True, check=True).stdout}
        for fpr, path in keys.items()}


def test_the_pinned_key_with_another_key_is_refused(pool, tmp_path):
    """The pinned key first, another after it (what the first-key check let through)."""
    pinned, other, _ = pool
    both = tmp_path / "both.asc"
    both.write_bytes(pool[pinned]["armored"] + pool[other]["armored"])
    keyring = tmp_path / "vendor.gpg"
    res = run(fetch_key_command(f"file://{both}", pinned, str(keyring)))
    assert res.returncode != 0 and not keyring.exists()
    assert f"has primary key(s) {pinned} {other}, pinned {pinned}: not trusted" in res.stderr
    assert "exactly one primary key, the pinned one" in res.stderr


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_install_and_preflight_trust_exactly_the_pinned_key(pool, tmp_path, data):
    """Any file made of real keys (armored or binary, concatenated, repeated): the install step
    writes a keyring only when pre-flight's fact trusts the file, and both only when the file holds
    one primary key, the pinned one; the keyring then holds exactly that key."""
    from tritonfleet.host.facts import KeyringFingerprints, RemoteKeyFingerprints
    from tritonfleet.host.signing_keys import trusted

    fprs = list(pool)
    chosen = data.draw(st.lists(st.sampled_from(fprs), min_size=0, max_size=3), label="keys in the file")
    form = data.draw(st.sampled_from(["armored", "binary"]), label="form")
    pinned = data.draw(st.sampled_from(fprs), label="pinned")
    case = Path(tempfile.mkdtemp(dir=tmp_path))
    src = case / "key"
    src.write_bytes(b"".join(pool[f][form] for f in chosen) or b"")
    keyring = case / "k" / "vendor.gpg"

    installed = run(fetch_key_command(f"file://{src}", pinned.lower(), str(keyring))).returncode == 0
    remote = RemoteKeyFingerprints()
    seen = remote.process(run(remote.command(f"file://{src}", pinned)).stdout.splitlines())
    expected = chosen == [pinned]
    assert installed == expected == seen["trusted"] == trusted(seen["fingerprints"], pinned)
    assert keyring.exists() == expected
    if expected:
        fact = KeyringFingerprints()
        assert fact.process(run(fact.command(str(keyring))).stdout.splitlines()) == [pinned]
