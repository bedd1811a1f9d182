"""The apt/dpkg lock wrapper, run by a real shell against commands that fail the way apt-get does
while another process holds its lock. (tests/testbed/test_faults.py holds the real locks on a testbed host.)"""

from __future__ import annotations

import subprocess
import time

from tritonfleet.host.ops.aptlock import wrap

LOCKED = ("echo 'E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 "
          "(unattended-upgr)' >&2; echo 'E: Unable to acquire the dpkg frontend lock "
          "(/var/lib/dpkg/lock-frontend), is another process using it?' >&2; exit 100")


def run(command: str, seconds: int):
    script = wrap(command, seconds).get_raw_value()
    start = time.monotonic()
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    return res, time.monotonic() - start


def counting(tmp_path, locked_times: int) -> str:
    n = tmp_path / "n"
    n.write_text("0")
    return (f"c=$(( $(cat {n}) + 1 )); echo $c > {n}; "
            f"if [ $c -le {locked_times} ]; then {LOCKED}; fi; echo installed")


def test_waits_while_the_lock_is_held_then_runs(tmp_path):
    res, took = run(counting(tmp_path, 2), 60)
    assert res.returncode == 0, res.stderr
    assert "installed" in res.stdout and "waited 4 s for the apt/dpkg lock" in res.stdout
    assert (tmp_path / "n").read_text().strip() == "3" and took >= 4


def test_gives_up_after_the_bound_naming_the_holder(tmp_path):
    res, took = run(counting(tmp_path, 1000), 3)
    assert res.returncode == 100
    assert "Could not get lock" in res.stderr  # apt's own words are kept
    assert "stayed held by another process for more than 3 s (held by process 4242 (unattended-upgr))" in res.stderr
    assert "changed nothing" in res.stderr and "apt_lock_timeout" in res.stderr
    # the bound is counted in whole seconds (date +%s): a start late in a second waits just over 2 s
    assert 2 <= took < 30


def test_other_failures_are_not_retried(tmp_path):
    n = tmp_path / "n"
    res, _ = run(f"echo x >> {n}; echo 'E: Unable to locate package nope' >&2; exit 100", 60)
    assert res.returncode == 100 and "Unable to locate package nope" in res.stderr
    assert n.read_text().count("x") == 1 and "apt/dpkg lock" not in res.stderr


def test_zero_does_not_wait(tmp_path):
    res, took = run(counting(tmp_path, 1), 0)
    assert res.returncode == 100 and (tmp_path / "n").read_text().strip() == "1" and took < 5


# ---------------------------------------------------------------- a dpkg run that was cut

def test_dpkg_state_reports_what_a_cut_dpkg_run_left():
    from tritonfleet.host.facts import DpkgState

    state = DpkgState().process(["ii \tdkms\t3.0.10-8", "iF \ttf-slow\t1.0", "iU \tother\t2",
                                 "rc \told\t1", "dpkg-journal=0000"])
    assert state["installed"] == {"dkms": ["3.0.10-8"]}
    assert state["interrupted"] == ["tf-slow", "other", "/var/lib/dpkg/updates/0000"]


def test_an_interrupted_dpkg_is_finished_before_the_first_package_step():
    """(On a real host the later steps then find dpkg settled: tests/testbed/test_hostprep.py.)"""
    from pyinfra.api import deploy

    from tests.support.fakehost import run_fake
    from tests.unit.steps.test_steps_fake import BASE, DATA
    from tritonfleet.steps.host_prep import container_toolkit, nvidia_driver

    @deploy("driver and toolkit")
    def both():
        nvidia_driver()
        container_toolkit()

    cut = {**BASE, "dpkg-query -W": ["iF \ttf-slow\t1.0", "dpkg-journal=0000"]}
    _, cmds, state = run_fake(both, cut, DATA)
    repairs = [i for i, c in enumerate(cmds) if "dpkg --configure -a;" in c]
    assert repairs
    first_apt = next(i for i, c in enumerate(cmds) if "apt-get" in c and "dpkg --configure -a" not in c)
    assert repairs[0] < first_apt
    assert "was interrupted earlier (tf-slow, /var/lib/dpkg/updates/0000)" in cmds[repairs[0]]
    _, cmds, _ = run_fake(both, BASE, DATA)
    assert not any("dpkg --configure -a;" in c for c in cmds)


def test_the_repair_runs_and_reports(tmp_path):
    """The repair's shell, with a dpkg that finishes (or fails) the way the real one does."""
    from tritonfleet.host.ops.aptlock import REPAIR

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for rc in (0, 1):
        (bin_dir / "dpkg").write_text(f"#!/bin/sh\necho \"dpkg $*\"\nexit {rc}\n")
        (bin_dir / "dpkg").chmod(0o755)
        script = wrap(REPAIR.format(what="tf-slow"), 5).get_raw_value()
        res = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                             env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
        out = res.stdout + res.stderr
        assert "dpkg --configure -a" in out and "was interrupted earlier (tf-slow)" in out
        assert res.returncode == rc
        if rc:
            assert "dpkg --configure -a failed on" in res.stderr and "dpkg --audit" in res.stderr
