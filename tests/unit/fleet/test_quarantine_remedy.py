"""The quarantine's remediation (tritonfleet.fleet.quarantine.remedy and .remediation): the decision
over generated histories (hypothesis), the reset's commands run against the testbed's stand-in
nvidia-smi (its ``-r`` and ``-pm``) with a systemctl that only records, and the real Receiver
running it on a fake clock with hosts that only record what they ran."""

from __future__ import annotations

import os
import subprocess
import threading
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.fleet.test_quarantine_breaker import Clock, Lb
from tritonfleet.fleet.quarantine import receiver as receiver_mod
from tritonfleet.fleet.quarantine import remediation as remediation_mod
from tritonfleet.fleet.quarantine.planning import FiringAlert
from tritonfleet.fleet.quarantine.remediation import smi_bus_id
from tritonfleet.fleet.quarantine.remedy import (
    RESET_GPU,
    RESTART_BM,
    History,
    action_of,
    decide,
    reset_script,
)
from tritonfleet.inventory.roster import FleetHost

WINDOW = 3600.0
BUS = "00000000:00:1E.0"


def alert(**labels) -> FiringAlert:
    return FiringAlert("fp", "GpuXidCritical", "h", "2027-01-01T00:00:00Z", labels=labels)


def test_the_action_is_the_label_else_the_table_and_a_reboot_wins():
    assert action_of([alert(xid="63")]) == RESET_GPU
    assert action_of([alert(xid="79")]) == RESTART_BM
    assert action_of([alert(xid="13")]) == ""
    assert action_of([alert(xid="79", action=RESET_GPU)]) == RESET_GPU  # the catalog's label first
    assert action_of([alert(xid="63"), alert(action=RESTART_BM)]) == RESTART_BM
    assert action_of([alert()]) == ""
    # a quarantine_xids Xid the catalog says to ignore: the sourced table by its number
    assert action_of([alert(xid="63", action="IGNORE")]) == RESET_GPU
    assert action_of([alert(xid="13", action="RESTART_APP")]) == ""


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


# ---- the receiver runs it (quarantine_remediate) --------------------------------------------

@pytest.mark.parametrize(("pci", "bus"), [("0000:00:1e", "00000000:00:1E.0"), ("0000:3b:00", "00000000:3B:00.0"),
                                          ("00000000:31:00.0", "00000000:31:00.0"), ("3b:00", "00000000:3B:00.0"),
                                          ("x", None), ("0000:00:1e; reboot", None)])
def test_the_kernel_log_s_pci_address_as_nvidia_smi_takes_it(pci, bus):
    assert smi_bus_id(pci) == bus


class Host:
    """The hosts' side of the remediation: what ran, and what it answered."""

    def __init__(self, reset_ok: bool = True):
        self.reset_ok, self.ran = reset_ok, []

    def __call__(self, fh, script: str) -> tuple[bool, str]:
        self.ran.append((fh.name, script))
        if "nvidia-smi -r" in script:
            return self.reset_ok, "GPU 00000000:00:1E.0 was successfully reset.\nAll done." if self.reset_ok else \
                "Unable to reset GPU"
        return True, "NVRM: Xid (PCI:0000:00:1e): 63, Row Remapper\n"


def remediating(tmp_path, host: Host, remediate: bool = True):
    hosts = [FleetHost(f"h{i}", [], {"quarantine_budget": 1, "lb_drain_timeout": 20, "quarantine_remediate": remediate,
                                     "triton_service": "triton", "quarantine_refault_window": WINDOW})
             for i in range(4)]
    out: set[str] = set()
    lines: list[str] = []
    rec = receiver_mod.Receiver(hosts, tmp_path, interval=1, gate_timeout=1, resolve_grace=0, echo=lines.append,
                                balancer_of=lambda fh: Lb(fh.name, out), gate=lambda fh, t: (True, "fake gate"),
                                runner=host)
    return rec, out, lines


def xid(rec, host: str, number: int, fault_at: float, fp: str = "fp") -> None:
    rec.apply_notification({"alerts": [{
        "status": "firing", "fingerprint": fp, "startsAt": "2027-01-01T00:00:00Z",
        "labels": {"alertname": "GpuXidCritical", "host": host, "quarantine": "true", "xid": str(number),
                   "pci": "0000:00:1e"},
        "annotations": {"summary": f"Xid {number}", "fault_seen": f"{fault_at:.3f}"}}]})


def test_a_reset_eligible_fault_is_reset_returns_and_a_quick_refault_is_held_with_evidence(tmp_path):
    clock, host = Clock(), Host()
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(remediation_mod, "time", clock):
        rec, out, lines = remediating(tmp_path, host)
        xid(rec, "h1", 63, clock.t - 1)
        rec.round()  # out, then the reset
        assert out == {"h1"} and [n for n, _ in host.ran] == ["h1"]
        assert "nvidia-smi -r -i 00000000:00:1E.0" in host.ran[0][1] and "systemctl stop triton" in host.ran[0][1]
        assert rec.records["h1"].remedied_at == clock.t
        assert 'tritonfleet_quarantine_event_seconds_count{stage="remedied"} 1.0' in rec.latency.text().decode()
        clock.t += 5
        rec.round()  # its alert (a count since boot, still firing) is acknowledged up to the reset: back
        assert out == set() and any(" h1 returned: " in line for line in lines)
        clock.t += 60
        xid(rec, "h1", 63, clock.t - 1)  # the same alert, a fault seen after the reset: it counts
        rec.round()
        assert out == {"h1"} and rec.records["h1"].held
        assert len(host.ran) == 2 and "journalctl -k -b" in host.ran[1][1]  # evidence, no second reset
        saved = list((tmp_path / "evidence").iterdir())
        assert len(saved) == 1 and "Xid (PCI:0000:00:1e): 63" in saved[0].read_text()
        assert any("h1 held: it faulted again 59 s after it came back" in line and str(saved[0]) in line
                   for line in lines)
        clock.t += 5
        rec.round()
        assert out == {"h1"} and len(host.ran) == 2  # held: nothing more until an operator


def test_a_reset_that_fails_is_not_tried_again_and_the_host_stays_out_for_a_reboot(tmp_path):
    clock, host = Clock(), Host(reset_ok=False)
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(remediation_mod, "time", clock):
        rec, out, lines = remediating(tmp_path, host)
        xid(rec, "h2", 63, clock.t - 1)
        for _ in range(3):
            rec.round()
            clock.t += 5
        assert out == {"h2"} and len(host.ran) == 1
        assert any("h2 reset-failed: the GPU reset failed: Unable to reset GPU" in line for line in lines)
        assert len([line for line in lines if " h2 needs-reboot: the GPU reset did not clear it" in line]) == 1


def test_a_fault_that_asks_for_a_reboot_runs_nothing_and_without_remediation_nothing_runs(tmp_path):
    clock, host = Clock(), Host()
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(remediation_mod, "time", clock):
        rec, out, lines = remediating(tmp_path / "a", host)
        xid(rec, "h3", 79, clock.t - 1)
        rec.round()
        assert out == {"h3"} and not host.ran and any("h3 needs-reboot: " in line for line in lines)
        rec, out, lines = remediating(tmp_path / "b", host, remediate=False)
        xid(rec, "h3", 63, clock.t - 1)
        rec.round()
        assert out == {"h3"} and not host.ran


def test_the_stand_ins_switch_fails_the_reset_and_triton_is_started_again(standin, tmp_path):
    res, calls = run_reset(standin, tmp_path, RESET_FAILS="1")
    assert res.returncode == 255 and "Unable to reset GPU" in res.stdout, res.stdout + res.stderr
    assert calls == ["stop tritonserver", "start tritonserver"]
    assert not (tmp_path / "root/run/nvidia-standin/last-reset").exists()


class Rebooter:
    def __init__(self, ok: bool = True):
        self.ok, self.hosts = ok, []

    def __call__(self, fh):
        self.hosts.append(fh.name)
        return (True, "") if self.ok else (False, "no operation ran on it")


def reboot_rig(tmp_path, host: Host, rebooter: Rebooter):
    rec, out, lines = remediating(tmp_path, host)
    rec.rebooter = rebooter
    return rec, out, lines


def wait_reboot(rec, name: str) -> None:
    rec.rebooting[name][0].join(10)


@pytest.mark.parametrize("ok", [True, False])
def test_a_reset_that_fails_is_followed_by_one_reboot_then_the_warm_gate(tmp_path, ok):
    clock, host, rebooter = Clock(), Host(reset_ok=False), Rebooter(ok)
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(remediation_mod, "time", clock):
        rec, out, lines = reboot_rig(tmp_path, host, rebooter)
        xid(rec, "h2", 63, clock.t - 1)
        rec.round()  # out, the reset fails
        rec.round()  # the reboot starts (its own thread: the rounds go on)
        assert "h2" in rec.rebooting and out == {"h2"}
        wait_reboot(rec, "h2")
        clock.t += 90
        rec.round()  # over: acknowledged up to the reboot (ok), or said and out for an operator
        rec.round()
        for _ in range(3):
            clock.t += 5
            rec.round()
        assert rebooter.hosts == ["h2"] and len(host.ran) == 1  # one reset, one reboot, never again
        if ok:
            assert out == set() and any(" h2 reboot-done: rebooted in 90.0 s" in line for line in lines)
            assert rec.history["h2"].back_at  # a fault within the refault window now holds it
            assert 'tritonfleet_quarantine_event_seconds_count{stage="remedied"} 1.0' in rec.latency.text().decode()
        else:
            assert out == {"h2"} and any(" h2 reboot-failed: the reboot failed: no operation ran" in line
                                         for line in lines)
        assert not any(" h2 needs-reboot" in line for line in lines)


def test_a_fault_that_asks_for_a_reboot_is_rebooted_without_a_reset(tmp_path):
    clock, host, rebooter = Clock(), Host(), Rebooter()
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(remediation_mod, "time", clock):
        rec, out, lines = reboot_rig(tmp_path, host, rebooter)
        xid(rec, "h3", 79, clock.t - 1)
        rec.round()
        wait_reboot(rec, "h3")
        rec.round()
        rec.round()
        assert rebooter.hosts == ["h3"] and not host.ran and out == set()


def test_without_the_reboot_deploy_file_the_receiver_only_says_it_needs_a_reboot(tmp_path):
    clock, host = Clock(), Host()
    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(remediation_mod, "time", clock):
        rec, out, lines = remediating(tmp_path, host)
        rec.rebooter = remediation_mod.PyinfraRebooter("inv.py", str(tmp_path / "absent.py"), tmp_path / "logs")
        xid(rec, "h3", 79, clock.t - 1)
        rec.round()
        assert out == {"h3"} and not rec.rebooting and any(" h3 needs-reboot: " in line for line in lines)


def test_a_host_does_not_return_while_it_reboots_even_when_its_alerts_resolve(tmp_path):
    """A rebooting host's collector restarts with the kernel log of the new boot: its alerts
    resolve before the reboot is over; the host waits for the reboot all the same."""
    clock, host, release = Clock(), Host(), threading.Event()

    def slow(fh):
        release.wait(10)
        return True, ""

    with mock.patch.object(receiver_mod, "time", clock), mock.patch.object(remediation_mod, "time", clock):
        rec, out, lines = reboot_rig(tmp_path, host, slow)
        xid(rec, "h3", 79, clock.t - 1)
        rec.round()
        assert "h3" in rec.rebooting
        rec.apply_notification({"alerts": [{"status": "resolved", "fingerprint": "fp", "startsAt": "2027-01-01T00:00:00Z",
                                             "labels": {"alertname": "GpuXidCritical", "host": "h3",
                                                        "quarantine": "true", "xid": "79"}}]})
        for _ in range(3):
            clock.t += 20
            rec.round()
        assert out == {"h3"} and not any(" h3 gate:" in line for line in lines)
        release.set()
        wait_reboot(rec, "h3")
        rec.round()
        assert out == set() and any(" h3 reboot-done:" in line for line in lines)
