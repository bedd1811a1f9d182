"""Pre-flight's first read of a host sent while the host's deploy lock is still being taken
(hostlock.read_before_lock, speed-only ``read_while_locking``): kept only if no other run held the
lock from that read until this run's holder took it, or this run's holder held it during the read. On this machine (real flock, real bash for
the holder, this machine's ``sh`` for the read, as pyinfra's commands run), with a lock file of the
test's own. The same through a whole run over SSH is bench/run.py noop and the testbed's deploy-lock
tests."""

from __future__ import annotations

import itertools
import subprocess
import time
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet.pyinfra_ext import hostlock, transfer

_runs = itertools.count()


@pytest.fixture
def lockfile(tmp_path, monkeypatch):
    path = tmp_path / "run" / "tritonfleet" / "deploy.lock"
    monkeypatch.setattr(hostlock, "LOCK_FILE", str(path))
    monkeypatch.setattr(transfer, "choose", lambda host, wanted: "local")
    return path


def local_host(name="gpu1"):
    return SimpleNamespace(name=name, data={})


def seen() -> hostlock.Seen | None:
    """The read's first command, run by this machine's sh, as the batch runs it."""
    out = subprocess.run(["/bin/sh", "-c", hostlock.seen_command()], capture_output=True, text=True, timeout=30)
    return hostlock.parse_seen(out.stdout.splitlines())


def holder(wait: int = 5) -> hostlock.Holder:
    return hostlock.Holder(local_host(), wait, 1, 5, holder=f"ops@ctl pid {next(_runs)}, run r{time.monotonic_ns()}")


def another_run_takes_and_releases() -> str:
    other = holder()
    assert other.acquire() == ""
    other.release()
    return other.holder


# --------------------------------------------------------------------------- the protocol itself


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    start=st.sampled_from(["absent", "empty", "a line"]),
    held_during_read=st.sampled_from(["no run", "another run", "this run"]),
    runs_between=st.integers(0, 2),
)
def test_a_read_stands_exactly_when_no_other_run_held_the_lock_from_it_to_this_runs_holder(
    lockfile, start, held_during_read, runs_between
):
    if lockfile.exists():
        lockfile.unlink()
    if start != "absent":
        lockfile.parent.mkdir(parents=True, exist_ok=True)
        lockfile.write_text("" if start == "empty" else "ops@old pid 1, run r0\n")
    ours = holder()
    if held_during_read == "this run":  # this run's holder took the lock before the read went out
        for _ in range(runs_between):
            another_run_takes_and_releases()
        assert ours.acquire() == ""
        line = seen()
        try:
            assert line == hostlock.Seen(False, ours.holder)
            assert hostlock.stands(line, ours)
        finally:
            ours.release()
        return
    keeper = None
    if held_during_read == "another run":  # another run holds the lock while this run reads, and lets go after
        keeper = holder()
        assert keeper.acquire() == ""
    line = seen()
    if keeper is not None:
        # held: what the read saw may be half of that run's change
        assert line == hostlock.Seen(False, keeper.holder)
        keeper.release()
    for _ in range(runs_between):
        another_run_takes_and_releases()
    try:
        assert ours.acquire() == ""
        assert hostlock.stands(line, ours) == (held_during_read == "no run" and runs_between == 0)
    finally:
        ours.release()


def test_the_read_names_the_line_the_holder_finds(lockfile):
    assert seen() == hostlock.Seen(True, "")  # no lock file yet: no run ever held it
    first = holder()
    assert first.acquire() == ""
    assert first.previous == ""
    assert seen() == hostlock.Seen(False, first.holder)  # held: the line its holder wrote
    first.release()
    assert seen() == hostlock.Seen(True, first.holder)
    second = holder()
    assert second.acquire() == ""
    assert second.previous == first.holder
    second.release()


def test_a_read_cannot_see_the_lock_file_does_not_stand(lockfile):
    lockfile.parent.mkdir(parents=True)
    lockfile.write_text("ops@old pid 1, run r0\n")
    lockfile.chmod(0)
    lockfile.parent.chmod(0o700)
    unreadable = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c", hostlock.seen_command()],
        capture_output=True,
        text=True,
        timeout=30,
    )
    line = hostlock.parse_seen(unreadable.stdout.splitlines())
    lockfile.chmod(0o600)
    ours = holder()
    try:
        assert ours.acquire() == ""
        assert line is None or line.line == ""  # it could not look: no line (held, or no file it can see)
        assert not hostlock.stands(line, ours)  # a reader that cannot look never stands
    finally:
        ours.release()


def test_a_read_holding_the_lock_shared_does_not_read_as_another_run(lockfile):
    # the read holds the lock shared for a few milliseconds; a holder trying then (even one that
    # may not wait at all: deploy_lock_timeout = 0) takes the lock once it ends, says nothing
    lockfile.parent.mkdir(parents=True)
    lockfile.write_text("ops@old pid 1, run r0\n")
    reader = subprocess.Popen(["flock", "-s", str(lockfile), "sleep", "0.4"])
    try:
        time.sleep(0.1)
        said: list[str] = []
        ours = holder(wait=0)
        assert ours.acquire(said.append) == ""
        assert said == []
        assert ours.previous == "ops@old pid 1, run r0"
        ours.release()
    finally:
        reader.wait(timeout=30)


# --------------------------------------------------------------------------- read_before_lock


@pytest.fixture
def run_state(lockfile, monkeypatch):
    """hostlock's module state for one run, emptied after the test."""
    for name in ("_pending", "_held", "_refused", "_gates", "_beaters"):
        monkeypatch.setattr(hostlock, name, type(getattr(hostlock, name))())
    monkeypatch.delenv("TRITONFLEET_SPEED", raising=False)
    yield lockfile
    hostlock.release_all()


def slow(lk: hostlock.Holder, delay: float) -> hostlock.Holder:
    """``lk`` with a connection that takes ``delay`` seconds, as an SSH connection does."""
    plain = lk.argv
    lk.argv = lambda how: ["sh", "-c", f'sleep {delay}; exec "$0" "$@"', *plain(how)]  # type: ignore[method-assign]
    return lk


def test_read_sent_while_the_holder_connects_stands(run_state, monkeypatch):
    host = local_host()
    hostlock._start_all([slow(hostlock.Holder(host, 5, 1, 5), 0.5)], None)
    assert hostlock.pending(host)
    reads = []

    def read():
        reads.append(hostlock.pending(host))  # sent before the lock was held
        return seen()

    assert hostlock.read_before_lock(host, read) is True
    assert reads == [True]
    assert not hostlock.pending(host) and host.name in hostlock._held


def test_read_sent_after_this_runs_holder_took_the_lock_stands(run_state, lockfile):
    # the holder connected before the read went out (the deploy file's imports outlasted its
    # connection): the read finds the lock held by this run's own line, and is not sent again
    host = local_host()
    hostlock._start_all([hostlock.Holder(host, 5, 1, 5)], None)
    lk = next(lk for todo, _ in hostlock._pending for lk in todo)
    deadline = time.monotonic() + 20
    while not (lockfile.exists() and lockfile.read_text() == f"{lk.holder}\n"):
        assert time.monotonic() < deadline, "the holder never wrote its line"
        time.sleep(0.01)
    assert hostlock.pending(host)  # held on the host; this run has not read its "locked" yet
    assert hostlock.read_before_lock(host, seen) is True


def test_read_does_not_stand_when_another_run_took_the_lock_in_between(run_state, monkeypatch):
    host = local_host()
    hostlock._start_all([slow(hostlock.Holder(host, 5, 1, 5), 0.8)], None)

    def read():
        line = seen()
        another_run_takes_and_releases()  # before this run's holder has connected
        return line

    assert hostlock.read_before_lock(host, read) is False
    assert host.name in hostlock._held


def test_read_does_not_stand_when_another_run_held_the_lock_during_it(run_state, monkeypatch):
    keeper = holder()
    assert keeper.acquire() == ""
    host = local_host()
    hostlock._start_all([hostlock.Holder(host, 10, 1, 5)], None)

    def read():
        line = seen()
        keeper.release()  # that run ends; this run's holder then takes the lock
        return line

    assert hostlock.read_before_lock(host, read) is False
    assert host.name in hostlock._held


def test_no_read_before_the_lock_without_a_pending_holder_or_with_the_speed_switch_off(run_state, monkeypatch):
    host = local_host()
    assert hostlock.read_before_lock(host, lambda: pytest.fail("read with no holder pending")) is None
    hostlock._start_all([slow(hostlock.Holder(host, 5, 1, 5), 0.2)], None)
    monkeypatch.setenv("TRITONFLEET_SPEED", "off")
    assert hostlock.read_before_lock(host, lambda: pytest.fail("read before the lock with speed off")) is None
    assert host.name in hostlock._held  # waited for the lock all the same
