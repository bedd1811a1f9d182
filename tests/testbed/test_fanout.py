"""The fan-out on the test hosts (model_fanout: a wave's hosts serve each other the release, the
origin its web seed; docs/model-origin.md#fan-out): nginx on the testbed's bridge as the origin,
counted from its own access log; aria2c and Debian's opentracker installed on the hosts by staging.

The staging cases run bench/deploys/stage_models_only.py (the staging step alone, into a scratch
directory, no Triton needed); the rollout case runs ``tritonfleet rollout --stage`` on deployed
hosts. No inventory here names a zone or a seed: the default needs no topology data."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.support.testbed import (
    INVENTORY,
    live_release,
    pyinfra,
    repository_copy,
    ssh,
    tritonfleet,
)
from tritonfleet.model_repo import swarm, torrent
from tritonfleet_testbed import hosts
from tritonfleet_testbed.origin_servers import Nginx

SCRATCH = "/opt/tritonfleet-test-fanout"
DEPLOY = "bench/deploys/stage_models_only.py"


@pytest.fixture(scope="module")
def origin(testbed, tmp_path_factory):
    with Nginx(tmp_path_factory.mktemp("fanout") / "nginx", hosts.GATEWAY) as web:
        yield web


def release(path: Path, mb: int = 24) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    (path / "llm" / "1").mkdir(parents=True)
    (path / "llm" / "config.pbtxt").write_text('name: "llm"\nbackend: "python"\n')
    for i in range(3):
        (path / "llm" / "1" / f"shard-{i}.bin").write_bytes(random.randbytes(mb * 1_000_000 // 3))
    return path


def clean(targets) -> None:
    for h in targets:
        ssh(h, f"for f in {SCRATCH}/releases/.tritonfleet-swarm/*/pid; do [ -e \"$f\" ] && "
               f"kill -s TERM -- \"-$(cat \"$f\")\" 2>/dev/null; done; rm -rf {SCRATCH}; true", check=False)


def stage(targets, repo: Path, web, *data: str):
    extra = [a for h in targets for a in ("--limit", h.name)]
    for d in (f"triton_base_dir={SCRATCH}", f"model_repository={repo}", "model_overrides={}",
              f"model_origin={web.url}", "gpu_count=1", "model_fanout=True", "model_fanout_seed_minutes=1", *data):
        extra += ["--data", d]
    return pyinfra(DEPLOY, *extra, timeout=900)


def staged(h, repo: Path) -> dict[str, str]:
    """{path: sha256} of the release staged on the host, hashed there."""
    out = ssh(h, f"cd {SCRATCH}/releases && d=$(ls -d */ | grep -v '^\\.' | head -n 1) && cd \"$d\" && "
                 "find . -type f ! -name '.tritonfleet*' -exec sha256sum {} +")
    return {line.split()[1].removeprefix("./"): line.split()[0] for line in out.splitlines()}


def want(repo: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in repo.rglob("*") if p.is_file()}


def test_a_wave_with_no_topology_data_takes_the_release_from_the_origin_once(testbed, origin, tmp_path):
    targets = testbed.hosts[:3]
    clean(targets)
    repo = release(tmp_path / "repo")
    mark = origin.mark()
    res, _ = stage(targets, repo, origin)
    assert res.returncode == 0, res.stderr[-4000:]
    for h in targets:
        assert staged(h, repo) == want(repo)
    # one seed (no zone named anywhere): the origin sent the release's bytes once
    assert res.stderr.count("fan-out (seed") == 1, res.stderr[-3000:]
    assert res.stderr.count("fan-out (from peers") == len(targets) - 1
    size = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file())
    assert sum(origin.served(mark).values()) <= 1.1 * size, [ln for ln in res.stderr.splitlines() if "fan-out" in ln]
    clean(targets)


def test_a_peer_serving_corrupt_bytes_is_refused_and_the_release_fetched_whole(testbed, origin, tmp_path):
    """A test host joins the swarm with other bytes at the right sizes, serving them unchecked: the
    others refuse its pieces (the engine's SHA-1 per piece), and every object placed hashes to the
    manifest's sha256."""
    bad, targets = testbed.hosts[-1], testbed.hosts[:2]
    clean(targets + [bad])
    repo = release(tmp_path / "repo")
    manifest = {p: [os.path.getsize(repo / p), s] for p, s in want(repo).items()}
    t = torrent.from_repository(repo, manifest, {s for _, s in manifest.values()}, 1 << 20)
    tracker = f"http://{targets[0].address}:{swarm.TRACKER_PORT}/announce"
    ssh(bad, "command -v aria2c >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q aria2 >/dev/null")
    files = " && ".join(f"head -c {size} /dev/urandom > /tmp/bad/sha256/{s}" for size, s in
                        {tuple(v) for v in manifest.values()} if size)
    meta = t.metainfo(tracker).hex()
    ssh(bad, f"rm -rf /tmp/bad; mkdir -p /tmp/bad/sha256 && {files} && echo {meta} | xxd -r -p > /tmp/bad/t.torrent "
             "|| python3 -c \"import sys; open('/tmp/bad/t.torrent','wb').write(bytes.fromhex(sys.argv[1]))\" " + meta)
    ssh(bad, "setsid timeout 300 aria2c --dir=/tmp/bad --enable-dht=false --bt-enable-lpd=false --bt-seed-unverified=true "
             "--seed-ratio=0.0 --bt-tracker-interval=5 /tmp/bad/t.torrent < /dev/null > /tmp/bad/out 2>&1 & echo $! > /tmp/bad/pid")
    try:
        res, _ = stage(targets, repo, origin, "model_fanout_stall_seconds=10", "model_fanout_wait_seconds=60")
    finally:
        ssh(bad, "kill -s TERM -- -$(cat /tmp/bad/pid) 2>/dev/null; pkill -P $(cat /tmp/bad/pid) 2>/dev/null; rm -rf /tmp/bad",
            check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    for h in targets:
        assert staged(h, repo) == want(repo)
    clean(targets)


def test_a_peer_and_the_seed_going_away_mid_wave_the_wave_completes_from_the_origin(testbed, origin, tmp_path):
    """The origin's link slowed (tc on the bridge), the seed's and one peer's aria2c stopped a few
    seconds in: the others' swarms stall, and their fetch from the origin completes the release."""
    targets = testbed.hosts[:3]
    clean(targets)
    repo = release(tmp_path / "repo", mb=30)
    hosts.sh("tc", "qdisc", "replace", "dev", hosts.BRIDGE, "root", "tbf", "rate", "8mbit", "burst", "64kb", "latency", "100ms")

    def stop_swarms():
        time.sleep(10)
        for h in targets[:2]:  # the seed (the first by name) and a peer
            ssh(h, f"for f in {SCRATCH}/releases/.tritonfleet-swarm/*/pid; do kill -s KILL -- \"-$(cat \"$f\")\"; done",
                check=False)

    killer = threading.Thread(target=stop_swarms)
    killer.start()
    try:
        res, _ = stage(targets, repo, origin, "model_fanout_stall_seconds=8")
    finally:
        killer.join()
        hosts.sh("tc", "qdisc", "del", "dev", hosts.BRIDGE, "root", check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    # the swarm stopped short on some host, and the origin's fetch brought the rest
    assert re.search(r"fan-out \(.*, [1-9]\d* left to the origin", res.stderr), res.stderr[-3000:]
    for h in targets:
        assert staged(h, repo) == want(repo)
    clean(targets)


def test_a_rollout_through_the_fanout(deployed, origin, tmp_path):
    """``tritonfleet rollout --stage`` with model_fanout: the release staged through the swarm on
    every host before the batch, then served; the new shard left the origin once, not once a host
    (the test inventory places every model on CPU instances: both GPU classes get one release)."""
    testbed, _, _ = deployed
    targets = testbed.hosts[:2]
    repo = repository_copy(tmp_path / "repo")
    weights = repo / "resnet50_onnx" / "weights"
    weights.mkdir(exist_ok=True)
    (weights / "shard.bin").write_bytes(random.randbytes(8_000_000))
    before = {h.name: live_release(h) for h in targets}
    mark = origin.mark()
    args = ["rollout", INVENTORY, "deploys/models.py", "--stage", "--canary", "0", "--batch", "100%", "--json",
            "--limit", ",".join(h.name for h in targets), "--data", f"model_repository={repo}",
            "--data", f"model_origin={origin.url}", "--data", "model_fanout=True", "--data", "model_fanout_seed_minutes=1"]
    try:
        res = tritonfleet(*args, timeout=1500)
        report = json.loads(res.stdout)
        assert res.returncode == 0 and report["ok"], json.dumps(report, indent=1)[-4000:] + res.stderr[-3000:]
        for h in targets:
            assert live_release(h) != before[h.name]
        assert sum(origin.served(mark).values()) <= 1.1 * 8_000_000
    finally:
        # the session's hosts as they were: their swarms (still seeding) stopped and gone, so that no
        # later test finds the fan-out's files appear under the releases
        swarms = "/opt/triton/releases/.tritonfleet-swarm"
        for h in targets:
            ssh(h, f'for f in {swarms}/*/pid; do [ -e "$f" ] && kill -s TERM -- "-$(cat "$f")" 2>/dev/null; done; '
                   f"sleep 1; rm -rf {swarms}; true", check=False)
    # back to the session's release
    res, _ = pyinfra("deploys/models.py", *[a for h in targets for a in ("--limit", h.name)])
    assert res.returncode == 0, res.stderr[-3000:]
