"""The driver step asking the driver with the configured nvidia-smi command, on pyinfra's @fake
connector through its reboot wait (the rest: tests/unit/gpu/test_smi_command.py).
"""

from __future__ import annotations

import re

from tests.support.fakehost import run_fake
from tests.unit.gpu.test_smi_command import REBOOT, SMI
from tests.unit.steps.test_steps_fake import BASE, DATA, NO_COMMUNICATION
from tritonfleet.steps.host_prep import nvidia_driver


def test_the_driver_step_asks_the_driver_with_the_command():
    # the host's own nvidia-smi cannot talk to the driver, the configured command answers: no reboot
    responses = {**BASE, "nvidia-smi --query-gpu=driver_version": NO_COMMUNICATION,
                 f"{SMI} --query-gpu=driver_version": "580.159.04",
                 f"{SMI} -q": "    Persistence Mode                      : Enabled"}
    _, cmds, state = run_fake(nvidia_driver, responses, {**DATA, "nvidia_smi_command": SMI, "nvidia_reboot_timeout": 1})
    assert not state.failed_hosts
    assert not any(REBOOT in c for c in cmds)
    run = "\n".join(cmds)
    assert f"{SMI} --query-gpu=driver_version" in run and f"{SMI} -q 2>&1" in run
    # (the package nvidia-smi is still installed by name)
    assert not re.search(r"(^|[\s;(|&])nvidia-smi (-q|--query)", run)
    # and the other way round: it cannot talk to the driver: installed but not loaded, one reboot,
    # the warning naming the command
    responses[f"{SMI} --query-gpu=driver_version"] = NO_COMMUNICATION
    _, cmds, _ = run_fake(nvidia_driver, responses, {**DATA, "nvidia_smi_command": SMI, "nvidia_reboot_timeout": 1})
    assert any(REBOOT in c for c in cmds)
