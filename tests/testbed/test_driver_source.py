"""The driver a host already has, on a real test host over SSH: a .run install's traces (its
uninstaller, owned by no package, and the installer's backup log) are detected by pre-flight,
which refuses with the migration help and leaves the host unchanged; `tritonfleet status` shows
the source. On a host of its own: Debian's real packages from the mirror, the migrations
debian -> cuda -> debian (one reboot each), the rest of the host layer on the Debian-source host
with the GPU answer routed to the stand-in (nvidia_smi_command), and .run -> ours (docs/driver-sources.md,
Tests: what is faked and why). (Generated dpkg states and the migration's commands:
tests/unit/host/test_driver_source.py.)"""

from __future__ import annotations

import base64
import os
import re
import time

import pytest

from tests.support.testbed import host_state, lines_of, mark, pyinfra_raw, ssh, status_of
from tritonfleet.host import driver_source as ds
from tritonfleet_testbed.standin_repo import ANSWER_PATH, smi_answer

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
    from tests.conftest import TESTBED_HOSTS
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


def test_debian_real_packages_from_bare_then_migrations_to_cuda_and_back(bare_host):
    from tests.support.testbed import boot_id, changed_ops, pyinfra

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

    # 4. back to Debian's packages, with nvidia_driver_migrate: the stand-in CUDA packages and
    # NVIDIA's pinning package purged, the CUDA source removed, Debian's installed, pinned, held,
    # one reboot. Faked (test setup): the module Debian's DKMS builds for the kernel that will boot
    # (nvidia-current.ko: its dkms.conf's DEST_MODULE_NAME, below updates/dkms), which it cannot
    # build here (no Debian headers for this machine's kernel); the kernel-safety check before the
    # reboot looks for that file. (The stand-in's linux-headers-<kernel> from the CUDA run stays:
    # it has no include/, and Debian's DKMS builds only for kernels whose build/include exists.)
    kernel = ssh(h, "uname -r").strip()
    ssh(h, f"mkdir -p /lib/modules/{kernel}/updates/dkms && printf 'placeholder: the nvidia-current module "
           f"Debian DKMS builds for {kernel} where its headers are\n' "
           f"> /lib/modules/{kernel}/updates/dkms/nvidia-current.ko")
    before = boot_id(h)
    t0 = time.monotonic()
    res, data = pyinfra(DRIVER_ONLY, "--limit", h.name, *DEBIAN, "--data", "nvidia_driver_migrate=True")
    timings["migration cuda -> debian"] = time.monotonic() - t0
    out = lines_of(res.stderr)
    assert res.returncode == 0, out[-4000:]
    assert any("remove the driver from NVIDIA's CUDA repository" in n for n in changed_ops(data)), \
        changed_ops(data)
    assert out.count("rebooted (boot id") == 1 and boot_id(h) != before, out[-4000:]
    pkgs = nvidia_packages(h)
    assert not [p for p, v in pkgs.items() if v.startswith("580.") or p.startswith("nvidia-driver-pinning")], pkgs
    for p in ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1"):
        assert pkgs.get(p, "").startswith("535.") and "deb12u" in pkgs[p], (p, pkgs)
    assert {"nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1"} <= set(ssh(h, "apt-mark showhold").split())
    assert "Pin: version 535.*" in ssh(h, "cat /etc/apt/preferences.d/tritonfleet-nvidia-driver")
    assert ssh(h, "ls /etc/apt/sources.list.d/").split().count("tritonfleet-debian-nonfree.sources") == 1
    assert "cuda" not in ssh(h, "ls /etc/apt/sources.list.d/"), ssh(h, "ls /etc/apt/sources.list.d/")
    # Debian's dkms.conf names the module the kernel-safety check looks for (tritonfleet.host.boot_kernel)
    assert 'DEST_MODULE_NAME[0]="$PACKAGE_NAME"' in ssh(h, "cat /usr/src/nvidia-current-535.*/dkms.conf")
    _, row = status_of(h.name)
    assert row["driver_source"] == "debian", row
    before = boot_id(h)
    res, data = pyinfra(DRIVER_ONLY, "--limit", h.name, *DEBIAN)
    assert res.returncode == 0 and changed_ops(data) == [], (changed_ops(data), res.stderr[-3000:])
    assert boot_id(h) == before

    # 5. the rest of the host layer (Docker, Container Toolkit, GPU verification) on the Debian-source
    # host. Debian's real nvidia-smi cannot answer for a GPU here (none, no module): test-only data
    # points nvidia_smi_command at the stand-in's answer for Debian's installed release (put on the
    # host by the test; the stand-in toolkit copies it into `docker run --gpus` containers).
    upstream = pkgs["nvidia-smi"].split("-", 1)[0]
    script = base64.b64encode(smi_answer(upstream).encode()).decode()
    ssh(h, f"mkdir -p {os.path.dirname(ANSWER_PATH)} && echo {script} | base64 -d > {ANSWER_PATH} "
           f"&& chmod 755 {ANSWER_PATH}")
    t0 = time.monotonic()
    res, data = pyinfra("deploys/host.py", "--limit", h.name, *DEBIAN, "--data", f"nvidia_smi_command={ANSWER_PATH}")
    timings["host layer after the driver (Debian source, answer routed)"] = time.monotonic() - t0
    out = lines_of(res.stderr)
    assert res.returncode == 0, out[-4000:]
    for where in ("host", "container"):
        assert re.search(rf"GPU check\s+{re.escape(h.name)}\s+{where}\s+1x .*driver {re.escape(upstream)} .*CUDA 12\.2",
                         out), (where, out[-4000:])
    assert "rebooted (boot id" not in out and boot_id(h) == before
    assert "nvidia" in ssh(h, "docker info --format '{{json .Runtimes}}'")
    _, row = status_of(h.name)
    assert row["driver_source"] == "debian", row

    # 6. .run -> ours: a .run install's traces on the same host (its uninstaller, owned by no package,
    # and the installer's backup log). The fake uninstaller notes its arguments and removes the
    # traces (FAKE_UNINSTALLER, below). With
    # nvidia_driver_migrate the uninstaller runs first (--silent); Debian's packages are installed
    # (already there: apt keeps them) and held; the answering driver is the installed one: no reboot
    ssh(h, f"echo {base64.b64encode(FAKE_UNINSTALLER.encode()).decode()} | base64 -d > {ds.RUN_UNINSTALLER} "
           f"&& chmod 755 {ds.RUN_UNINSTALLER} && mkdir -p /var/lib/nvidia "
           f"&& printf '580.95.05\\n/usr/bin/nvidia-smi\\n' > {ds.RUN_LOG}")
    _, row = status_of(h.name)
    assert row["driver_source"] == "runfile+debian", row
    t0 = time.monotonic()
    routed = ("--data", f"nvidia_smi_command={ANSWER_PATH}")
    res, data = pyinfra(DRIVER_ONLY, "--limit", h.name, *DEBIAN, *routed, "--data", "nvidia_driver_migrate=True")
    timings["migration .run -> debian"] = time.monotonic() - t0
    assert res.returncode == 0, lines_of(res.stderr)[-4000:]
    assert any("remove the driver from NVIDIA's .run installer" in n for n in changed_ops(data)), \
        changed_ops(data)
    assert ssh(h, "cat /root/nvidia-uninstall-ran").strip() == "--silent"
    assert ssh(h, f"ls {ds.RUN_UNINSTALLER} {ds.RUN_LOG} 2>/dev/null || true").strip() == ""
    pkgs = nvidia_packages(h)
    assert pkgs.get("nvidia-driver", "").startswith("535.") and "deb12u" in pkgs["nvidia-driver"], pkgs
    assert {"nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1"} <= set(ssh(h, "apt-mark showhold").split())
    assert boot_id(h) == before
    _, row = status_of(h.name)
    assert row["driver_source"] == "debian", row
    res, data = pyinfra(DRIVER_ONLY, "--limit", h.name, *DEBIAN, *routed)
    assert res.returncode == 0 and changed_ops(data) == [], (changed_ops(data), res.stderr[-3000:])


# the stand-in of NVIDIA's uninstaller (`nvidia-uninstall`): notes how it was run and removes the
# traces, as nvidia-installer's do_uninstall (NVIDIA/nvidia-installer, backup.c) removes the files its
# backup log lists as installed, then the backup directory /var/lib/nvidia (that the installer and
# its uninstall link are among the logged files is not confirmed)
FAKE_UNINSTALLER = (f"#!/bin/sh\necho \"$*\" > /root/nvidia-uninstall-ran\n"
                    f"rm -rf /var/lib/nvidia {ds.RUN_UNINSTALLER} /usr/bin/nvidia-installer\n")


timings: dict[str, float] = {}


def teardown_module():
    print("\ndriver source timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
