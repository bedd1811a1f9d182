"""The key-fetch command, run for real with gpg and curl on local files."""

from __future__ import annotations

import os
import subprocess

import pytest

from tritonfleet.ops.apt_repo import fetch_key_command


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
    return fpr, armored, binary


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
