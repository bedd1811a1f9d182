"""nvidia_smi_command: the command the deploy asks the host's driver with (default nvidia-smi),
on pyinfra's @fake connector: the driver step's loaded-driver and persistence checks, pre-flight's
GPU check, the GPU verification's host half and the Triton step's GPU guard use it; inside
`docker run --gpus all` the container's own nvidia-smi is asked. (The testbed points a host
without a GPU at its stand-in's answer: tests/testbed/test_driver_source.py.)"""

from __future__ import annotations

from tests.support.fakehost import run_fake
from tests.unit.steps.test_verify import QUERY_T4, SUMMARY, answer
from tritonfleet.gpu import facts as gpufacts
from tritonfleet.gpu import guard as gpuguard
from tritonfleet.steps.verify import SECTION, probe_command, verify_gpus

SMI = "/opt/gpu-answer/smi"  # a path whose tail is not "nvidia-smi": the fake host tells the two apart
REBOOT = "( sleep 1 && reboot )"


def test_the_gpu_verification_asks_the_host_with_the_command_and_the_container_with_its_own():
    image = "nvidia/cuda:12.8.1-base-ubuntu22.04"
    _, cmds, state = run_fake(verify_gpus, {SECTION: answer(QUERY_T4, SUMMARY, QUERY_T4, SUMMARY)},
                              {"nvidia_smi_command": SMI}, yes=True, load_image=False)
    assert not state.failed_hosts
    probe = next(c for c in cmds if SECTION in c)
    assert probe == probe_command(image, mode="changes", smi=SMI)
    host_part, container = probe.split("docker run", 1)
    assert f"q=$({gpufacts.query_command(smi=SMI)} 2>&1)" in host_part and f"; {SMI} -q 2>&1 | grep " in host_part
    assert "nvidia-smi" not in host_part.replace(f"{SMI}", "")
    assert SMI not in container and f"{gpufacts.QUERY_COMMAND} 2>&1" in container
    # the default: nvidia-smi on both sides, as before
    assert probe_command(image, mode="changes") == probe_command(image, mode="changes", smi="nvidia-smi")
    assert "q=$(nvidia-smi --query-gpu=" in probe_command(image)


def test_preflight_gpu_fact_and_gpu_guard_use_the_command():
    fact = gpufacts.NvidiaGpus()
    own, routed = fact.command(), fact.command(smi=SMI)
    assert routed == own.replace("nvidia-smi --query-gpu", f"{SMI} --query-gpu").replace(
        "command -v nvidia-smi ", f"command -v {SMI} ")
    assert f"command -v {SMI} " in routed and "nvidia-smi --query" not in routed
    guard = gpuguard.compare_command("triton", smi=SMI)
    assert f"; {SMI} -L 2>&1;" in guard and "docker exec triton nvidia-smi -L" in guard


def test_status_asks_the_driver_with_the_command():
    from tritonfleet.fleet import probe
    from tritonfleet.settings.defaults import DEFAULTS

    def get(data):
        return {**DEFAULTS, **data}

    routed, own = probe.command(get({"nvidia_smi_command": SMI})), probe.command(get({}))
    assert f"echo @gpu; {SMI} --query-gpu=name,driver_version" in routed
    assert "echo @gpu; nvidia-smi --query-gpu=name,driver_version" in own
