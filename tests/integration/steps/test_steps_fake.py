"""The driver step on pyinfra's @fake connector through its real reboot wait: a driver installed
but not loaded reboots the host once (the steps' commands: tests/unit/steps/test_steps_fake.py).
"""

from __future__ import annotations

from tests.support.fakehost import run_fake
from tests.unit.steps.test_steps_fake import BASE, DATA, NO_COMMUNICATION, dpkg
from tritonfleet.steps.host_prep import (
    nvidia_driver,
)


def test_installed_but_not_loaded_reboots_once():
    """nouveau bound to the GPU at the first install: nvidia-smi cannot talk to the driver (no
    version mismatch); the host reboots, once: a later run does not reboot for it again."""
    reboot_cmd = "( sleep 1 && reboot )"
    smi = {"nvidia-smi --query-gpu=driver_version": NO_COMMUNICATION}
    _, cmds, _ = run_fake(nvidia_driver, {**BASE, **smi}, {**DATA, "nvidia_reboot_timeout": 1})
    assert any(reboot_cmd in c for c in cmds)
    # loaded fine after the install: no reboot
    _, cmds, _ = run_fake(nvidia_driver, {**BASE, "nvidia-smi --query-gpu=driver_version": "580.159.04"},
                          {**DATA, "nvidia_reboot_timeout": 1})
    assert not any(reboot_cmd in c for c in cmds)
    # the driver already installed (nothing changes in this run), still not talking: not again
    installed = dpkg("ii nvidia-driver-pinning-580 580-1", "hi cuda-drivers-580 580.159.04-1",
                     "hi nvidia-driver 580.159.04-1", "hi nvidia-kernel-dkms 580.159.04-1", "ii linux-headers-6.1.0-28-amd64 6.1.76-1",
                     "ii dkms 3.0.10-8", "ii firmware-misc-nonfree 20230210-5")
    _, cmds, state = run_fake(nvidia_driver, {**BASE, **smi, "dpkg-query -W": installed},
                              {**DATA, "nvidia_reboot_timeout": 1})
    assert not any(reboot_cmd in c for c in cmds)
    planned = {n for meta in state.op_meta.values() for n in meta.names}
    assert not any("reboot" in n for n in planned)
