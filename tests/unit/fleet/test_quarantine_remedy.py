"""The quarantine's remediation (tritonfleet.fleet.quarantine.remedy): the decision over generated
histories (hypothesis), and the reset's commands run against the testbed's stand-in nvidia-smi
(its ``-r`` and ``-pm``) with a systemctl that only records."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet.fleet.quarantine.planning import Alert
from tritonfleet.fleet.quarantine.remedy import (
    RESET_GPU,
    RESTART_BM,
    History,
    action_of,
    decide,
    reset_script,
)

WINDOW = 3600.0
BUS = "00000000:00:1E.0"


def alert(**labels) -> Alert:
    return Alert("fp", "GpuXidCritical", "h", "2027-01-01T00:00:00Z", labels=labels)


def test_the_action_is_the_label_else_the_table_and_a_reboot_wins():
    assert action_of([alert(xid="63")]) == RESET_GPU
    assert action_of([alert(xid="79")]) == RESTART_BM
    assert action_of([alert(xid="13")]) == ""
    assert action_of([alert(xid="79", action=RESET_GPU)]) == RESET_GPU  # the catalog's label first
    assert action_of([alert(xid="63"), alert(action=RESTART_BM)]) == RESTART_BM
    assert action_of([alert()]) == ""


@pytest.mark.parametrize(("action", "history", "step"), [
    (RESET_GPU, History(), "reset"),
    (RESET_GPU, History(resets=[10.0]), "reboot"),           # the reset did not clear it
    (RESTART_BM, History(), "reboot"),
    (RESET_GPU, History(resets=[10.0], reboots=[20.0]), ""),  # after a reboot: an operator
    ("", History(), ""),
    (RESET_GPU, History(back_at=1000.0), "hold"),             # back 500 s before this fault
    (RESET_GPU, History(back_at=1000.0 - WINDOW - 1), "reset"),  # long ago: a new fault
])
def test_decide(action, history, step):
    assert decide(action, history, 1500.0, WINDOW).step == step


@settings(max_examples=300, deadline=None)
@given(action=st.sampled_from([RESET_GPU, RESTART_BM, "", "RESTART_APP"]),
       resets=st.integers(0, 3), reboots=st.integers(0, 2),
       back=st.one_of(st.just(0.0), st.floats(0, 10_000)), fault=st.floats(0, 10_000))
def test_a_host_is_never_reset_twice_nor_rebooted_twice_and_a_quick_refault_is_held(action, resets, reboots, back,
                                                                                   fault):
    h = History([1.0] * resets, [2.0] * reboots, back)
    d = decide(action, h, fault, WINDOW)
    refault = bool(back) and 0 <= fault - back <= WINDOW
    assert (d.step == "hold") == refault
    if d.step == "reset":
        assert action == RESET_GPU and not resets and not reboots
    if d.step == "reboot":
        assert not reboots and action in (RESET_GPU, RESTART_BM)
        assert action == RESTART_BM or resets
    if action not in (RESET_GPU, RESTART_BM):
        assert d.step in ("", "hold")


def run_reset(standin, tmp_path, **faults) -> tuple[subprocess.CompletedProcess, list[str]]:
    smi = standin("T4", **faults)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").symlink_to(smi)
    calls = tmp_path / "systemctl.calls"
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n")
    (bin_dir / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(["sh", "-c", reset_script("tritonserver", [BUS])], capture_output=True, text=True, env=env)
    return res, calls.read_text().splitlines() if calls.exists() else []


def test_a_reset_turns_persistence_mode_off_resets_restores_it_and_starts_triton_again(standin, tmp_path):
    root = tmp_path / "root"
    (root / "run/nvidia-standin/persistence-mode").write_text("Enabled\n")
    res, calls = run_reset(standin, tmp_path, ECC_UNCORRECTED_VOLATILE="2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert calls == ["stop tritonserver", "start tritonserver"]
    assert f"Disabled persistence mode for GPU {BUS}." in res.stdout
    assert f"GPU {BUS} was successfully reset." in res.stdout
    assert f"Enabled persistence mode for GPU {BUS}." in res.stdout
    assert (root / "run/nvidia-standin/persistence-mode").read_text().strip() == "Enabled"
    smi = tmp_path / "bin" / "nvidia-smi"
    out = subprocess.run([str(smi), "--query-gpu=ecc.errors.uncorrected.volatile.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    assert out == "0"


def test_the_stand_in_refuses_a_reset_with_persistence_mode_on(standin, tmp_path):
    smi = standin("T4")
    (tmp_path / "root/run/nvidia-standin/persistence-mode").write_text("Enabled\n")
    res = subprocess.run([str(smi), "-r", "-i", BUS], capture_output=True, text=True)
    assert res.returncode == 255 and "persistence mode is on" in res.stdout


def test_a_gpu_off_the_bus_fails_the_reset_and_triton_is_started_again(standin, tmp_path):
    # the host's only GPU gone: nvidia-smi finds no device (exit 6), the reset is not tried
    res, calls = run_reset(standin, tmp_path, GPU_MISSING="0")
    assert res.returncode == 6 and "No devices were found" in res.stdout, res.stdout + res.stderr
    assert calls == ["stop tritonserver", "start tritonserver"]
