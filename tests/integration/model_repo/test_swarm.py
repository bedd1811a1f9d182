"""The fan-out's host side (tritonfleet.model_repo.swarm, torrent) with Debian's aria2c and
opentracker and nginx as the origin, on this machine: hosts are directories, each with its aria2c on
its own port. A wave takes every object from its seed (the origin's web seed) and from each other,
the origin sending each byte once; a peer serving corrupt bytes is refused (nothing of it is
linked, the origin's fetch takes over); a seed that goes away mid-wave leaves the rest to the
origin's direct fetch."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tritonfleet.model_repo import fetch, swarm, torrent
from tritonfleet.model_repo import release as release_plan
from tritonfleet_testbed.origin_servers import Nginx
from tritonfleet_testbed.ports import free_port
from tritonfleet_testbed.swarm_servers import Tracker, aria2_env

PIECE = 64 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def origin(tmp_path):
    """nginx holding three objects, a tracker that knows their torrent; (web, tracker, blobs, torrent)."""
    blobs = {sha(d): d for d in (os.urandom(700_000), os.urandom(450_001), os.urandom(130_000))}
    with Nginx(tmp_path / "nginx") as web, Tracker(tmp_path / "tracker") as tracker:
        for s, d in blobs.items():
            p = web.object_path(s)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(d)
        t = torrent.make({s: len(d) for s, d in blobs.items()}, lambda s: open(web.object_path(s), "rb"), PIECE)
        tracker.allow(t.info_hash)
        try:
            yield web, tracker, blobs, t
        finally:  # no swarm outlives its test, passed or not
            for pid in tmp_path.rglob(f"{swarm.SWARM_DIR}/*/pid"):
                with contextlib.suppress(OSError, ValueError):
                    os.killpg(int(pid.read_text()), signal.SIGKILL)


def run_swarm(tmp_path: Path, name: str, t, meta: bytes, want: dict[str, int], stall: int = 6,
              wait: int = 60, seed_minutes: float = 0.3, log_level: str = "notice",
              port: int | None = None) -> swarm.SwarmResult:
    base = tmp_path / name
    (base / "releases").mkdir(parents=True, exist_ok=True)
    script = swarm.swarm_script(str(base), t.info_hash, [t.files.index(s) + 1 for s in want], port=port or free_port(),
                                seed_minutes=seed_minutes, stall_seconds=stall, wait_seconds=wait,
                                log_level=log_level)
    res = subprocess.run(["sh", "-c", script], input=swarm.swarm_input(meta, want), capture_output=True, text=True,
                         timeout=wait + 30, env=aria2_env(tmp_path.parent / "aria2"))
    assert res.returncode == 0, res.stderr
    return swarm.parse_swarm(res.stdout.splitlines())


def gone(group: int) -> bool:
    """No live process is left in the process group (a zombie not yet reaped does not count)."""
    for _ in range(20):
        ps = subprocess.run(["ps", "-o", "stat=", "-g", str(group)], capture_output=True, text=True).stdout.split()
        if not [s for s in ps if not s.startswith("Z")]:
            return True
        time.sleep(0.5)
    return False


def objects(tmp_path: Path, name: str) -> Path:
    return tmp_path / name / "releases" / fetch.OBJECTS_DIR


def test_a_wave_takes_each_byte_from_the_origin_once(tmp_path, origin):
    web, tracker, blobs, t = origin
    want = {s: len(d) for s, d in blobs.items()}
    mark = web.mark()
    results: dict[str, swarm.SwarmResult] = {}
    names = ["seed", "h1", "h2", "h3"]

    def one(name):
        meta = t.metainfo(tracker.url, f"{web.url}/objects/" if name == "seed" else None)
        results[name] = run_swarm(tmp_path, name, t, meta, want)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for th in threads:
        th.start()
        time.sleep(0.3)
    for th in threads:
        th.join()
    for name in names:
        r = results[name]
        assert r.end == "done" and r.got == want and not r.missed, (name, r)
        for s, d in blobs.items():
            assert (objects(tmp_path, name) / s).read_bytes() == d
    served = sum(web.served(mark).values())
    assert served <= 1.1 * sum(want.values()), served  # the others took it from the seed and each other


def test_a_peer_serving_corrupt_bytes_is_refused_and_the_origin_fetch_takes_over(tmp_path, origin):
    web, tracker, blobs, t = origin
    want = {s: len(d) for s, d in blobs.items()}
    # the only peer holds other bytes at the right sizes and serves them unchecked
    bad = tmp_path / "bad"
    for s, n in want.items():
        (bad / "sha256").mkdir(parents=True, exist_ok=True)
        (bad / "sha256" / s).write_bytes(os.urandom(n))
    (bad / "t.torrent").write_bytes(t.metainfo(tracker.url))
    env = aria2_env(tmp_path.parent / "aria2")
    peer = subprocess.Popen(["aria2c", f"--dir={bad}", "--enable-dht=false", "--bt-enable-lpd=false",
                             "--bt-seed-unverified=true", "--seed-ratio=0.0", "--seed-time=2", f"--listen-port={free_port()}",
                             "--bt-tracker-interval=5", "--summary-interval=0", str(bad / "t.torrent")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    try:
        time.sleep(2)
        r = run_swarm(tmp_path, "h1", t, t.metainfo(tracker.url), want, stall=8, wait=15, log_level="info")
    finally:
        peer.terminate()
        peer.wait(timeout=10)
    assert r.end != "done" and not r.got and sorted(r.missed) == sorted(want), r
    log = (tmp_path / "h1" / "releases" / swarm.SWARM_DIR / t.info_hash / "log").read_text()
    # the peer's pieces arrived (aria2c's info log names each block) and none was kept
    assert re.search(r"From: 127\.0\.0\.1:\d+ piece index=", log), log[-2000:]
    assert not any(objects(tmp_path, "h1").iterdir())  # nothing of the peer's was linked
    # the unfinished swarm was stopped, aria2c with it: the host serves nothing of it
    pid = int((tmp_path / "h1" / "releases" / swarm.SWARM_DIR / t.info_hash / "pid").read_text())
    assert gone(pid)
    # the origin's fetch then takes every object, checked
    paths = {f"m/{i}": s for i, s in enumerate(sorted(want))}
    inc = tmp_path / "h1" / "releases" / release_plan.incoming_dir("rel1", "run1")
    (inc / "m").mkdir(parents=True)
    script = fetch.fetch_script(str(tmp_path / "h1"), "rel1", "run1", parallel=4, retries=0, connect_timeout=3)
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                         input=fetch.fetch_list({s: (n, f"{web.url}/objects/sha256/{s}") for s, n in want.items()}, paths))
    got = fetch.parse_fetch(res.stdout.splitlines())
    assert got.ok and got.placed == len(paths), res.stdout
    assert all((inc / p).read_bytes() == blobs[s] for p, s in paths.items())


def test_the_seed_going_away_mid_wave_leaves_the_rest_to_the_origin(tmp_path, origin):
    web, tracker, blobs, t = origin
    want = {s: len(d) for s, d in blobs.items()}
    # the seed takes from the web seed slowly and is stopped a second in; the other host's
    # swarm stalls and says what it is missing, with nothing half-written linked
    env = aria2_env(tmp_path.parent / "aria2")
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "t.torrent").write_bytes(t.metainfo(tracker.url, f"{web.url}/objects/"))
    seed = subprocess.Popen(["aria2c", f"--dir={tmp_path / 'seed'}", "--enable-dht=false", "--bt-enable-lpd=false",
                             "--max-overall-download-limit=200K", "--seed-ratio=0.0", "--seed-time=2",
                             f"--listen-port={free_port()}", "--bt-tracker-interval=5", "--summary-interval=0",
                             str(tmp_path / "seed" / "t.torrent")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    killer = threading.Timer(3.0, seed.kill)
    killer.start()
    try:
        r = run_swarm(tmp_path, "h1", t, t.metainfo(tracker.url), want, stall=5)
    finally:
        killer.cancel()
        seed.kill()
        seed.wait(timeout=10)
    assert r.end == "stalled" and r.missed, r
    assert set(r.got) | set(r.missed) == set(want)
    for s in r.got:
        assert (objects(tmp_path, "h1") / s).read_bytes() == blobs[s]
    assert not [p for p in objects(tmp_path, "h1").iterdir() if p.name in r.missed]


def test_the_torrent_is_the_one_debians_mktorrent_makes(tmp_path):
    """The same files and piece length give the same info hash as mktorrent (Debian's package), so
    any BitTorrent client reads the torrent as its own tools would make it."""
    from tritonfleet_testbed.swarm_servers import unpacked

    env = dict(os.environ, **unpacked(tmp_path.parent / "mktorrent", ("mktorrent",)))
    blobs = {sha(d): d for d in (os.urandom(100_000), os.urandom(70_001), os.urandom(3))}
    (tmp_path / "sha256").mkdir()
    for s, d in blobs.items():
        (tmp_path / "sha256" / s).write_bytes(d)
    subprocess.run(["mktorrent", "-l", "16", "-a", "http://t/announce", "-o", str(tmp_path / "m.torrent"), "sha256"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    t = torrent.make({s: len(d) for s, d in blobs.items()}, lambda s: open(tmp_path / "sha256" / s, "rb"), 1 << 16)
    meta = (tmp_path / "m.torrent").read_bytes()
    assert torrent.bencode(t.info) in meta


def test_a_new_release_stops_the_swarm_of_the_last_one_still_seeding(tmp_path, origin):
    """The last release's aria2c seeds on for model_fanout_seed_minutes, on the port the new one
    needs: the new swarm stops it (its whole process group) and starts on that port."""
    web, tracker, blobs, _ = origin
    first, second = sorted(blobs)[:2], sorted(blobs)[2:]
    port = free_port()
    for part in (first, second):
        t = torrent.make({s: len(blobs[s]) for s in part}, lambda s: open(web.object_path(s), "rb"), PIECE)
        tracker.allow(t.info_hash)
        r = run_swarm(tmp_path, "h1", t, t.metainfo(tracker.url, f"{web.url}/objects/"),
                      {s: len(blobs[s]) for s in part}, seed_minutes=5, port=port)
        assert r.end == "done" and set(r.got) == set(part), r
        if part is first:
            old = int((tmp_path / "h1" / "releases" / swarm.SWARM_DIR / t.info_hash / "pid").read_text())
            assert not gone(old)  # seeding on
    assert gone(old)
    assert [d.name for d in (tmp_path / "h1" / "releases" / swarm.SWARM_DIR).iterdir()] == [t.info_hash]


def test_a_swarm_killed_outright_is_seen_gone_at_once(tmp_path, origin):
    """aria2c killed with its group (SIGKILL: the OOM killer, an operator) writes no exit status:
    the host sees it gone and leaves everything to the origin, rather than waiting out
    model_fanout_wait_seconds."""
    _, tracker, blobs, t = origin
    want = {s: len(d) for s, d in blobs.items()}
    pid = tmp_path / "h1" / "releases" / swarm.SWARM_DIR / t.info_hash / "pid"

    def kill():
        for _ in range(100):
            if pid.exists() and pid.read_text().strip():
                time.sleep(1)
                os.killpg(int(pid.read_text()), signal.SIGKILL)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill)
    killer.start()
    r = run_swarm(tmp_path, "h1", t, t.metainfo(tracker.url), want, stall=60, wait=20)
    killer.join()
    assert r.end == "stalled" and sorted(r.missed) == sorted(want), r
