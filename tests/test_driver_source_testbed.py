"""The driver a host already has, on a real test host over SSH: a .run install's traces (its
uninstaller, owned by no package, and the installer's backup log) are detected by pre-flight,
which refuses with the migration help and leaves the host unchanged; `tritonfleet status` shows
the source. (Generated dpkg states and the migration's commands: tests/test_driver_source.py.)"""

from __future__ import annotations

import time

import pytest
from testbed_util import host_state, lines_of, mark, pyinfra_raw, ssh, status_of

from tritonfleet import driver_source as ds

pytestmark = pytest.mark.testbed

REFUSED = "tritonfleet pre-flight failed, no host was changed"
RUN_TRACES = (f"printf '#!/bin/sh\\necho uninstalled\\n' > {ds.RUN_UNINSTALLER} && chmod 755 {ds.RUN_UNINSTALLER} "
              f"&& mkdir -p /var/lib/nvidia && printf '580.95.05\\n/usr/bin/nvidia-smi\\n' > {ds.RUN_LOG}")


def test_run_install_is_detected_refused_and_shown(testbed):
    h = testbed.hosts[0]
    ssh(h, RUN_TRACES)
    try:
        before = mark(h)
        res = pyinfra_raw("-y", "--limit", h.name, "inventories/testbed.py", "deploys/host.py")
        out = res.stdout + res.stderr
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        assert res.returncode != 0 and REFUSED in out, out[-3000:]
        assert "Starting operation" not in out
        for text in (f"{h.name}: the host already has an NVIDIA driver (runfile 580.95.05",
                     f"NVIDIA's .run installer (files outside any package manager): {ds.RUN_UNINSTALLER}, {ds.RUN_LOG}",
                     "nvidia_driver_migrate = True", f"{ds.RUN_UNINSTALLER} --silent", "docs/driver-sources.md"):
            assert text in " ".join(out.split()), (text, out[-3000:])
        assert host_state(h) == before
        _, row = status_of(h.name)
        assert row["driver_source"].startswith("runfile"), row
        assert any(d.startswith("driver source runfile") for d in row["drift"]), row["drift"]
    finally:
        ssh(h, f"rm -rf {ds.RUN_UNINSTALLER} /var/lib/nvidia")
    _, row = status_of(h.name)
    assert not (row["driver_source"] or "").startswith("runfile"), row


# ================================================================ Debian's real packages, on a host of its own

DRIVER_ONLY = "tests/deploys/driver_only.py"
# test-only data: the test hosts run this machine's kernel (no Debian linux-headers for it) and have
# no GPU, so Debian's nvidia-persistenced cannot start; everything else is the deploy's own default
DEBIAN = ["--data", "nvidia_driver_source=debian", "--data", 'nvidia_kernel_packages=["dkms"]',
          "--data", "nvidia_persistenced=False"]


@pytest.fixture(scope="module")
def bare_host(testbed):
    """Host tb4 from bare next to the shared ones; destroyed afterwards."""
    from conftest import TESTBED_HOSTS

    from tritonfleet_testbed import hosts
    from tritonfleet_testbed.standin_repo import gpu_profile

    state = hosts.up(TESTBED_HOSTS + 1, gpu_env_for=gpu_profile)
    h = next(h for h in state.hosts if h.index == TESTBED_HOSTS + 1)
    # apt without Recommends (as minimal images have it): DKMS's Recommends would bring Debian's
    # linux-headers-amd64, and DKMS would then compile the 535 module for that kernel (many CPU
    # minutes on this machine, for a kernel the test host never boots)
    ssh(h, "echo 'APT::Install-Recommends \"false\";' > /etc/apt/apt.conf.d/99-no-recommends")
    yield h
    hosts.destroy_host(h.name)


def nvidia_packages(h) -> dict[str, str]:
    out = ssh(h, "dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\\n' | awk '$1 ~ /^[ih]i/' "
                 "| grep -E 'nvidia|libcuda|cuda-drivers' || true")
    return {line.split()[1]: line.split()[2] for line in out.splitlines() if line.strip()}


def test_debian_real_packages_from_bare_then_migration_to_cuda(bare_host):
    from testbed_util import boot_id, changed_ops, pyinfra

    h = bare_host
    t0 = time.monotonic()
    # 1. Debian's own nvidia-driver from the mirror: installed, pinned, held; the real nvidia-smi
    # cannot reach a driver on a host without a GPU, and the reboot that would load it is refused
    # (the kernel that would boot has no NVIDIA module): reported, naming host and kernel
    res, data = pyinfra(DRIVER_ONLY, "--limit", h.name, *DEBIAN)
    timings["debian install"] = time.monotonic() - t0
    out = lines_of(res.stderr)
    assert res.returncode != 0, out[-4000:]
    assert f"{h.name}: the NVIDIA driver is installed but not loaded" in out, out[-4000:]
    assert "`nvidia-smi` said: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" in out
    assert f"{h.name} failed at NVIDIA driver (reboot)" in out and "has no NVIDIA module" in out, out[-4000:]
    smi = ssh(h, "nvidia-smi; echo rc=$?", check=False)
    assert "couldn't communicate with the NVIDIA driver" in smi and "rc=9" in smi, smi
    pkgs = nvidia_packages(h)
    for p in ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-persistenced"):
        assert pkgs.get(p, "").startswith("535.") and "deb12u" in pkgs[p], (p, pkgs)
    assert all(v.startswith("535.") for p, v in pkgs.items() if ds.is_driver_package(p, v)), pkgs
    held = set(ssh(h, "apt-mark showhold").split())
    assert {"nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1"} <= held, held
    assert "Pin: version 535.*" in ssh(h, "cat /etc/apt/preferences.d/tritonfleet-nvidia-driver")
    assert "nvidia-driver" in ssh(h, "apt-cache policy nvidia-driver | head -n 3") and \
        "535." in ssh(h, "apt-cache policy nvidia-driver | sed -n 3p")  # the pinned candidate
    # DKMS has the module's source and built nothing: no Debian kernel (and no headers) here
    assert "nvidia" in ssh(h, "dkms status 2>&1 || true")
    assert ssh(h, "find /lib/modules -name 'nvidia*.ko*' 2>/dev/null | wc -l").strip() == "0"
    _, row = status_of(h.name)
    assert row["driver_source"] == "debian", row
    # 2. again: nothing changes (no reboot is tried: the driver did not change)
    before = boot_id(h)
    res, data = pyinfra(DRIVER_ONLY, "--limit", h.name, *DEBIAN)
    assert res.returncode == 0, res.stderr[-4000:]
    assert changed_ops(data) == [], changed_ops(data)
    assert boot_id(h) == before
    # 3. to NVIDIA's repository (stand-in), with nvidia_driver_migrate: Debian's packages purged,
    # ours installed and held, one reboot. (Stand-in only: the module Debian's driver would have
    # loaded at boot, so the stand-in's nvidia-smi answers as a real host would after the switch.)
    res, _ = pyinfra(DRIVER_ONLY, "--limit", h.name)
    assert res.returncode != 0 and "nvidia_driver_migrate = True" in " ".join(res.stderr.split())
    ssh(h, "mkdir -p /run/nvidia-standin && echo 535.309.01 > /run/nvidia-standin/module-version")
    t0 = time.monotonic()
    res, data = pyinfra(DRIVER_ONLY, "--limit", h.name, "--data", "nvidia_driver_migrate=True")
    timings["migration debian -> cuda"] = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-4000:]
    assert lines_of(res.stderr).count("rebooted (boot id") == 1
    assert boot_id(h) != before
    pkgs = nvidia_packages(h)
    assert not [p for p, v in pkgs.items() if "deb12u" in v and ds.is_driver_package(p, v)], pkgs
    assert pkgs.get("nvidia-open-580", "").startswith("580."), pkgs
    assert "nvidia-open-580" in ssh(h, "apt-mark showhold").split()
    _, row = status_of(h.name)
    assert row["driver_source"] == "cuda", row
    res, data = pyinfra(DRIVER_ONLY, "--limit", h.name)
    assert res.returncode == 0 and changed_ops(data) == [], changed_ops(data)


timings: dict[str, float] = {}


def teardown_module():
    print("\ndriver source timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
