"""The kernel module flavour on a deployed test host: the session's deploy installed NVIDIA's
default for R580 (open); asked for the proprietary modules, `tritonfleet status` shows the host as
drift, the host layer swaps the packages in one apt run, reboots (the loaded module is the other
flavour) and verifies; then back to the default, the host left as it was."""

from __future__ import annotations

import json

from tests.support.testbed import INVENTORY, boot_id, pyinfra, ssh, tritonfleet, write_inventory

MODULE = ("echo \"license=$(modinfo -F license nvidia)\"; echo \"proc=$(head -n 1 /proc/driver/nvidia/version)\"; "
          "dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' 'nvidia-kernel*dkms' 'nvidia-open-*' "
          "'cuda-drivers-*' | awk '$1 ~ /^[hi]i/ {print \"pkg=\" $2}'; apt-mark showhold | sed 's/^/held=/'")


def status(inventory: str, name: str) -> tuple[int, dict]:
    res = tritonfleet("status", inventory, "--json", "--limit", name)
    return res.returncode, {r["host"]: r for r in json.loads(res.stdout)}[name]


def on_host(h) -> dict:
    out: dict = {"pkg": set(), "held": set()}
    for line in ssh(h, MODULE).splitlines():
        key, _, val = line.partition("=")
        if key in ("pkg", "held"):
            out[key].add(val)
        elif key:
            out[key] = val
    return out


def module_drift(row: dict) -> list[str]:
    return [d for d in row["drift"] if d.startswith("kernel module")]


def test_kernel_module_flavour_switch(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    proprietary = write_inventory(tmp_path / "inv", {h.gpu_class: [h.name]}, nvidia_kernel_module="proprietary")
    # the session's deploy: NVIDIA's default for R580, the open modules, installed and loaded
    before = on_host(h)
    assert before["license"] == "Dual MIT/GPL" and "Open Kernel Module" in before["proc"], before
    assert {"nvidia-open-580", "nvidia-kernel-open-dkms"} <= before["pkg"] and "nvidia-kernel-dkms" not in before["pkg"]
    rc, row = status(INVENTORY, h.name)
    assert row["module"] == "open" and not module_drift(row), row
    # asked for the proprietary modules: the host is drift before any deploy
    rc, row = status(proprietary, h.name)
    assert rc == 1 and module_drift(row) and "installed module is open" in module_drift(row)[0], row["drift"]
    boot = boot_id(h)
    try:
        res, data = pyinfra("deploys/host.py", inventory=proprietary)
        assert res.returncode == 0 and data["results"]["failed_hosts"] == [], res.stderr[-5000:]
        assert "removing nvidia-open-580" in res.stderr or "nvidia-kernel-open-dkms" in res.stderr, res.stderr[-3000:]
        assert boot_id(h) != boot  # the loaded module was the open one: rebooted once
        after = on_host(h)
        assert after["license"] == "NVIDIA" and after["proc"].startswith("NVRM version: NVIDIA UNIX x86_64 Kernel"), after
        assert "nvidia-kernel-dkms" in after["pkg"] and not after["pkg"] & {"nvidia-open-580", "nvidia-kernel-open-dkms"}
        assert "nvidia-kernel-dkms" in after["held"] and "cuda-drivers-580" in after["held"], after["held"]
        assert "kernel module proprietary" in res.stderr  # the verification's row
        rc, row = status(proprietary, h.name)
        assert row["module"] == "proprietary" and not module_drift(row), row["drift"]
        # the inventory that wants the default now sees the proprietary host as drift
        rc, row = status(INVENTORY, h.name)
        assert rc == 1 and "installed module is proprietary" in " ".join(module_drift(row)), row["drift"]
        # a re-run changes nothing and does not reboot
        boot = boot_id(h)
        res, data = pyinfra("deploys/host.py", inventory=proprietary)
        assert res.returncode == 0 and boot_id(h) == boot, res.stderr[-3000:]
    finally:
        # back to the session's state: the default flavour, Triton healthy after the reboot
        res, data = pyinfra("deploys/host.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-5000:]
        res, _ = pyinfra("deploys/models.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-3000:]
    final = on_host(h)
    assert final["license"] == "Dual MIT/GPL" and "Open Kernel Module" in final["proc"], final
    assert "nvidia-kernel-dkms" not in final["pkg"] and "nvidia-kernel-open-dkms" in final["held"]
    rc, row = status(INVENTORY, h.name)
    assert row["module"] == "open" and row["drift"] == [], row["drift"]
