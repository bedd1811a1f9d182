"""Faults injected into testbed hosts while the deploy or a rollout runs. Each test checks that
the tool stops cleanly, leaves nothing half-applied, keeps the old version serving, says what
went wrong, and that a re-run converges. Every test leaves the fleet as the `deployed` fixture
made it (default repository, driver branch 580, mode none).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from tests.support.testbed import (
    INVENTORY,
    PYINFRA,
    TRITONFLEET,
    block_ssh,
    changed_ops,
    container_started,
    drop_packets,
    env,
    infer_resnet,
    live_release,
    pyinfra,
    repository_copy,
    ssh,
    tritonfleet,
    unblock_ssh,
    undrop_packets,
)
from tritonfleet import ROOT
from tritonfleet.pyinfra_ext.hostlock import LOCK_FILE
from tritonfleet_testbed import hosts


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
    except (InferenceServerException, OSError):  # no answer, or Triton's error: not serving
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
        # one report (tritonfleet.host.apt_diagnosis): the lock, who held it, apt's own words, the fix
        report = out[out.index(f"tritonfleet: {h.name} failed at NVIDIA driver | apt update (CUDA repository changed)"):]
        assert re.search(r"found: +the apt/dpkg lock \(/var/lib/apt/lists/lock\) stayed held by process \d+ "
                         r"\(python3\) for more than 5 s \(apt_lock_timeout\)", report), report
        assert "E: Could not get lock /var/lib/apt/lists/lock. It is held by process" in report
        assert "apt_lock_timeout" in report and "Traceback" not in out
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


def slow_postinst_deb(tmp_path) -> bytes:
    """A package whose postinst runs until /run/tf-postinst-hold is removed (it says when it starts)."""
    root = tmp_path / "tf-slow-postinst"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: tf-slow-postinst\nVersion: 1.0\nArchitecture: all\nMaintainer: tritonfleet tests "
        "<tests@example.invalid>\nDescription: postinst that waits (tests/testbed/test_faults.py)\n")
    post = root / "DEBIAN" / "postinst"
    post.write_text("#!/bin/sh\ntouch /run/tf-postinst-started\n"
                    "while [ -e /run/tf-postinst-hold ]; do sleep 0.2; done\nexit 0\n")
    post.chmod(0o755)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(tmp_path / "slow.deb")],
                   check=True, capture_output=True)
    return (tmp_path / "slow.deb").read_bytes()


def test_dpkg_killed_mid_install_is_finished_by_the_next_deploy(deployed, tmp_path):
    """dpkg killed (SIGKILL) while a package's postinst runs: apt refuses every install ("dpkg was
    interrupted") until `dpkg --configure -a`; the deploy runs it first, says so, then goes on."""
    import base64

    testbed, _, _ = deployed
    h = testbed.hosts[0]
    started = container_started(h)
    deb = base64.b64encode(slow_postinst_deb(tmp_path)).decode()
    # the deploy needs apt for its own work (first: any later dpkg run would fold dpkg's journal in)
    pkg = needs_apt(h)
    ssh(h, f"echo {deb} | base64 -d > /tmp/tf-slow.deb && rm -f /run/tf-postinst-started && "
           "touch /run/tf-postinst-hold && "
           "{ nohup dpkg -i /tmp/tf-slow.deb >/tmp/tf-dpkg.log 2>&1 & echo $! > /tmp/tf-dpkg.pid; }")
    try:
        deadline = time.monotonic() + 120
        while ssh(h, "[ -e /run/tf-postinst-started ] && echo yes || true").strip() != "yes":
            assert time.monotonic() < deadline, ssh(h, "cat /tmp/tf-dpkg.log", check=False)
            time.sleep(0.5)
        ssh(h, "kill -KILL $(cat /tmp/tf-dpkg.pid)")  # the dpkg this test started, by its PID
    finally:
        ssh(h, "rm -f /run/tf-postinst-hold", check=False)  # its postinst then ends by itself
    assert ssh(h, "dpkg-query -W -f '${db:Status-Abbrev}' tf-slow-postinst").strip() == "iF"
    refused = ssh(h, "apt-get check 2>&1 || true")
    assert "dpkg was interrupted, you must manually run 'dpkg --configure -a'" in refused

    res, data = pyinfra("deploys/host.py", "--limit", h.name)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert f"{h.name}: dpkg was interrupted earlier (tf-slow-postinst" in out
    repairs = [n for n in changed_ops(data) if "finish an interrupted dpkg run" in n]
    assert len(repairs) == 1, changed_ops(data)  # the later steps find dpkg settled
    assert ssh(h, "dpkg-query -W -f '${db:Status-Abbrev}' tf-slow-postinst").strip() == "ii"
    assert ssh(h, f"dpkg-query -W -f '${{Status}}' {pkg}") == "install ok installed"
    assert ssh(h, "ls /var/lib/dpkg/updates/ | grep -c '^[0-9]*$' || true").strip() == "0"
    assert container_started(h) == started and serving(h)

    ssh(h, "dpkg --purge tf-slow-postinst >/dev/null && rm -f /tmp/tf-slow.deb /tmp/tf-dpkg.log /tmp/tf-dpkg.pid "
           "/run/tf-postinst-started")
    res, data = pyinfra("deploys/host.py", "--limit", h.name)
    assert res.returncode == 0 and not changed_ops(data), changed_ops(data)


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


# --------------------------------------------------------------------------- dead links

KEEPALIVE = ("--data", "ssh_keepalive_interval=2", "--data", "ssh_keepalive_count=3")
BOUND = 6  # seconds: 2 x 3


def run_stamped(argv: list[str], timeout: float = 900) -> tuple[int, str, list[tuple[float, str]]]:
    """Run ``argv`` from the repository root; its stderr lines with the time each arrived."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read():
        for ln in proc.stderr:
            lines.append((time.monotonic(), ln.rstrip("\n")))

    out: list[str] = []
    # stderr is read by this thread alone (communicate() would read it too and take lines away)
    reader = threading.Thread(target=read, daemon=True)
    stdout = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    stdout.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"{argv[-1]} still running after {timeout}s: a dropped link hung the run")
    reader.join(10)
    stdout.join(10)
    return proc.returncode, "".join(out), lines


def failure_line(lines, since: float, host: str) -> tuple[float, str]:
    """The first line after ``since`` that says ``host`` failed."""
    for t, ln in lines:
        if t >= since and host in ln and re.search(r"rror|failed|No answer|no answer", ln):
            return t, ln
    pytest.fail(f"no failure of {host} after the drop:\n" + "\n".join(ln for _, ln in lines[-40:]))


def receiving(h) -> bool:
    """The host has received part of big_repo's large file (the transfer is under way)."""
    return any(f.stat().st_size > 0 for d in incoming(h) for f in d.rglob("extra-weights.bin"))


@pytest.mark.parametrize("where", ["transfer over OpenSSH", "transfer over the connection", "remote command"])
def test_a_host_whose_packets_vanish_fails_within_the_keepalive_bound(deployed, tmp_path, where):
    testbed, _, _ = deployed
    # the victim and one other host (which must finish the whole deploy); the third is not needed
    victim, others = testbed.hosts[0], testbed.hosts[1:2]
    limit = [arg for x in (victim, *others) for arg in ("--limit", x.name)]
    before = {x.name: live_release(x) for x in testbed.hosts}
    started = container_started(victim)
    dropped_at: list[float] = []

    def drop():
        drop_packets(victim)
        dropped_at.append(time.monotonic())

    if where == "remote command":
        marker = victim.merged / "var/tmp/tf-slow-started"
        marker.unlink(missing_ok=True)
        deploy, extra = "tests/deploys/slow_command.py", ["--data", "slow_seconds=20"]
        watcher = when(marker.exists, drop)
    else:
        repo = big_repo(tmp_path, mb=200)
        how = "ssh" if "OpenSSH" in where else "connection"
        deploy, extra = "deploys/models.py", ["--data", f"model_repository={repo}", "--data", f"bulk_transfer={how}"]
        watcher = when(lambda: receiving(victim), drop)
    try:
        rc, out, lines = run_stamped([PYINFRA, "-y", "--json", *KEEPALIVE, "--data", "ssh_connect_retries=0",
                                      *limit, *extra, INVENTORY, deploy])
        watcher.join(1)
        assert dropped_at, f"the {where} ended before the packets could be dropped"
        data = json.loads(out) if out.strip() else {}
        # that host, and only that host, failed; the others finished the whole deploy
        assert rc != 0 and data["results"]["failed_hosts"] == [victim.name], lines[-30:]
        ops = data["results"]["operations"]
        assert all(x.name in op["success"] + op.get("no_change", []) for op in ops for x in others), ops
        # ... within the bound after the drop (and a few seconds for pyinfra to say so)
        t, line = failure_line(lines, dropped_at[0], victim.name)
        took = t - dropped_at[0]
        print(f"\n{where}: {victim.name} failed {took:.1f}s after its packets were dropped "
              f"(bound {BOUND}s): {line.strip()}")
        assert took < BOUND + 10, line
    finally:
        undrop_packets(victim)
    # the live release is untouched, the same container serves it
    assert live_release(victim) == before[victim.name] and container_started(victim) == started
    assert serving(victim)
    if where != "remote command":
        for x in others:
            assert live_release(x) != before[x.name] and serving(x)
        converge()  # back to the default repository everywhere (the victim's lock has gone too)
        assert {x.name: live_release(x) for x in testbed.hosts} == before and not incoming(victim)


# --------------------------------------------------------------------------- concurrent runs

def lock_holder(h) -> str:
    return ssh(h, f"cat {LOCK_FILE} 2>/dev/null; true").strip()


def test_two_deploys_at_once_on_one_host(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[1]
    release, started = live_release(h), container_started(h)
    first = subprocess.Popen([PYINFRA, "-y", "--limit", h.name, "--data", "slow_seconds=25", INVENTORY,
                              "tests/deploys/slow_command.py"], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while f"pid {first.pid}," not in lock_holder(h):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.2)
        holder = lock_holder(h)
        assert holder.startswith(f"root@{socket.gethostname()} pid {first.pid}, started ")
        assert "slow_command.py" in holder

        # a second run that may wait 3 s: it stops after them, naming the holder, having changed nothing
        t0 = time.monotonic()
        res, data = pyinfra("deploys/models.py", "--limit", h.name, "--data", "deploy_lock_timeout=3")
        assert res.returncode != 0 and time.monotonic() - t0 >= 3
        err = res.stderr
        assert f"{h.name}: another run holds the deploy lock ({LOCK_FILE} on the host): " in err
        assert holder in err and "deploy_lock_timeout" in err and "no host was changed" in err
        assert "Beginning operation run" not in err

        # a second run with the default wait: it waits for the first, then runs. A full deploy: its
        # pre-flight read goes out while its own holder waits (hostlock.read_before_lock), finds
        # the lock held, and is read again once the first run is done (two reads, the second
        # under the lock: --debug prints each command)
        res, data = pyinfra("deploys/triton.py", "--limit", h.name, "--debug")
        ended = time.monotonic()
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"{h.name}: waiting up to 600s for the deploy lock, held by {holder}" in res.stderr
        assert res.stderr.count("_tfa() (") == 2, "pre-flight's read of a held lock was not read again"
        assert first.poll() is not None, "the second run went on while the first still held the lock"
        assert first.returncode == 0, first.stdout.read()[-3000:]
        assert ended > 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert live_release(h) == release and container_started(h) == started and serving(h)


def journal_events(logs: Path) -> list[dict]:
    out = []
    for j in logs.glob("*/journal.jsonl"):
        for line in j.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def kill_rollout_in_its_second_batch(testbed, tmp_path) -> tuple[dict, list, dict]:
    """A rollout (canary, then batches of one) of a new repository, SIGKILLed in the middle of its
    second batch's model transfer; checks that its pyinfra died with it. Returns (environment
    with the rollout's log directory, hosts in rollout order, live release of each before)."""
    order = sorted(testbed.hosts, key=lambda x: (x.gpu_class != "t4", x.index))  # the rollout's order
    before = {x.name: live_release(x) for x in testbed.hosts}
    repo = big_repo(tmp_path, mb=200)
    logs = tmp_path / "rollouts"
    environ = dict(env(), TRITONFLEET_LOG_DIR=str(logs))
    argv = [TRITONFLEET, "rollout", INVENTORY, "deploys/models.py", "--canary", "1", "--batch", "1",
            "--data", f"model_repository={repo}", "--json"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    victim = order[1]
    try:
        deadline = time.monotonic() + 600
        batch2 = None
        while batch2 is None:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the rollout never reached its second batch"
            batch2 = next((e for e in journal_events(logs) if e["event"] == "batch" and e["index"] == 2), None)
            time.sleep(0.1)
        assert batch2["hosts"] == [victim.name] and not gone(batch2["pid"])
        while not receiving(victim) and time.monotonic() < deadline:  # in the middle of its transfer
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # its pyinfra (and that one's transfer) die with it: nothing deploys on, ungated
        t0 = time.monotonic()
        while not gone(batch2["pid"]):
            assert time.monotonic() - t0 < 10, "the rollout's pyinfra outlived it"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = [e["event"] for e in journal_events(logs)]
    assert events[:3] == ["start", "before", "planned"] and "end" not in events
    assert events.count("batch-done") == 1  # the canary's
    assert live_release(order[0]) != before[order[0].name]
    assert live_release(victim) == before[victim.name]  # the cut transfer never went live
    assert live_release(order[2]) == before[order[2].name]
    return environ, order, before


def test_a_rollout_killed_mid_batch_takes_its_pyinfra_along_and_resumes(deployed, tmp_path):
    testbed, _, _ = deployed
    environ, order, before = kill_rollout_in_its_second_batch(testbed, tmp_path)
    # --resume: the cut batch again, then the rest, from the journal alone
    res = subprocess.run([TRITONFLEET, "rollout", "--resume", "--json"], cwd=ROOT, env=environ,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["ok"] and [r["result"] for r in report["hosts"]] == ["updated"] * 3, report["hosts"]
    assert "resuming the rollout" in res.stderr and "batch 2/3 was cut" in res.stderr
    new = live_release(order[0])
    assert all(live_release(x) == new and serving(x) for x in testbed.hosts)
    again = subprocess.run([TRITONFLEET, "rollout", "--resume"], cwd=ROOT, env=environ, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode != 0 and "nothing to resume" in again.stderr
    converge()
    assert {x.name: live_release(x) for x in testbed.hosts} == before


def test_a_killed_rollout_rolled_back_from_its_journal(deployed, tmp_path):
    testbed, _, _ = deployed
    environ, order, before = kill_rollout_in_its_second_batch(testbed, tmp_path)
    res = subprocess.run([TRITONFLEET, "rollout", "--resume", "--roll-back", "--json"], cwd=ROOT, env=environ,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 1, res.stderr[-3000:]
    report = json.loads(res.stdout)
    rows = {r["host"]: r for r in report["hosts"]}
    assert "rolled back on request" in report["halted"]
    assert rows[order[0].name]["result"] == "rolled back" and rows[order[1].name]["result"] == "rolled back"
    assert rows[order[2].name]["result"] == "not touched"
    # every host serves what it served before the rollout, from the journal alone
    assert {x.name: live_release(x) for x in testbed.hosts} == before
    assert all(serving(x) for x in testbed.hosts)
