"""Secure Boot: enabled, disabled, and the state nobody can tell (reported, opt-in only).

mokutil's answers are the ones its users paste ("SecureBoot enabled", "SecureBoot disabled",
"This system doesn't support Secure Boot", "EFI variables are not supported on this system");
the efivarfs fallback runs the fact's own shell against a scratch /sys/firmware/efi whose
SecureBoot variable has the layout of Linux's efivarfs (4 bytes of attributes, then the data).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tritonfleet.host.facts import SECURE_BOOT_EFIVAR, SecureBoot


@pytest.mark.parametrize("lines,expected", [
    (["SecureBoot enabled"], True),
    (["SecureBoot disabled"], False),
    (["This system doesn't support Secure Boot"], False),
    (["EFI variables are not supported on this system"], False),
    (["mokutil: not installed", "efi=absent"], False),
    (["mokutil: not installed", "efivar=1"], True),
    (["mokutil: not installed", "efivar=0"], False),
    (["mokutil: not installed"], None),  # UEFI host, efivarfs not readable
    (["Failed to read SecureBoot", "efivar="], None),
    ([], None),
])
def test_secure_boot_answers(lines, expected):
    assert SecureBoot().process(lines) is expected


@pytest.mark.parametrize("efi,expected", [
    (None, False),  # no /sys/firmware/efi: booted without UEFI
    (b"\x06\x00\x00\x00\x01", True),
    (b"\x06\x00\x00\x00\x00", False),
    ("unreadable", None),
])
def test_the_fact_reads_the_efi_variable_without_mokutil(tmp_path, efi, expected):
    root = tmp_path / "sys" / "firmware" / "efi"
    if efi is not None:
        (root / "efivars").mkdir(parents=True)
        if efi != "unreadable":
            (root / "efivars" / os.path.basename(SECURE_BOOT_EFIVAR)).write_bytes(efi)
    cmd = SecureBoot().command().replace("/sys/firmware/efi", str(root))
    env = {"PATH": "/usr/bin:/bin"}  # no mokutil here (this machine has none)
    assert subprocess.run(["sh", "-c", "command -v mokutil"], env=env).returncode != 0
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env).stdout.splitlines()
    assert "mokutil: not installed" in out
    assert SecureBoot().process(out) is expected


def test_unknown_secure_boot_is_refused_unless_opted_in():
    from tests.unit.test_preflight import KEYS, preflight_fake

    unknown = {**KEYS, "mokutil --sb-state": ["mokutil: not installed"]}
    msg, _ = preflight_fake(unknown)
    assert msg and "no host was changed" in msg and "@fake/gpu1" in msg
    assert "cannot tell whether UEFI Secure Boot is enabled" in msg and "apt-get install mokutil" in msg
    assert "nvidia_secure_boot_unknown_ok = True" in msg
    msg, _ = preflight_fake(unknown, {"nvidia_secure_boot_unknown_ok": True})
    assert msg is None
    msg, _ = preflight_fake({**KEYS, "mokutil --sb-state": ["mokutil: not installed", "efi=absent"]})
    assert msg is None


def test_the_driver_step_stops_on_unknown_secure_boot():
    from tests.support.fakehost import run_fake
    from tests.unit.steps.test_steps_fake import BASE, DATA
    from tritonfleet.core.report import HOST_RECORD
    from tritonfleet.steps.host_prep import nvidia_driver

    _, cmds, state = run_fake(nvidia_driver, {**BASE, "mokutil --sb-state": "mokutil: not installed"}, DATA)
    assert state.failed_hosts
    # (the failure report kept on the host for `tritonfleet status` quotes the fix, apt-get included)
    assert any(HOST_RECORD in c for c in cmds)
    assert not any(("apt-get" in c or "curl" in c) and HOST_RECORD not in c for c in cmds)
    _, cmds, state = run_fake(nvidia_driver, {**BASE, "mokutil --sb-state": "mokutil: not installed"},
                              {**DATA, "nvidia_secure_boot_unknown_ok": True})
    assert not state.failed_hosts and any("install cuda-drivers-" in c for c in cmds)
