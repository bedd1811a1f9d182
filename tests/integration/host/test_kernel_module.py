"""The kernel module's flavour changes on pyinfra's @fake connector that reboot, with their real
waits (the rest of the kernel module's step: tests/unit/host/test_kernel_module.py).
"""

from __future__ import annotations

import re

from tests.support.fakehost import run_fake
from tests.unit.host.test_kernel_module import (
    BASE,
    OPEN_HOST,
    OPEN_PROC,
    PROP_PROC,
    REBOOT,
    installs,
    kmod_answer,
)
from tritonfleet.steps.host_prep import nvidia_driver  # noqa: E402


def test_switch_open_to_proprietary_swaps_in_one_apt_run_and_reboots():
    responses = {**BASE, "dpkg-query -W": OPEN_HOST, "modinfo -F license": kmod_answer("NVIDIA", OPEN_PROC)}
    _, cmds, state = run_fake(nvidia_driver, responses,
                              {"cuda_distro": "debian12", "nvidia_kernel_module": "proprietary", "nvidia_reboot_timeout": 1})
    unhold = next(i for i, c in enumerate(cmds) if "xargs -r apt-mark unhold" in c)
    swap = next(i for i, c in enumerate(cmds) if "--allow-downgrades cuda-drivers-580 nvidia-kernel-dkms" in c)
    hold = next(i for i, c in enumerate(cmds) if "xargs -r apt-mark hold" in c)
    assert unhold < swap < hold
    # the open flavour's packages leave in the same apt run
    for gone in ("nvidia-open-580", "nvidia-kernel-open-dkms"):
        assert re.search(rf"\s{gone}-(\s|$)", cmds[swap]), (gone, cmds[swap])
    assert " nvidia-driver " in cmds[swap] and " libcuda1 " in cmds[swap]  # the shared packages move along
    # installed: the proprietary module, loaded: the open one -> the host reboots (the wait for a
    # new boot id then fails on @fake)
    assert any(REBOOT in c for c in cmds), cmds[-5:]


def test_loaded_flavour_differs_from_installed_reboots_without_a_package_change():
    responses = {**BASE, "dpkg-query -W": OPEN_HOST, "modinfo -F license": kmod_answer("Dual MIT/GPL", PROP_PROC)}
    _, cmds, _ = run_fake(nvidia_driver, responses, {"cuda_distro": "debian12", "nvidia_reboot_timeout": 1})
    assert not installs(cmds) and any(REBOOT in c for c in cmds)
