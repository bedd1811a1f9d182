"""A driver branch change as a rollout on real test hosts (tritonfleet.fleet.rollout.driver): the
canary moves from 580 to 570 through the full deploy (packages, reboot, GPU check, Triton), its CUDA
validation (tritonfleet.gpu.cuda_check's vectorAdd in the Triton image, answered by the stand-in
driver's libcuda.so.1) fails on 570, it goes back to 580 by itself, is validated there and held;
the other host is never touched; a later rollout leaves the held host out until --release-holds.

Leaves the session's hosts as the shared `deployed` fixture made them (580, no hold, no fault)."""

from __future__ import annotations

import json

from tests.support.testbed import pyinfra, ssh, tritonfleet
from tritonfleet.host.driver_hold import HOLD_FILE

INV = "inventories/testbed.py"
FAULT = "/etc/nvidia-standin/cuda-fault"


def rollout(*args: str) -> tuple[int, dict, str]:
    res = tritonfleet("rollout", INV, "deploys/triton.py", *args, "--json", timeout=2400)
    try:
        report = json.loads(res.stdout)
    except ValueError:
        report = {}
    return res.returncode, report, res.stderr


def driver_of(h) -> str:
    return ssh(h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").strip()


def test_a_canary_failing_cuda_validation_comes_back_holds_and_touches_no_other_host(deployed):
    state = deployed[0]
    a, b = state.hosts[0], state.hosts[1]
    before = {h.name: driver_of(h) for h in (a, b)}
    assert all(v.startswith("580.") for v in before.values()), before
    boot_b = ssh(b, "cat /proc/sys/kernel/random/boot_id")
    ssh(a, f"echo 570 > {FAULT}")  # the stand-in driver's kernels fault under 570 on the canary
    try:
        rc, report, err = rollout("--limit", f"{a.name},{b.name}", "--canary", "1", "--batch", "100%",
                                  "--data", "nvidia_driver_branch=570")
        assert rc == 1, err[-4000:]
        by = {r["host"]: r for r in report["hosts"]}
        assert by[a.name]["result"] == "rolled back", (by[a.name], err[-6000:])
        assert "driver held at 580: 570 failed its validation" in by[a.name]["detail"]
        assert "CUDA_ERROR_LAUNCH_FAILED" in by[a.name]["detail"]
        assert by[b.name]["result"] == "not touched" and report["halted"], report["halted"]
        steps = report["driver"]["hosts"][a.name]["validations"]
        assert [(v["branch"], v["passed"]) for v in steps] == [("570", False), ("580", True)], steps
        # the canary runs 580 again, validated and held; the other host was never deployed or rebooted
        assert driver_of(a).startswith("580.") and driver_of(b) == before[b.name]
        assert ssh(b, "cat /proc/sys/kernel/random/boot_id") == boot_b
        hold = json.loads(ssh(a, f"cat {HOLD_FILE}"))
        assert hold["branch"] == "580" and hold["tried"] == "570"
        held = set(ssh(a, "apt-mark showhold").split())  # the branch's metapackage (either flavour) held again
        assert {"nvidia-open-580", "cuda-drivers-580"} & held and not {"nvidia-open-570", "cuda-drivers-570"} & held
        # status shows the hold as drift
        res = tritonfleet("status", INV, "--json", "--limit", a.name)
        row = json.loads(res.stdout)[0]
        assert any("driver held at 580" in d for d in row["drift"]), row["drift"]

        # a later rollout to 570 leaves the held host out (the fault still there), and touches nothing
        rc, report, err = rollout("--limit", a.name, "--data", "nvidia_driver_branch=570")
        assert rc == 1 and report["hosts"][0]["result"] == "held", report
        assert driver_of(a).startswith("580.")
    finally:
        ssh(a, f"rm -f {FAULT} {HOLD_FILE}", check=False)
        if not driver_of(a).startswith("580."):  # the session's hosts as the fixture made them
            res, _ = pyinfra("deploys/triton.py", "--limit", a.name)
            assert res.returncode == 0, res.stderr[-3000:]
