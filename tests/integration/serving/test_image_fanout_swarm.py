"""The image fan-out's swarm on this machine with the real parts (tritonfleet.serving.image_fanout,
tritonfleet.model_repo.swarm): Debian's registry asking for a login, holding a pushed image; the
mirror host's program making the image's torrent from the registry's own store; Debian's
opentracker and aria2c. Hosts are directories. The seed host reads the registry as its web seed
(the torrent laid out as the registry's blob URLs, its login in a 0600 file), the others only
their peers: the registry sends each blob about once and every host ends with every blob,
checked. A wrong password leaves the seed nothing from the registry (and the wave falls back)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tritonfleet.model_repo import swarm
from tritonfleet.model_repo.fetch import OBJECTS_DIR
from tritonfleet.serving import image_fanout as fan
from tritonfleet_testbed.origin_servers import Registry, synthetic_image
from tritonfleet_testbed.ports import free_port
from tritonfleet_testbed.swarm_servers import Tracker, aria2_env

PATH = "nvidia/tritonserver"
USER, PASSWORD = "tritonfleet", "pa:ss w#rd-" + os.urandom(4).hex()


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """(registry, tracker, the mirror program's answer, the image's size) for a pushed image of 3
    layers, the registry asking for USER's login."""
    work = tmp_path_factory.mktemp("imgswarm")
    with Registry(work / "registry", users={USER: PASSWORD}) as reg, Tracker(work / "tracker") as tracker:
        digest = reg.push(synthetic_image(work / "image.tar.gz", 12, layers=3), f"{PATH}:1", creds=(USER, PASSWORD))
        web_seed = f"http://{reg.host}/v2/{PATH}/"
        out = subprocess.run([sys.executable, "-c", fan.seed_program(), str(reg.storage), PATH, digest,
                              tracker.url, str(256 * 1024), web_seed],
                             capture_output=True, text=True, check=True, timeout=120)
        seed = fan.parse_seed(out.stdout.splitlines())
        assert "skip" not in seed, seed
        tracker.allow(seed["info_hash"])
        yield reg, tracker, seed, sum(seed["blobs"].values())


@pytest.fixture(autouse=True)
def no_swarm_outlives_its_test(tmp_path):
    yield
    for pid in tmp_path.rglob(f"{swarm.SWARM_DIR}/*/pid"):
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(pid.read_text()), signal.SIGKILL)


def run(base: Path, seed: dict, *, web: bool, password: str = PASSWORD, stall: int = 8) -> swarm.SwarmResult:
    (base / "releases").mkdir(parents=True, exist_ok=True)
    script = swarm.swarm_script(str(base), seed["info_hash"], list(range(1, len(seed["blobs"]) + 1)),
                                port=free_port(), seed_minutes=0.2, stall_seconds=stall, wait_seconds=90,
                                layout=fan.SWARM_LAYOUT, web_user=USER if web else None)
    meta = seed["seed_torrent"] if web else seed["torrent"]
    stdin = (password + "\n" if web else "") + swarm.swarm_input(meta, seed["blobs"])
    res = subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, text=True, timeout=150,
                         env=aria2_env(base.parent.parent / "aria2"))
    assert res.returncode == 0, res.stderr
    return swarm.parse_swarm(res.stdout.splitlines())


def sw(base: Path, seed: dict) -> Path:
    return base / "releases" / swarm.SWARM_DIR / seed["info_hash"]


def test_the_seed_reads_the_registry_once_and_the_wave_each_other(tmp_path, image):
    reg, _, seed, size = image
    mark = reg.mark()
    names = ["seed", "h1", "h2", "h3"]
    results: dict[str, swarm.SwarmResult] = {}
    logins: dict[str, str] = {}

    def one(name):
        results[name] = run(tmp_path / name, seed, web=name == "seed")

    def watch():  # the login file while the seed downloads: 0600, the password in it, never on a command line
        f = sw(tmp_path / "seed", seed) / "login.conf"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if f.exists():
                logins["mode"] = oct(f.stat().st_mode & 0o777)
                return
            time.sleep(0.001)

    with ThreadPoolExecutor(len(names) + 1) as pool:  # the watcher first, the hosts 0.2 s apart
        jobs = [pool.submit(watch)]
        for n in names:
            time.sleep(0.2)
            jobs.append(pool.submit(one, n))
        for job in jobs:
            job.result()
    for name in names:
        r = results[name]
        assert r.end == "done" and r.got == seed["blobs"] and not r.missed, (name, r)
        for h in seed["blobs"]:
            data = (tmp_path / name / "releases" / OBJECTS_DIR / h).read_bytes()
            assert hashlib.sha256(data).hexdigest() == h
    sent = reg.blob_bytes(mark)
    print(f"\nimage {size} B to {len(names)} hosts: the registry sent {sent} B of blobs ({sent / size:.3f}x)")
    assert 0.99 * size <= sent <= 1.1 * size, (sent, size)  # the seed's web seed once; the rest from peers
    assert logins.get("mode") == "0o600", logins
    run_script = (sw(tmp_path / "seed", seed) / "run").read_text()  # aria2c's command line
    assert PASSWORD not in run_script and "--conf-path=" in run_script
    assert not (sw(tmp_path / "seed", seed) / "login.conf").exists()  # gone once its download ended
    for name in names:
        assert not [p for p in sw(tmp_path / name, seed).rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]


def test_a_seed_whose_login_is_refused_takes_nothing_from_the_registry(tmp_path, image):
    reg, _, seed, _ = image
    mark = reg.mark()
    r = run(tmp_path / "seed", seed, web=True, password="wrong-" + PASSWORD, stall=5)
    assert r.end != "done" and not r.got and sorted(r.missed) == sorted(seed["blobs"]), r
    assert reg.blob_bytes(mark) == 0
    log = (sw(tmp_path / "seed", seed) / "log").read_text()
    assert "401" in log or "Authorization failed" in log, log[-2000:]
