"""The boot-kernel rule's reboots on pyinfra's @fake connector, with their real waits: a reboot
drained first, and a module built for the boot kernel letting the reboot go on (the rule itself:
tests/unit/host/test_boot_kernel.py).
"""

from __future__ import annotations

from tests.support.fakehost import run_fake
from tests.unit.host.test_boot_kernel import KEY, REBOOT, _mismatch
from tests.unit.steps.test_steps_fake import DATA
from tritonfleet.steps.host_prep import nvidia_driver


def test_a_module_built_for_the_boot_kernel_lets_the_reboot_go_on():
    answer = ["running=6.1.0-28-amd64", "boot=6.1.0-29-amd64", "step=install linux-headers-6.1.0-29-amd64",
              "module=built"]
    _, cmds, _ = run_fake(nvidia_driver, _mismatch(answer), {**DATA, "nvidia_reboot_timeout": 1})
    assert any(REBOOT in c for c in cmds)
    assert [i for i, c in enumerate(cmds) if KEY in c][0] < [i for i, c in enumerate(cmds) if REBOOT in c][0]


def test_a_reboot_is_drained_first(tmp_path):
    from tritonfleet.serving.drain import METRICS_MARK

    log = tmp_path / "hooks.log"
    answer = ["running=a", "boot=a", "module=yes"]
    # Triton's metrics as the drain reads them on the host: nothing pending, counters still
    metrics = [f"{METRICS_MARK} triton http://127.0.0.1:8002/metrics",
               "# TYPE nv_inference_request_success counter", 'nv_inference_request_success{model="m",version="1"} 7',
               'nv_inference_pending_request_count{model="m",version="1"} 0']
    _, cmds, _ = run_fake(nvidia_driver, {**_mismatch(answer), "curl -sSf -m 5": metrics},
                          {**DATA, "nvidia_reboot_timeout": 1, "lb": "hooks",
                           "lb_drain_command": f"echo drain $TRITONFLEET_HOST >> {log}",
                           "lb_ready_command": "true"})
    assert any(REBOOT in c for c in cmds) and log.read_text() == "drain @fake/gpu1\n"
