"""Faults injected into testbed hosts while the deploy or a rollout runs. Each test checks that
the tool stops cleanly, leaves nothing half-applied, keeps the old version serving, says what
went wrong, and that a re-run converges. Every test leaves the fleet as the `deployed` fixture
made it (default repository, driver branch 580, mode none).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from testbed_util import (
    INVENTORY,
    PYINFRA,
    block_ssh,
    changed_ops,
    container_started,
    env,
    infer_resnet,
    live_release,
    pyinfra,
    repository_copy,
    ssh,
    tritonfleet,
    unblock_ssh,
)

from tritonfleet import ROOT
from tritonfleet.testbed import hosts

pytestmark = pytest.mark.testbed


def incoming(h) -> list[Path]:
    """Model releases being written on the host (seen from outside, through its root fs)."""
    return list((h.merged / "opt/triton/releases").glob(".incoming-*"))


def when(condition, then, timeout: float = 300) -> threading.Thread:
    """Run ``then()`` as soon as ``condition()`` holds (polled every 20 ms), in a thread."""
    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                then()
                return
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def big_repo(tmp_path, mb: int = 300) -> Path:
    """The default repository plus one large incompressible file (a slow transfer)."""
    repo = repository_copy(tmp_path / "big")
    with open(repo / "resnet50_onnx" / "1" / "extra-weights.bin", "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))
    return repo


def serving(h) -> bool:
    try:
        return infer_resnet(h.address).shape == (1, 1000)
    except Exception:  # noqa: BLE001
        return False


def converge(*extra: str) -> None:
    res, data = pyinfra("deploys/models.py", *extra)
    assert res.returncode == 0, res.stderr[-3000:]


def test_image_pull_failure_keeps_the_old_container_serving(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    started, release = container_started(h), live_release(h)
    # a registry address on the testbed's own bridge where nothing listens: the pull is refused
    image = f"{hosts.GATEWAY}:5999/tritonserver:24.09-py3"
    res, data = pyinfra("deploys/models.py", "--limit", h.name, "--data", f"triton_image={image}")
    assert res.returncode != 0
    assert f"docker pull {image}" in res.stderr and "Error" in res.stderr
    # nothing after the failed pull ran: unit, restart, models untouched
    assert not any("systemd unit" in n or "restart" in n for n in changed_ops(data))
    assert "24.08-py3" in ssh(h, "cat /etc/systemd/system/triton.service")
    assert container_started(h) == started and live_release(h) == release and serving(h)
    # through a rollout: the canary fails, is rolled back (nothing to undo), the rollout halts
    res = tritonfleet("rollout", INVENTORY, "deploys/models.py", "--data", f"triton_image={image}", "--json")
    report = json.loads(res.stdout)
    assert res.returncode == 1 and report["halted"]
    rows = {r["host"]: r for r in report["hosts"]}
    assert rows[h.name]["result"] in ("rolled back", "failed")
    assert f"docker pull {image}" in rows[h.name]["detail"] and "connection refused" in rows[h.name]["detail"]
    assert [r["result"] for r in report["hosts"][1:]] == ["not touched"] * (len(testbed.hosts) - 1)
    assert container_started(h) == started and serving(h)


def test_ssh_lost_in_the_middle_of_a_model_transfer(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    release, started = live_release(h), container_started(h)
    repo = big_repo(tmp_path)
    watcher = when(lambda: incoming(h), lambda: block_ssh(h))
    try:
        t0 = time.monotonic()
        res, data = pyinfra("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}",
                            "--data", "ssh_connect_retries=0", timeout=600)
        took = time.monotonic() - t0
        watcher.join(1)
        # the deploy failed that host, quickly, naming it
        assert res.returncode != 0 and took < 300
        assert data.get("results", {}).get("failed_hosts", [h.name]) == [h.name] or not data
        assert h.name in res.stderr
        # nothing half-written is live; the old release is still served by the same container
        assert serving(h)
    finally:
        unblock_ssh(h)
    assert live_release(h) == release and container_started(h) == started
    # a re-run converges, and leaves no partial release behind
    converge("--limit", h.name, "--data", f"model_repository={repo}")
    assert live_release(h) != release and serving(h) and not incoming(h)
    converge("--limit", h.name)
    assert live_release(h) == release


def test_ssh_lost_in_a_rollout_batch_halts_it(deployed, tmp_path):
    testbed, _, _ = deployed
    # inventory order (the rollout's): the t4 group, then the l4 group
    first, victim, last = sorted(testbed.hosts, key=lambda x: (x.gpu_class != "t4", x.index))
    before = {x.name: live_release(x) for x in testbed.hosts}
    repo = big_repo(tmp_path)
    watcher = when(lambda: incoming(victim), lambda: block_ssh(victim))
    try:
        res = tritonfleet("rollout", INVENTORY, "deploys/models.py", "--canary", "1", "--batch", "1",
                          "--data", f"model_repository={repo}", "--data", "ssh_connect_retries=0", "--json")
        watcher.join(1)
        report = json.loads(res.stdout)
        rows = {r["host"]: r for r in report["hosts"]}
        assert res.returncode == 1 and "halted after batch 2" in report["halted"], report["halted"]
        assert rows[first.name]["result"] == "updated"
        assert rows[victim.name]["result"] == "unreachable"
        assert "cannot roll back" in rows[victim.name]["detail"]
        assert rows[last.name]["result"] == "not touched"
        assert serving(victim)
    finally:
        unblock_ssh(victim)
    assert live_release(victim) == before[victim.name]  # the half-sent release never went live
    assert live_release(last) == before[last.name]
    converge()
    assert {x.name: live_release(x) for x in testbed.hosts} == before and not incoming(victim)


def test_interrupted_run_converges_when_run_again(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[1]
    release = live_release(h)
    repo = big_repo(tmp_path)
    proc = subprocess.Popen(
        [PYINFRA, "-y", "--limit", h.name, "--data", f"model_repository={repo}", INVENTORY, "deploys/models.py"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, as a job in a terminal
    )
    deadline = time.monotonic() + 300
    while not incoming(h) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the deploy ended before the transfer could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground job
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("pyinfra did not stop within 60 s of Ctrl-C")
    out = proc.stdout.read()
    assert proc.returncode == 130, out[-3000:]  # not pyinfra's own 0: a script must see it failed
    assert "Interrupted (Ctrl-C)" in out and "Run the same command again" in out
    assert live_release(h) == release and serving(h)
    converge("--limit", h.name, "--data", f"model_repository={repo}")
    assert live_release(h) != release and not incoming(h) and serving(h)
    converge("--limit", h.name)
    assert live_release(h) == release


HOLD_LOCKS = """\
import fcntl, sys, time
held = []
for path in ("/var/lib/apt/lists/lock", "/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock"):
    f = open(path, "a")
    fcntl.lockf(f, fcntl.LOCK_EX)  # what apt and dpkg take (fcntl locks)
    held.append(f)
open("/run/tf-locks-held", "w").close()
time.sleep(float(sys.argv[1]))
"""


def hold_apt_locks(h, seconds: float) -> None:
    """Another process (like unattended-upgrades) holds apt's and dpkg's locks on the host."""
    ssh(h, "rm -f /run/tf-locks-held; cat > /run/tf-hold-locks.py <<'EOF'\n" + HOLD_LOCKS + "EOF\n"
           f"systemd-run --quiet --unit tf-apt-locks --collect python3 /run/tf-hold-locks.py {seconds}; "
           "for i in $(seq 100); do [ -e /run/tf-locks-held ] && exit 0; sleep 0.1; done; exit 1")


def release_apt_locks(h) -> None:
    ssh(h, "systemctl stop tf-apt-locks 2>/dev/null; rm -f /run/tf-locks-held /run/tf-hold-locks.py; true")


def needs_apt(h) -> str:
    """Make the host need `apt-get update` (a source file gone) and an install (a package gone)."""
    pkg = "linux-headers-" + ssh(h, "uname -r").strip()
    ssh(h, f"rm /etc/apt/sources.list.d/cuda.list && dpkg -r --force-depends {pkg} >/dev/null")
    return pkg


def test_apt_lock_held_waits_with_a_bound_then_fails_clearly(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    started = container_started(h)
    pkg = needs_apt(h)
    try:
        # held for 15 s when the deploy starts: apt update and the install wait, then run
        hold_apt_locks(h, 15)
        t0 = time.monotonic()
        res, data = pyinfra("deploys/host.py", "--limit", h.name, "--data", "apt_lock_timeout=300")
        assert res.returncode == 0, res.stderr[-3000:]
        assert time.monotonic() - t0 > 10
        ops = changed_ops(data)
        assert any("apt update (CUDA repository changed)" in n for n in ops), ops
        assert any("kernel headers and DKMS" in n for n in ops), ops
        assert ssh(h, f"dpkg-query -W -f '${{Status}}' {pkg}") == "install ok installed"

        # held for longer than apt_lock_timeout: the host fails after the bound, saying why
        needs_apt(h)
        hold_apt_locks(h, 600)
        t0 = time.monotonic()
        res, data = pyinfra("deploys/host.py", "--limit", h.name, "--data", "apt_lock_timeout=5")
        took = time.monotonic() - t0
        assert res.returncode != 0 and took < 120
        out = res.stderr
        assert h.name in out and "Could not get lock /var/lib/apt/lists/lock" in out
        assert "stayed held by another process for more than 5 s (held by process" in out and "(python3)" in out
        assert "apt_lock_timeout" in out
        # nothing after the failed step ran: the package is still missing, Triton untouched
        assert not any("kernel headers" in n for n in changed_ops(data))
        assert ssh(h, f"dpkg-query -W -f '${{Status}}' {pkg} 2>&1", check=False) != "install ok installed"
        assert container_started(h) == started and serving(h)
    finally:
        release_apt_locks(h)
    res, data = pyinfra("deploys/host.py", "--limit", h.name)
    assert res.returncode == 0, res.stderr[-3000:]
    assert ssh(h, f"dpkg-query -W -f '${{Status}}' {pkg}") == "install ok installed"
    assert container_started(h) == started and serving(h)


def test_disk_full_during_model_sync_serves_nothing_half_written(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    release, started = live_release(h), container_started(h)
    repo = big_repo(tmp_path, mb=300)
    # /opt/triton moved onto a filesystem with room for what it holds plus ~100 MB
    used = int(ssh(h, "du -sm /opt/triton | cut -f1").strip())
    ssh(h, f"mkdir -p /mnt/tf-stage && mount -t tmpfs tf-stage /mnt/tf-stage && cp -a /opt/triton/. /mnt/tf-stage/ && "
           f"mount -t tmpfs -o size={used + 100}m tf-small /opt/triton && cp -a /mnt/tf-stage/. /opt/triton/ && "
           "umount /mnt/tf-stage && rmdir /mnt/tf-stage")
    try:
        res, data = pyinfra("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}")
        assert res.returncode != 0
        out = res.stderr
        assert "Wrote only" in out or "No space left on device" in out  # tar's own words
        assert f"{h.name}: the disk holding /opt/triton is full (or over quota)" in out and "triton_keep_releases" in out
        # nothing half-written is live: same release, same container, still answering
        assert live_release(h) == release and container_started(h) == started and serving(h)
        assert not any("restart" in n or "switch" in n for n in changed_ops(data))
    finally:
        ssh(h, "umount /opt/triton || umount -l /opt/triton; umount /mnt/tf-stage; rmdir /mnt/tf-stage; true")
    # the real directory again, as it was: a re-run with the default repository changes nothing
    assert live_release(h) == release
    res, data = pyinfra("deploys/models.py", "--limit", h.name)
    assert res.returncode == 0 and not changed_ops(data), changed_ops(data)
    assert container_started(h) == started and serving(h)


def test_a_run_cut_before_the_restart_is_finished_by_the_next(deployed):
    """The unit rewritten, or the live release switched, after the container started (a run cut
    between that and the restart): the next run restarts Triton, once."""
    testbed, _, _ = deployed
    h = testbed.hosts[2]
    for touch, why in (("touch /etc/systemd/system/triton.service", "the unit changed after it started"),
                       ("touch -h /opt/triton/model_repository", "the model release was switched after it started")):
        started = container_started(h)
        ssh(h, touch)
        res, data = pyinfra("deploys/models.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-3000:]
        restarts = [n for n in changed_ops(data) if "restart" in n]
        assert restarts == [f"Triton service | restart triton (an earlier run stopped before the restart: {why})"], \
            changed_ops(data)
        assert container_started(h) != started and serving(h)
        res, data = pyinfra("deploys/models.py", "--limit", h.name)
        assert res.returncode == 0 and changed_ops(data) == [], changed_ops(data)


def _wait_port_closed(h, port: int = 22, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((h.address, port), timeout=0.5):
                pass
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_driver_change_reboots_and_continues_and_a_host_that_does_not_come_back_fails_alone(deployed):
    testbed, _, _ = deployed
    stays, lost = testbed.hosts[1], testbed.hosts[2]
    limit = ("--limit", stays.name, "--limit", lost.name)
    # `lost` reboots but never answers SSH again (blocked from the moment it goes down)
    watcher = when(lambda: _wait_port_closed(lost, timeout=600), lambda: block_ssh(lost), timeout=5)
    try:
        res, data = pyinfra("deploys/host.py", *limit, "--data", "nvidia_driver_branch=570",
                            "--data", "nvidia_reboot_timeout=40", timeout=1500)
        watcher.join(1)
        failed = data.get("results", {}).get("failed_hosts")
        assert failed == [lost.name], (failed, res.stderr[-3000:])
        ok = [o for o in data["results"]["operations"] if stays.name in o.get("success", [])]
        names = [o["name"] for o in ok]
        # the other host rebooted, came back and went on to the verification with the new driver
        assert any("reboot" in n for n in names), names
        assert any("check: nvidia-smi" in n for n in names), names
        assert "570.133.07" in ssh(stays, "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
        assert serving(stays)
    finally:
        unblock_ssh(lost)
    hosts.wait_ssh(lost, timeout=120)
    # back to branch 580 (the default) on both (each reboots once more); a re-run after that changes nothing
    res, _ = pyinfra("deploys/host.py", *limit, timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    for x in (stays, lost):
        assert "580.159.04" in ssh(x, "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    res, data = pyinfra("deploys/triton.py", *limit)
    assert res.returncode == 0 and changed_ops(data) == [], changed_ops(data)
    assert serving(stays) and serving(lost)
