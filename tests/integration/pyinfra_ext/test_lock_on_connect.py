"""The deploy lock taken while pyinfra connects (a repository's config.py, tritonfleet.pyinfra_ext.
connecting), through pyinfra's real command line on this machine (@local plays the host, with a
lock file of the test's own: real flock, real bash). The same over SSH, timed, is
bench/run.py noop (docs/scale.md)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tritonfleet.pyinfra_ext import hostlock, transfer

ROOT = Path(__file__).resolve().parents[3]

CLI = """
import sys
from pyinfra_cli.main import main
from tritonfleet.pyinfra_ext import hostlock
hostlock.LOCK_FILE = sys.argv.pop(1)  # this machine plays the host: a lock file of the test's own
sys.argv[0] = "pyinfra"
sys.exit(main())
"""

# before install(): which hosts' holders are started already (config.py's), then the run's one command
DEPLOY = """
from tritonfleet.pyinfra_ext import hostlock
started = sorted(lk.host.name for pending, _ in hostlock._pending for lk in pending)
print("STARTED-BEFORE-INSTALL", ",".join(started) or "-", flush=True)

from pyinfra.operations import server
from tritonfleet import pyinfra_patches

pyinfra_patches.install()
server.shell(name="mark", commands=["flock -n {lock} true && touch {mark}.unlocked || touch {mark}"])
"""


@pytest.fixture
def repo(tmp_path):
    """An operator's repository: this repository's config.py, a deploy file, a lock file."""
    shutil.copy(ROOT / "config.py", tmp_path / "config.py")
    lock, mark = tmp_path / "deploy.lock", tmp_path / "ran"
    (tmp_path / "deploy.py").write_text(DEPLOY.format(lock=lock, mark=mark))
    return SimpleNamespace(path=tmp_path, lock=lock, mark=mark)


def pyinfra(repo, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, str(repo.lock), *args],
        cwd=repo.path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def started_before_install(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("STARTED-BEFORE-INSTALL ")]
    assert lines, (res.stdout + res.stderr)[-3000:]
    return lines[0].split(" ", 1)[1]


@pytest.fixture
def other_run(repo, monkeypatch):
    """Another run's holder keeping the repository's lock file."""
    monkeypatch.setattr(transfer, "choose", lambda host, wanted: "local")
    monkeypatch.setattr(hostlock, "LOCK_FILE", str(repo.lock))
    other = hostlock.Holder(SimpleNamespace(name="@local", data={}), 0, 1, 30, holder="ops@ctl1 pid 4242")
    assert other.acquire() == ""
    yield other
    other.release()


def test_config_py_starts_the_holders_before_the_deploy_file_runs(repo):
    res = pyinfra(repo, "-y", "@local", "deploy.py")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert started_before_install(res) == "@local"
    assert repo.mark.exists() and not Path(f"{repo.mark}.unlocked").exists()  # held while the command ran


def test_without_config_py_or_with_the_speed_switch_off_install_starts_them(repo):
    import os

    res = pyinfra(repo, "-y", "@local", "deploy.py", env=dict(os.environ, TRITONFLEET_SPEED="off"))
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert started_before_install(res) == "-"
    assert repo.mark.exists() and not Path(f"{repo.mark}.unlocked").exists()
    (repo.path / "config.py").unlink()
    repo.mark.unlink()
    res = pyinfra(repo, "-y", "@local", "deploy.py")
    assert res.returncode == 0 and started_before_install(res) == "-", (res.stdout + res.stderr)[-3000:]
    assert repo.mark.exists() and not Path(f"{repo.mark}.unlocked").exists()


def test_a_lock_another_run_keeps_still_stops_the_run_before_its_first_command(repo, other_run):
    res = pyinfra(repo, "-y", "@local", "deploy.py", "--data", "deploy_lock_timeout=0")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert started_before_install(res) == "@local"
    assert "@local: another run holds the deploy lock" in out and "ops@ctl1 pid 4242" in out, out[-3000:]
    assert "Traceback" not in out and not repo.mark.exists() and not Path(f"{repo.mark}.unlocked").exists()
    assert other_run.alive()


def test_runs_that_take_no_lock_take_none_from_config_py(repo):
    """exec, fact, --dry runs and a deploy file that never calls install(), from the same
    directory: no holder starts (a holder's first act on the host is to open the lock file)."""
    res = pyinfra(repo, "-y", "@local", "exec", "--", "echo", "exec-ran")
    assert res.returncode == 0 and "exec-ran" in res.stdout + res.stderr, (res.stdout + res.stderr)[-3000:]
    res = pyinfra(repo, "-y", "@local", "fact", "server.Hostname")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    res = pyinfra(repo, "--dry", "@local", "deploy.py")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert started_before_install(res) == "-" and not repo.mark.exists()
    plain = repo.path / "plain.py"
    plain.write_text("from pyinfra.operations import server\nserver.shell(commands=['true'])\n")
    res = pyinfra(repo, "-y", "@local", "plain.py")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert not repo.lock.exists()


def test_a_host_pyinfra_cannot_reach_has_its_holder_ended_and_the_run_goes_on(repo):
    """A host whose connection fails (nothing listens on its port): its holder, started as pyinfra
    began to connect, is ended; the lock of the host that connected is held and the run goes on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the test runs: nothing listens there
    inventory = repo.path / "inventory.py"
    inventory.write_text(
        f'hosts = ["@local", ("gone", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}, '
        f'"ssh_connect_retries": 0}})]\n'
    )
    res = pyinfra(repo, "-y", "inventory.py", "deploy.py")
    out = res.stdout + res.stderr
    assert started_before_install(res) == "@local", out[-3000:]  # gone: ended when its connect failed
    assert "gone" in out and "could not take the deploy lock" not in out, out[-3000:]
    assert repo.mark.exists() and not Path(f"{repo.mark}.unlocked").exists(), out[-3000:]
