"""The kernel drill on a deployed test host: a kernel upgrade that would boot without the NVIDIA
module. `tritonfleet status` shows the pending reboot and that its kernel has no module; a deploy
that needs a reboot refuses it (the host keeps running, not rebooted) when the module cannot be
built, and builds it first (the kernel's headers, DKMS) when it can, then reboots."""

from __future__ import annotations

from tests.support.testbed import boot_id, changed_ops, pyinfra, ssh, status_of
from tritonfleet_testbed.standin_repo import newer_kernels

APT = "DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Use-Pty=0"


def status(h) -> dict:
    rc, row = status_of(h.name)
    return {**row, "rc": rc}


def test_kernel_drill(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[1]
    running = ssh(h, "uname -r").strip()
    with_headers, without = newer_kernels(running)
    # the stand-in driver's DKMS built the module for the running kernel when it was installed
    assert ssh(h, f"find /lib/modules/{running} -name 'nvidia.ko*'").strip()
    before = status(h)
    assert before["reboot"] == "-" and not any("which has no NVIDIA module" in d for d in before["drift"])
    try:
        # 1. a kernel upgrade without headers anywhere: its module cannot be built
        ssh(h, f"{APT} install linux-image-{without} >/dev/null 2>&1")
        st = status(h)
        assert st["reboot"] == f"pending into {without}, WITHOUT the NVIDIA module", st["reboot"]
        assert any(f"pending reboot into kernel {without}, which has no NVIDIA module" in d for d in st["drift"])
        assert st["rc"] == 1 and st["kernel"]["reboot_packages"] == [f"linux-image-{without}"]
        # a deploy that needs a reboot (the loaded module is another driver's) refuses it
        ssh(h, "echo 570.133.07 > /run/nvidia-standin/module-version")
        boot = boot_id(h)
        res, data = pyinfra("deploys/host.py", "--limit", h.name)
        # (the only host failed: pyinfra ends with "No hosts remaining", and its JSON may be missing)
        assert res.returncode != 0 and (data.get("results") or {}).get("failed_hosts", [h.name]) == [h.name], \
            res.stderr[-3000:]
        assert f"reboot refused: kernel {without} has no NVIDIA module" in res.stderr or \
            f"the kernel that will boot, {without}" in res.stderr, res.stderr[-3000:]
        assert f"its headers could not be installed (linux-headers-{without})" in res.stderr
        assert f"not rebooted: it runs kernel {running}" in res.stderr
        assert boot_id(h) == boot  # not rebooted
        assert ssh(h, "systemctl is-active triton").strip() == "active"  # Triton untouched
        # 2. the upgrade replaced by one whose headers exist: the deploy builds the module, reboots
        ssh(h, f"{APT} remove linux-image-{without} >/dev/null 2>&1 && "
               f"{APT} install linux-image-{with_headers} >/dev/null 2>&1")
        assert status(h)["reboot"] == f"pending into {with_headers}, WITHOUT the NVIDIA module"
        res, data = pyinfra("deploys/host.py", "--limit", h.name)
        assert res.returncode == 0 and data["results"]["failed_hosts"] == [], res.stderr[-5000:]
        assert f"NVIDIA module built for {with_headers}, the kernel that will boot" in res.stderr, res.stderr[-3000:]
        assert any("reboot if the loaded driver" in n for n in changed_ops(data)), changed_ops(data)
        assert boot_id(h) != boot
        assert ssh(h, f"find /lib/modules/{with_headers} -name 'nvidia.ko*'").strip()
        assert ssh(h, f"dpkg-query -W -f '${{Status}}' linux-headers-{with_headers}").strip() == "install ok installed"
        after = status(h)
        assert after["reboot"] == f"next boot {with_headers}, with the NVIDIA module", after["reboot"]
        assert not any("which has no NVIDIA module" in d for d in after["drift"]), after["drift"]
    finally:
        ssh(h, f"{APT} purge linux-image-{without} linux-image-{with_headers} linux-headers-{with_headers} "
               f">/dev/null 2>&1; rm -rf /lib/modules/{without} /lib/modules/{with_headers} "
               "/var/run/reboot-required /var/run/reboot-required.pkgs; "
               "[ \"$(cat /run/nvidia-standin/module-version 2>/dev/null)\" = 570.133.07 ] && "
               "rm -f /run/nvidia-standin/module-version; true", check=False)
        # Triton back from the reboot and healthy (the gate also clears the refused run's report)
        res, _ = pyinfra("deploys/models.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-3000:]
    final = status(h)
    assert final["reboot"] == "-" and final["drift"] == [], final["drift"]
