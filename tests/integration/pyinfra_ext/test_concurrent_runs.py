"""Concurrent runs and crashes, on this machine: the deploy lock (real flock, real bash, this
machine playing the host), per-run temporary names, and children that die with the process that
started them. The same on real hosts over SSH is in testbed/test_faults.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet.core import runid
from tritonfleet.model_repo import release as release_plan
from tritonfleet.model_repo import render as models
from tritonfleet.pyinfra_ext import hostlock, transfer

# --------------------------------------------------------------------------- the deploy lock


@pytest.fixture
def lockfile(tmp_path, monkeypatch):
    path = tmp_path / "tritonfleet.lock"
    monkeypatch.setattr(hostlock, "LOCK_FILE", str(path))
    monkeypatch.setattr(transfer, "choose", lambda host, wanted: "local")
    return path


def local_host(name="gpu1"):
    return SimpleNamespace(name=name, data={})


def test_a_second_run_fails_after_the_wait_naming_the_holder(lockfile):
    first = hostlock.Holder(local_host(), 5, 1, 3, holder="ops@ctl1 pid 4242, started 2026-01-01 00:00:00 UTC")
    assert first.acquire() == ""
    said = []
    try:
        t0 = time.monotonic()
        second = hostlock.Holder(local_host(), 1, 1, 3, holder="dev@ctl2 pid 77")
        why = second.acquire(said.append)
        assert time.monotonic() - t0 >= 1
        assert why.startswith("gpu1: another run holds the deploy lock")
        assert "ops@ctl1 pid 4242, started 2026-01-01 00:00:00 UTC" in why and "deploy_lock_timeout" in why
        assert said == ["gpu1: waiting up to 1s for the deploy lock, held by ops@ctl1 pid 4242, "
                        "started 2026-01-01 00:00:00 UTC"]
    finally:
        first.release()


def test_a_second_run_waits_and_goes_on_once_the_first_ends(lockfile):
    first = hostlock.Holder(local_host(), 5, 1, 3, holder="first")
    assert first.acquire() == ""
    threading.Timer(1.0, first.release).start()
    second = hostlock.Holder(local_host(), 30, 1, 3, holder="second")
    try:
        t0 = time.monotonic()
        assert second.acquire() == ""
        assert time.monotonic() - t0 >= 0.9
        assert lockfile.read_text() == "second\n"
    finally:
        second.release()


def held(path: Path) -> bool:
    return subprocess.run(["flock", "-n", str(path), "true"]).returncode != 0


def wait_free(path: Path, timeout: float) -> float:
    t0 = time.monotonic()
    while held(path):
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"the lock stayed held for more than {timeout}s")
        time.sleep(0.1)
    return time.monotonic() - t0


def test_the_lock_goes_when_no_heartbeat_arrives(lockfile):
    """A dead link or a dead control machine: the holder hears nothing more and lets go."""
    script = hostlock.lock_script("silent", 0, 2)
    proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"prev \n"  # the line it found: none, a new lock file
        assert proc.stdout.readline() == b"locked\n"
        assert held(lockfile)
        wait_free(lockfile, 15)  # our end of stdin is still open: only the silence frees it
    finally:
        proc.kill()
        proc.wait()


HOLD = """
import sys, time
from types import SimpleNamespace
from tritonfleet.pyinfra_ext import hostlock, transfer
hostlock.LOCK_FILE = sys.argv[1]
transfer.choose = lambda host, wanted: "local"
why = hostlock.Holder(SimpleNamespace(name="gpu1", data={}), 0, 1, 30).acquire()
print("held" if not why else why, flush=True)
time.sleep(600)
"""


def test_the_lock_goes_with_a_run_killed_by_sigkill(lockfile):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lockfile)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert f"pid {proc.pid}," in lockfile.read_text()  # the holder names the run's own pid
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # within a heartbeat interval (1 s), not the 30 s of silence the holder would allow
        assert wait_free(lockfile, 10) < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def children(pid: int) -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.add(int(d))
            except OSError:
                pass
    return out


@pytest.fixture
def own_lock_files(tmp_path, monkeypatch):
    """Local hosts (this machine), each with its own lock file: real flock, real bash."""
    monkeypatch.setattr(transfer, "choose", lambda host, wanted: "local")
    monkeypatch.setattr(hostlock, "lockable", lambda host: True)
    script = hostlock.Holder._script

    def own_file(self):
        monkeypatch.setattr(hostlock, "LOCK_FILE", str(tmp_path / f"{self.host.name}.lock"))
        return script(self)

    monkeypatch.setattr(hostlock.Holder, "_script", own_file)
    return tmp_path


def test_a_runs_holders_share_one_heartbeat_process_that_keeps_every_lock(own_lock_files):
    """acquire_all: one holder process a host and ONE heartbeat process for all of them (not
    one a host), whose heartbeats keep every lock past its silence bound, until release_all."""
    tmp_path = own_lock_files
    keep = {"ssh_keepalive_interval": 1, "ssh_keepalive_count": 2}  # silent for 2 s: let go
    hosts = [SimpleNamespace(name=f"gpu{i}", connected=True, data=dict(keep)) for i in range(6)]
    before = children(os.getpid())
    try:
        assert hostlock.acquire_all(SimpleNamespace(inventory=hosts), say=print) == 6
        started = children(os.getpid()) - before
        assert len(started) == 6 + 1, f"{len(started)} processes for 6 hosts' locks"
        time.sleep(5)
        assert [h.name for h in hosts if not held(tmp_path / f"{h.name}.lock")] == []
    finally:
        hostlock.release_all()
    for h in hosts:
        wait_free(tmp_path / f"{h.name}.lock", 10)
    assert not (children(os.getpid()) - before)


def test_release_all_signals_every_holder_before_it_waits_for_any(own_lock_files, monkeypatch):
    """A run's exit ends its holders together: every holder process gets its SIGKILL before the
    first is waited for (one at a time, 500 hosts' waits added up to seconds), and all are gone."""
    tmp_path = own_lock_files
    events = []
    end, release = hostlock.Holder.end, hostlock.Holder.release
    monkeypatch.setattr(hostlock.Holder, "end", lambda self: events.append(("end", self.host.name)) or end(self))
    monkeypatch.setattr(hostlock.Holder, "release",
                        lambda self: events.append(("release", self.host.name)) or release(self))
    hosts = [SimpleNamespace(name=f"gpu{i}", connected=True, data={}) for i in range(4)]
    before = children(os.getpid())
    try:
        assert hostlock.acquire_all(SimpleNamespace(inventory=hosts), say=print) == 4
    finally:
        hostlock.release_all()
    kinds = [k for k, _ in events]
    assert kinds == ["end"] * 4 + ["release"] * 4, events
    assert sorted(n for k, n in events if k == "end") == [h.name for h in hosts]
    for h in hosts:
        wait_free(tmp_path / f"{h.name}.lock", 10)
    assert not (children(os.getpid()) - before)


def test_locks_started_without_waiting_are_all_held_before_a_gated_command_runs(own_lock_files):
    """install() starts the holders and returns (acquire_all(wait=False)); pyinfra's way to a host,
    gated, waits until every host's lock is held before the first command goes."""
    hosts = [SimpleNamespace(name=f"gpu{i}", connected=True, data={}) for i in range(3)]
    seen = []

    def command(host, text):  # what Host.run_shell_command would send
        seen.append((text, sorted(n for n in hostlock._held), [held(own_lock_files / f"{h.name}.lock") for h in hosts]))
        return True

    gated = hostlock._gated(command)
    before = children(os.getpid())
    try:
        assert hostlock.acquire_all(SimpleNamespace(inventory=hosts), say=print, wait=False) == 0
        assert hostlock._held == {}  # started, not waited for
        assert gated(hosts[0], "first") is True
        assert gated(hosts[1], "second") is True
    finally:
        hostlock.release_all()
    assert seen == [("first", ["gpu0", "gpu1", "gpu2"], [True] * 3), ("second", ["gpu0", "gpu1", "gpu2"], [True] * 3)]
    for h in hosts:
        wait_free(own_lock_files / f"{h.name}.lock", 10)
    assert not (children(os.getpid()) - before)


def test_a_lock_another_run_keeps_stops_the_first_command_and_every_later_one(own_lock_files, monkeypatch):
    """The run stops at its first command (SystemExit naming the host and the holder, nothing
    sent), every other host's lock is let go, and every later command stops the same way."""
    other = hostlock.Holder(SimpleNamespace(name="gpu1", data={}), 5, 1, 3, holder="ops@ctl1 pid 4242")
    assert other.acquire() == ""
    hosts = [SimpleNamespace(name=f"gpu{i}", connected=True, data={"deploy_lock_timeout": 0}) for i in range(3)]
    sent = []
    gated = hostlock._gated(lambda host, text: sent.append(text))
    try:
        hostlock.acquire_all(SimpleNamespace(inventory=hosts), say=print, wait=False)
        for text in ("first", "second"):
            with pytest.raises(SystemExit) as stop:
                gated(hosts[0], text)
            assert str(stop.value.code).startswith("tritonfleet: no host was changed:\ngpu1: another run holds the "
                                                   "deploy lock"), stop.value.code
            assert "ops@ctl1 pid 4242" in str(stop.value.code)
        assert sent == [] and hostlock._held == {}
        for name in ("gpu0", "gpu2"):
            wait_free(own_lock_files / f"{name}.lock", 10)
    finally:
        other.release()
        hostlock.release_all()
        hostlock._refused.clear()


def test_a_run_that_ends_before_it_waited_ends_its_holders(own_lock_files):
    """Pre-flight refused (or Ctrl-C) before any command: the holders started are ended too."""
    hosts = [SimpleNamespace(name=f"gpu{i}", connected=True, data={}) for i in range(3)]
    before = children(os.getpid())
    hostlock.acquire_all(SimpleNamespace(inventory=hosts), say=print, wait=False)
    assert len(children(os.getpid()) - before) == 3 + 1
    hostlock.release_all()
    assert not (children(os.getpid()) - before) and not hostlock._pending
    for h in hosts:
        wait_free(own_lock_files / f"{h.name}.lock", 10)


def test_gate_host_io_gates_exactly_pyinfras_ways_to_a_host_once(monkeypatch):
    from pyinfra.api.host import Host

    names = [n for n in dir(Host) if callable(getattr(Host, n)) and not n.startswith("__")]
    for n in names:
        monkeypatch.setattr(Host, n, getattr(Host, n))  # restored afterwards
    originals = {n: getattr(Host, n) for n in names}
    hostlock.gate_host_io()
    hostlock.gate_host_io()
    gated = sorted(n for n in names if getattr(Host, n) is not originals[n])
    assert gated == sorted(hostlock.HOST_IO)
    for n in hostlock.HOST_IO:
        assert getattr(Host, n).__wrapped__ is originals[n]  # once, not wrapped twice


BEATER = """
import os, sys, time
from tritonfleet.pyinfra_ext import children
r, w = os.pipe()
p = children.start_beater([w], 30)  # a beat every 30 s: its own check of its parent comes late
print(p.pid, flush=True)
time.sleep(600)
"""


def test_the_heartbeat_process_ends_with_the_run_at_once(tmp_path):
    """The beater is posix_spawn'ed (no preexec_fn): it sets PR_SET_PDEATHSIG itself, so a run
    killed by SIGKILL takes it along at once, not one heartbeat interval later."""
    from tritonfleet.core.procs import alive

    run = subprocess.Popen([sys.executable, "-c", BEATER], stdout=subprocess.PIPE, text=True)
    try:
        beater = int(run.stdout.readline())
        time.sleep(0.5)  # the beater has started and set its death signal
        assert alive(beater)
        run.kill()
        run.wait()
        t0 = time.monotonic()
        while alive(beater) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert not alive(beater), "the heartbeat process outlived its run"
        assert time.monotonic() - t0 < 5
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


CLI_WITH_LOCK_FILE = """
import sys
from pyinfra_cli.main import main
from tritonfleet.pyinfra_ext import hostlock
hostlock.LOCK_FILE = sys.argv.pop(1)  # this machine plays the host: a lock file of the test's own
sys.argv[0] = "pyinfra"
sys.exit(main())
"""

PLAIN_DEPLOY = """
from pyinfra.operations import server
from tritonfleet import pyinfra_patches

pyinfra_patches.install()
server.shell(name="mark", commands=["flock -n {lock} true && touch {mark}.unlocked || touch {mark}"])
"""


def test_a_deploy_of_plain_pyinfra_operations_holds_the_lock_before_its_first_command(tmp_path, monkeypatch):
    """A deploy whose operations read no fact (nothing waits while it loads): the gate on
    pyinfra's Host makes the first command of the execution wait. A lock another run keeps stops
    the run there, with the command not run; a free one is held while the command runs."""
    lock, mark = tmp_path / "tritonfleet.lock", tmp_path / "ran"
    deploy = tmp_path / "plain.py"
    deploy.write_text(PLAIN_DEPLOY.format(lock=lock, mark=mark))

    def run():
        return subprocess.run([sys.executable, "-c", CLI_WITH_LOCK_FILE, str(lock), "-y", "@local", str(deploy),
                               "--data", "deploy_lock_timeout=0"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)

    monkeypatch.setattr(transfer, "choose", lambda host, wanted: "local")  # the other run's holder, here
    monkeypatch.setattr(hostlock, "LOCK_FILE", str(lock))
    other = hostlock.Holder(SimpleNamespace(name="@local", data={}), 0, 1, 30, holder="ops@ctl1 pid 4242")
    try:
        assert other.acquire() == ""
        res = run()
    finally:
        other.release()
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "Beginning operation run" in out  # refused at the first command, not while loading
    assert "@local: another run holds the deploy lock" in out and "ops@ctl1 pid 4242" in out, out[-3000:]
    assert "Traceback" not in out and not mark.exists() and not Path(f"{mark}.unlocked").exists()
    res = run()
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert mark.exists() and not Path(f"{mark}.unlocked").exists()  # the lock was held while it ran
    wait_free(lock, 10)


GEVENT_WAIT = """
from gevent import monkey; monkey.patch_all()
import subprocess, sys, time
from types import SimpleNamespace
import gevent
from tritonfleet.pyinfra_ext import hostlock, transfer
hostlock.LOCK_FILE = sys.argv[1]
transfer.choose = lambda host, wanted: "local"
first = hostlock.Holder(SimpleNamespace(name="gpu1", data={}), 0, 1, 30, holder="first")
assert first.acquire() == ""
print("holder", *[type(p).__name__ for p in first.procs])
ticks = []
def tick():
    while True:
        ticks.append(time.monotonic())
        gevent.sleep(0.1)
g = gevent.spawn(tick)
why = hostlock.Holder(SimpleNamespace(name="gpu1", data={}), 2, 1, 30, holder="second").acquire()
g.kill()
first.release()
print("ticks", len(ticks))
print(why)
"""


def test_under_gevent_a_host_waiting_for_its_lock_does_not_stop_the_others(lockfile):
    """pyinfra's runs are under gevent's patching: the holders are started with posix_spawn
    (gevent's Popen forks the whole run's process), and a host waiting for its lock reads its
    holder's answer cooperatively, so the other hosts' greenlets go on meanwhile."""
    res = subprocess.run([sys.executable, "-c", GEVENT_WAIT, str(lockfile)], capture_output=True, text=True,
                         timeout=60)
    out = res.stdout.splitlines()
    assert res.returncode == 0, res.stderr
    assert out[0] == "holder Child Child"  # the holder and its own heartbeat process, both posix_spawn'ed
    assert int(out[1].split()[1]) >= 12  # ~20 ticks of 0.1 s while it waited 2 s
    assert out[2].startswith("gpu1: another run holds the deploy lock") and "first" in out[2]


@settings(max_examples=25, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=80))
def test_the_holder_line_reaches_the_lock_file_unchanged(tmp_path_factory, text):
    # and the next holder, and a read of the free lock (hostlock.seen_command), find it unchanged
    path = tmp_path_factory.mktemp("lock") / "l"
    orig = hostlock.LOCK_FILE
    hostlock.LOCK_FILE = str(path)
    try:
        script, after = hostlock.lock_script(text, 0, 1), hostlock.lock_script("next", 0, 1)
        seen = hostlock.seen_command()
    finally:
        hostlock.LOCK_FILE = orig
    res = subprocess.run(["bash", "-c", script], input=b"", capture_output=True, timeout=20)
    assert res.stdout == b"prev \nlocked\n", res.stderr
    assert path.read_bytes() == text.encode() + b"\n"
    read = subprocess.run(["/bin/sh", "-c", seen], capture_output=True, timeout=20)
    assert hostlock.parse_seen(read.stdout.decode().splitlines()) == hostlock.Seen(True, text)
    res = subprocess.run(["bash", "-c", after], input=b"", capture_output=True, timeout=20)
    assert res.stdout == b"prev " + text.encode() + b"\nlocked\n", res.stderr


# --------------------------------------------------------------------------- per-run names


def test_two_runs_never_share_a_temporary_name_on_the_host():
    man = {"m/1/model.onnx": [3, "ab" * 32]}
    plan = release_plan.make_plan("r1", man, {"releases": {}, "drift": {}, "incoming": {}})
    a, b = "20260101T000000-11-aaaaaa", "20260101T000000-22-bbbbbb"
    for run, other in ((a, b), (b, a)):
        text = "\n".join([release_plan.prepare_script("/opt/triton", plan, man, run),
                          release_plan.receive_command("/opt/triton", "r1", run),
                          release_plan.finish_script("/opt/triton", "r1", 3, run=run)])
        assert f".incoming-r1.{run}" in text and f"model_repository.new-{run}" in text
        assert other not in text
        assert "model_repository.new " not in text and "model_repository.new\n" not in text


def test_an_interrupted_runs_transfer_is_taken_over_by_the_next(tmp_path):
    rel = tmp_path / "releases"
    left = rel / ".incoming-r1.20260101T000000-11-aaaaaa"
    (left / "m/1").mkdir(parents=True)
    (left / "m/1/model.onnx").write_bytes(b"abc")
    out = subprocess.run(["sh", "-c", release_plan.index_command(str(tmp_path), "r1")], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert release_plan.parse_index(out)["incoming"] == {"m/1/model.onnx": 3}
    man = {"m/1/model.onnx": [3, "ab" * 32]}
    plan = release_plan.make_plan("r1", man, release_plan.parse_index(out))
    assert plan.keep == ["m/1/model.onnx"]
    run = "20260101T000001-22-bbbbbb"
    subprocess.run(["sh", "-c", release_plan.prepare_script(str(tmp_path), plan, man, run)], check=True)
    assert [p.name for p in rel.iterdir()] == [f".incoming-r1.{run}"]
    assert (rel / f".incoming-r1.{run}" / "m/1/model.onnx").read_bytes() == b"abc"


def test_each_run_renders_into_its_own_directory(tmp_path, monkeypatch):
    src = tmp_path / "repo"
    (src / "m" / "1").mkdir(parents=True)
    (src / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\nmax_batch_size: 4\n')
    (src / "m" / "1" / "model.py").write_text("pass\n")
    over = {"m": {"max_batch_size": 8}}
    monkeypatch.setattr(runid, "RUN_ID", "20260101T000000-1-aaaaaa")  # pid 1 never goes away
    first = models.render(src, over, tmp_path / "rendered")
    man = models.manifest(first)
    monkeypatch.setattr(runid, "RUN_ID", f"20260101T000001-{os.getpid()}-bbbbbb")
    second = models.render(src, over, tmp_path / "rendered")
    assert first != second and first.is_dir() and second.is_dir()
    assert models.manifest(first) == man  # the first run's files are as it rendered them
    # what a run that is gone left behind is removed by the next render
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / "rendered" / f"{first.name.split('.')[0]}.20260101T000002-{gone.pid}-cccccc"
    dead.mkdir()
    models.render(src, over, tmp_path / "rendered")
    assert not dead.exists() and first.exists()


# --------------------------------------------------------------------------- children die with us

PARENT = """
import subprocess, sys, time
from tritonfleet.core.procs import die_with_parent
child = subprocess.Popen(["sleep", "600"], preexec_fn=die_with_parent())
print(child.pid, flush=True)
time.sleep(600)
"""


def test_children_die_with_the_process_that_started_them():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert Path(f"/proc/{child}").exists()
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "Z" not in _state(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


# --------------------------------------------------------------------------- the lock's own directory

def test_the_lock_lives_in_a_root_only_directory_the_lock_command_makes(tmp_path, monkeypatch):
    """security-review-2 finding 15: in world-writable /run/lock any local user could flock the
    file (a read-only descriptor suffices) and block every deploy. The lock's command makes its
    directory 0700 (the file 0600); an unprivileged user can then neither open nor lock it."""
    monkeypatch.setattr(transfer, "choose", lambda host, wanted: "local")
    lock = tmp_path / "run" / "tritonfleet" / "deploy.lock"
    (tmp_path / "run").mkdir()
    (tmp_path / "run").chmod(0o755)
    tmp_path.chmod(0o755)
    monkeypatch.setattr(hostlock, "LOCK_FILE", str(lock))
    assert hostlock.LOCK_FILE != "/run/lock/tritonfleet.lock"
    first = hostlock.Holder(local_host(), 5, 1, 3, holder="ops@ctl1 pid 4242")
    try:
        assert first.acquire() == ""
        assert oct(lock.parent.stat().st_mode & 0o777) == "0o700" and oct(lock.stat().st_mode & 0o777) == "0o600"
        if os.geteuid() == 0:  # the attack of the review, as user nobody
            res = subprocess.run(["runuser", "-u", "nobody", "--", "flock", "-n", str(lock), "-c", "sleep 5"],
                                 capture_output=True, text=True, timeout=20)
            assert res.returncode != 0 and "Permission denied" in res.stderr, res
    finally:
        first.release()
    lock.parent.chmod(0o777)  # a directory someone loosened: the next lock command makes it 0700 again
    second = hostlock.Holder(local_host(), 5, 1, 3, holder="ops@ctl1 pid 4243")
    try:
        assert second.acquire() == ""
        assert oct(lock.parent.stat().st_mode & 0o777) == "0o700"
    finally:
        second.release()


def test_a_holder_that_ends_stops_the_run_before_its_next_command(own_lock_files):
    """The holder's SSH connection dies while pyinfra's own survives: the host's lock is gone, so
    the run's next command to that host fails it (an OSError, as a lost connection: pyinfra fails
    that host alone), naming the host and why; the other host's commands go on; a holder whose
    end a reboot announced (rebooting) stops nothing until reacquire takes it again."""
    hosts = [SimpleNamespace(name=f"gpu{i}", connected=True, data={}) for i in range(2)]
    sent = []
    gated = hostlock._gated(lambda host, text: sent.append((host.name, text)) or True)
    try:
        assert hostlock.acquire_all(SimpleNamespace(inventory=hosts), say=print) == 2
        assert gated(hosts[0], "before") is True
        hostlock._held["gpu0"].procs[0].kill()  # what a dead SSH connection does to the holder
        hostlock._held["gpu0"].procs[0].wait()
        with pytest.raises(OSError) as stop:
            gated(hosts[0], "after")
        said = str(stop.value)
        assert isinstance(stop.value, hostlock.LockLost)
        assert said.startswith("gpu0: the deploy lock's holder on the host ended"), said
        assert "the holder: killed by signal 9" in said, said  # how it ended, for the diagnosis
        assert "before its next command" in said and "run again" in said
        assert gated(hosts[1], "other") is True
        assert sent == [("gpu0", "before"), ("gpu1", "other")]
        # a reboot: the holder of gpu1 ends, expected; commands go on until the lock is taken again
        hostlock.rebooting(hosts[1])
        hostlock._held["gpu1"].procs[0].kill()
        hostlock._held["gpu1"].procs[0].wait()
        assert gated(hosts[1], "uptime") is True and sent[-1] == ("gpu1", "uptime")
    finally:
        hostlock.release_all()
