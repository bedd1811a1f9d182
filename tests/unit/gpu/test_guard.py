"""The GPU-loss guard: reading the host's and the container's `nvidia-smi -L`, the verdict, and
where the deploy plans it (pyinfra's @fake connector). On real test hosts: tests/testbed/test_drain.py."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given
from hypothesis import strategies as st
from pyinfra.api import deploy
from pyinfra.operations import server

from tests.support.fakehost import defaults, run_fake
from tritonfleet.gpu import guard as gpuguard

T4 = "GPU 0: Tesla T4 (UUID: GPU-bf507abe-ec25-2053-5435-1c82511a3ae8)"
T4B = "GPU 1: Tesla T4 (UUID: GPU-a1329f2e-1e73-88f2-4d4b-1ce18debbc6d)"
LOST = "Failed to initialize NVML: Unknown Error"  # NVIDIA/nvidia-container-toolkit#1227


def answer(host: list[str], host_rc: int, container: list[str] | None, container_rc: int = 0) -> str:
    out = ["@@host", *host, f"rc={host_rc}", "@@container"]
    out += ["not-running"] if container is None else [*container, f"rc={container_rc}"]
    return "\n".join([*out, "@@end"])


def test_verdicts_on_real_outputs():
    assert gpuguard.verdict(gpuguard.parse(answer([T4, T4B], 0, [T4B, T4])))[0] == "ok"
    kind, say = gpuguard.verdict(gpuguard.parse(answer([T4], 0, [LOST], 255)))
    assert kind == "lost" and LOST in say and T4 in say
    assert gpuguard.verdict(gpuguard.parse(answer([T4], 0, None)))[0] == "not-running"
    smi_fail = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    assert gpuguard.verdict(gpuguard.parse(answer([smi_fail], 9, [T4])))[0] == "host-failed"
    assert gpuguard.verdict(gpuguard.parse(answer([T4, T4B], 0, [T4])))[0] == "lost"  # one GPU gone


gpu_line = st.builds(lambda i, u: f"GPU {i}: NVIDIA L4 (UUID: GPU-{u:08x}-0000-0000-0000-000000000000)",
                     st.integers(0, 7), st.integers(0, 2**32 - 1))


@given(st.lists(gpu_line, min_size=1, max_size=4, unique=True), st.lists(gpu_line, max_size=4, unique=True),
       st.sampled_from([0, 255]))
def test_ok_exactly_when_the_container_lists_the_hosts_gpus(host, container, rc):
    kind, _ = gpuguard.verdict(gpuguard.parse(answer(host, 0, container, rc)))
    assert (kind == "ok") == (rc == 0 and sorted(container) == sorted(host))
    assert kind in ("ok", "lost")


def test_compare_command_quotes_the_container_name():
    cmd = gpuguard.compare_command("triton; rm -rf /")
    assert "'triton; rm -rf /'" in cmd and "docker exec 'triton; rm -rf /' nvidia-smi -L" in cmd


# ------------------------------------------------------------------ in the deploy (@fake hosts)

def _responses() -> dict:
    from tritonfleet.serving.unit import render_unit, unit_context

    data = defaults("t4")
    unit_sha = hashlib.sha256(render_unit(unit_context(data)).encode()).hexdigest()
    return {
        "echo @@host": answer([T4], 0, [T4]).splitlines(),  # first: the guard's command also has docker inspect
        "docker inspect --format '{{.State.Running}}": ["running=true", "image=sha256:" + "a" * 64, "started=1000.5",
                                                        "/etc/systemd/system/triton.service=900.0",
                                                        "/opt/triton/model_repository=950.0"],
        "docker image inspect": "sha256:" + "a" * 64,
        re.compile(r"\[ -f /etc/systemd/system/triton.service \] && stat"): ["mode=644 user=root group=root", unit_sha],
        re.compile(r"\[ -f /etc/tritonfleet/triton-api-key \] && stat"): ["mode=600 user=root group=root", "0" * 64],
        "systemctl show": ["ActiveState=active", "UnitFileState=enabled"],
    }


def _names(state) -> list[str]:
    return [n for op in state.get_op_order() for n in state.op_meta[op].names]


def test_guard_runs_after_a_host_layer_reload_while_triton_keeps_running():
    from tritonfleet.serving.ops import gpu_guard as guard_ops
    from tritonfleet.steps.triton import triton_service

    @deploy("host layer")
    def reload_then_triton():
        guard_ops.note("persistenced drop-in", server.shell(name="systemctl daemon-reload",
                                                            commands=["systemctl daemon-reload"]))
        triton_service()

    _, cmds, state = run_fake(reload_then_triton, _responses(), {})
    names = _names(state)
    assert any("GPU-loss guard" in n for n in names), names
    assert not any("restart triton" in n for n in names)
    assert any("docker exec triton-server nvidia-smi -L" in str(c) for c in cmds)
    assert not state.failed_hosts


def test_no_guard_without_a_reload_or_when_triton_restarts_anyway():
    from tritonfleet.serving.ops import gpu_guard as guard_ops
    from tritonfleet.steps.triton import triton_service

    _, _, state = run_fake(triton_service, _responses(), {})
    assert not any("GPU-loss guard" in n for n in _names(state))

    @deploy("host layer")
    def reload_and_unit_change():
        guard_ops.note("persistenced drop-in", server.shell(name="systemctl daemon-reload",
                                                            commands=["systemctl daemon-reload"]))
        triton_service()

    _, _, state = run_fake(reload_and_unit_change, _responses(), {"triton_stop_timeout": 41})
    names = _names(state)
    assert any("restart triton" in n for n in names) and not any("GPU-loss guard" in n for n in names)


def test_toolkit_step_installs_the_udev_rule_and_makes_the_symlinks():
    from tests.unit.steps.test_steps_fake import BASE
    from tritonfleet.steps.host_prep import container_toolkit

    host, cmds, state = run_fake(container_toolkit, BASE, {})
    assert host.connector.uploads[gpuguard.UDEV_RULE_PATH] == gpuguard.UDEV_RULE
    assert gpuguard.CREATE_COMMAND in " ".join(map(str, cmds))
    # symlinks there and the rule in place: neither again
    rule_sha = hashlib.sha256(gpuguard.UDEV_RULE.encode()).hexdigest()
    done = {**BASE, gpuguard.DEVCHAR_COMMAND: "present",
            re.compile(r"\[ -f /lib/udev/rules.d/71-nvidia-dev-char.rules \] && stat"):
                ["mode=644 user=root group=root", rule_sha]}
    host, cmds, state = run_fake(container_toolkit, done, {})
    assert gpuguard.UDEV_RULE_PATH not in host.connector.uploads
    assert gpuguard.CREATE_COMMAND not in " ".join(map(str, cmds))
