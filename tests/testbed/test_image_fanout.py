"""The image fan-out on the test hosts (image_fanout: the Triton image's blobs shared between a
wave's hosts, the image mirror's registry the web seed of one of them, loaded into Docker by digest;
docs/model-origin.md#the-image): Debian's registry on the bridge as the upstream, the mirror set
up by deploys/mirror.py on the last test host, its blob bytes counted from its own log (journald:
``http.response.written`` of each GET of a blob); bench/deploys/stage_image_only.py as the
staging run (no Triton needed: Docker only, installed here when missing)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.support.testbed import pyinfra, ssh, write_inventory
from tritonfleet.model_repo import swarm, torrent
from tritonfleet.serving import image_fanout as fan
from tritonfleet_testbed import hosts
from tritonfleet_testbed.origin_servers import Registry, free_port, log_blob_bytes, synthetic_image, tls_files

DEPLOY = "bench/deploys/stage_image_only.py"
REPO = "nvidia/tritonserver"
STORAGE = "/var/lib/docker-registry"  # image_mirror_storage's default
SWARMS = f"{fan.HOST_BASE}/releases/{swarm.SWARM_DIR}"


@pytest.fixture(scope="module")
def wave(testbed, tmp_path_factory):
    work = tmp_path_factory.mktemp("imgfan")
    mirror_host, targets = testbed.hosts[-1], testbed.hosts[:-1]
    for h in targets:
        ssh(h, "command -v docker >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
               "--no-install-recommends docker.io >/dev/null", timeout=900)
    with pytest.MonkeyPatch.context() as env, Registry(work / "upstream", hosts.GATEWAY) as upstream:
        env.setenv("TRITONFLEET_MIRROR_PASSWORD", f"mirror-client-{random.randrange(1 << 30)}")
        # an image of its own (random layers): the session's hosts hold the stand-in Triton image's
        # layers from other tests, and Docker would take those instead of any byte of the mirror's
        digest = upstream.push(synthetic_image(work / "image.tar.gz", 120, layers=2), f"{REPO}:24.08-py3")
        tls = tls_files(work / "tls", mirror_host.address)
        mirror = f"{mirror_host.address}:{free_port()}"
        groups: dict[str, list[str]] = {"image_mirror": [mirror_host.name]}
        for h in targets:
            groups.setdefault(h.gpu_class, []).append(h.name)
        inventory = write_inventory(work / "inv", groups, image_mirror=mirror,
                                    image_mirror_port=int(mirror.rsplit(":", 1)[1]),
                                    image_mirror_upstream=f"http://{upstream.host}",
                                    image_mirror_tls_cert=tls["mirror.crt"], image_mirror_tls_key=tls["mirror.key"],
                                    image_mirror_ca=tls["ca.crt"], image_fanout=True, model_fanout_seed_minutes=1,
                                    model_fanout_stall_seconds=10, model_fanout_wait_seconds=300,
                                    triton_image=f"{upstream.host}/{REPO}:24.08-py3@{digest}")
        res, _ = pyinfra("deploys/mirror.py", inventory=inventory, timeout=900)
        assert res.returncode == 0, res.stderr[-5000:]
        try:
            yield {"targets": targets, "mirror_host": mirror_host, "mirror": mirror, "digest": digest,
                   "inventory": inventory, "upstream": upstream, "tracker": f"http://{mirror_host.address}:{swarm.TRACKER_PORT}/announce",
                   "image_size": sum(p.stat().st_size for p in upstream.storage.rglob("data"))}
        finally:
            for h in targets:
                forget(h, mirror, digest)
                ssh(h, f"docker logout {mirror} >/dev/null 2>&1; rm -rf /etc/docker/certs.d/{mirror}", check=False)
            ssh(mirror_host, "for f in /var/lib/docker-registry/tritonfleet-image-seed/*/pid; do kill -s TERM -- "
                             "\"-$(cat \"$f\")\" 2>/dev/null; done; systemctl stop docker-registry; "
                             "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q docker-registry apache2-utils >/dev/null; "
                             "rm -rf /var/lib/docker-registry /etc/docker/registry "
                             "/etc/systemd/system/docker-registry.service.d; systemctl daemon-reload", check=False)


def forget(h, mirror: str, digest: str) -> None:
    """The host without the image or a swarm of it."""
    ssh(h, f"docker rmi -f {mirror}/{REPO}@{digest} >/dev/null 2>&1; "
           f"for f in {SWARMS}/*/pid; do [ -e \"$f\" ] && "
           "kill -s TERM -- \"-$(cat \"$f\")\" 2>/dev/null; done; sleep 1; "
           "rm -rf /var/lib/tritonfleet-image-fanout/releases; true", check=False)


def mirror_blob_bytes(mirror_host, since: float) -> int:
    """Bytes of blob bodies the mirror sent since ``since`` (its own JSON log, in journald)."""
    return log_blob_bytes(ssh(mirror_host, f"journalctl -u docker-registry -o cat --since=@{int(since)} --no-pager"))


def has_image(h, ref: str) -> bool:
    out = ssh(h, f"docker image inspect --format '{{{{json .RepoDigests}}}}' {ref} 2>/dev/null", check=False)
    return ref in out


def test_the_wave_takes_the_image_from_the_mirror_about_once(wave):
    targets, mirror, digest = wave["targets"], wave["mirror"], wave["digest"]
    for h in targets:
        forget(h, mirror, digest)
    since = time.time() - 1
    res, _ = pyinfra(DEPLOY, inventory=wave["inventory"], timeout=1200)
    assert res.returncode == 0, res.stderr[-5000:]
    fan = [ln for ln in res.stderr.splitlines() if "image fan-out" in ln]
    assert sum("loaded by digest" in ln for ln in fan) == len(targets), "\n".join(fan) or res.stderr[-4000:]
    for h in targets:
        assert has_image(h, f"{mirror}/{REPO}@{digest}"), h.name
        assert "127.0.0.1:" not in ssh(h, "docker images --digests --format '{{.Repository}}'")
    sent = mirror_blob_bytes(wave["mirror_host"], since)
    print(f"\nimage {wave['image_size']} B, {len(targets)} hosts: mirror sent {sent} B of blobs", *fan, sep="\n")
    # once, to the seed host (its web seed, as the mirror's TLS client with its login); with the
    # fan-out off the same wave cost len(targets) times the image (bench/run.py fanout)
    assert 0.9 * wave["image_size"] <= sent <= 1.1 * wave["image_size"], (sent, wave["image_size"], fan)
    assert sum("seed, from the mirror's registry" in ln for ln in fan) == 1, "\n".join(fan)


def test_a_host_whose_swarm_fails_pulls_through_the_mirror(wave):
    """One host cannot load from the swarm (its throwaway registry's port taken by another
    listener): it says so and the pull through the mirror brings the image; the others load from
    the swarm as before."""
    targets, mirror, digest = wave["targets"], wave["mirror"], wave["digest"]
    for h in targets:
        forget(h, mirror, digest)
    since = time.time() - 1
    blocked = targets[0]
    ssh(blocked, "setsid timeout 600 python3 -m http.server --bind 127.0.0.1 5079 </dev/null >/dev/null 2>&1 & "
                 "echo $! > /tmp/imgfan-block.pid; sleep 1")
    try:
        res, _ = pyinfra(DEPLOY, inventory=wave["inventory"], timeout=1200)
    finally:
        ssh(blocked, "kill $(cat /tmp/imgfan-block.pid); rm -f /tmp/imgfan-block.pid", check=False)
    assert res.returncode == 0, res.stderr[-5000:]
    fan = [ln for ln in res.stderr.splitlines() if "image fan-out" in ln]
    assert any(blocked.name in ln and "pulling through the mirror" in ln for ln in fan), "\n".join(fan)
    assert sum("loaded by digest" in ln for ln in fan) == len(targets) - 1, "\n".join(fan)
    for h in targets:
        assert has_image(h, f"{mirror}/{REPO}@{digest}"), h.name
    # the mirror sent the image twice: once to the seed host's web seed, once to the host that
    # pulled through it (its log counts blobs)
    sent = mirror_blob_bytes(wave["mirror_host"], since)
    assert 1.8 * wave["image_size"] <= sent <= 2.2 * wave["image_size"], (sent, wave["image_size"])


def limited(hosts_: list) -> list[str]:
    return [a for h in hosts_ for a in ("--limit", h.name)]


def sent(h) -> int:
    """Bytes ``h`` has sent on its link (its interface's counter)."""
    return int(hosts.sh("ip", "netns", "exec", h.netns, "cat", "/sys/class/net/host0/statistics/tx_bytes").stdout)


def test_a_peer_serving_corrupt_image_bytes_is_refused_and_the_blobs_taken_elsewhere(wave):
    """A test host outside the wave joins the image's swarm with other bytes at the blobs' sizes,
    serving them unchecked (aria2c --bt-seed-unverified): the wave's hosts refuse its pieces
    (aria2c's SHA-1 of each piece, then each blob's sha256), take them from the seed host (the
    mirror's registry its web seed) and each other, and load the pinned image by digest; nothing
    falls back to the mirror's pull, and the mirror sends the image about once. The mirror host's
    link is slowed meanwhile (tc on its end), so the corrupt peer is the faster source and the
    wave asks it for pieces."""
    targets, mirror, digest, mirror_host = wave["targets"], wave["mirror"], wave["digest"], wave["mirror_host"]
    bad, members = targets[-1], targets[:-1]
    for h in targets:
        forget(h, mirror, digest)
    # what staging installs first, and the corrupt peer's aria2c (this test may run without the others)
    for h, pkgs in ((mirror_host, "opentracker"), (bad, "aria2")):
        ssh(h, f"dpkg -s {pkgs} >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
               f"--no-install-recommends {pkgs} >/dev/null", timeout=900)
    # the torrent the staging run makes: made on the mirror host by the same script
    script = fan.seed_script(STORAGE, REPO, digest, wave["tracker"], f"https://{mirror}/v2/{REPO}/", piece=1 << 20)
    seed = fan.parse_seed(ssh(mirror_host, script).splitlines())
    assert "skip" not in seed, seed
    files = " && ".join(f"head -c {size} /dev/urandom > '/tmp/bad/{fan.SWARM_LAYOUT}{h}'" for h, size in seed["blobs"].items())
    ssh(bad, f"rm -rf /tmp/bad; mkdir -p /tmp/bad/{fan.SWARM_LAYOUT.split('/')[0]} && {files} && python3 -c \"import sys; "
             f"open('/tmp/bad/t.torrent','wb').write(bytes.fromhex(sys.argv[1]))\" {seed['torrent'].hex()}")
    ssh(bad, "setsid timeout 600 aria2c --dir=/tmp/bad --enable-dht=false --bt-enable-lpd=false --bt-seed-unverified=true "
             "--check-integrity=false --seed-ratio=0.0 --bt-tracker-interval=5 --listen-port=6899 /tmp/bad/t.torrent "
             "< /dev/null > /tmp/bad/out 2>&1 & echo $! > /tmp/bad/pid; sleep 6")
    since, bad_sent = time.time() - 1, sent(bad)
    cap = ["ip", "netns", "exec", mirror_host.netns, "tc", "qdisc"]
    hosts.sh(*cap, "replace", "dev", "host0", "root", "tbf", "rate", "40mbit", "burst", "64kb", "latency", "100ms")
    try:
        res, _ = pyinfra(DEPLOY, *limited([*members, mirror_host]), inventory=wave["inventory"], timeout=1200)
    finally:
        hosts.sh(*cap, "del", "dev", "host0", "root", check=False)
        bad_sent = sent(bad) - bad_sent
        ssh(bad, "kill -s TERM -- -$(cat /tmp/bad/pid) 2>/dev/null; rm -rf /tmp/bad", check=False)
    assert res.returncode == 0, res.stderr[-5000:]
    fan_lines = [ln for ln in res.stderr.splitlines() if "image fan-out" in ln]
    print(f"\nthe corrupt peer sent {bad_sent} B", *fan_lines, sep="\n")
    for h in members:  # Docker checked every layer it took by its digest
        assert has_image(h, f"{mirror}/{REPO}@{digest}"), h.name
    # more than two 1 MiB pieces of other bytes offered (and refused): 66-84 MB on 6 hosts, 7.6 MB on 3
    assert bad_sent > 2_000_000, "the corrupt peer served (almost) nothing: the test did not test"
    loaded = sum("loaded by digest" in ln for ln in fan_lines)
    assert loaded == len(members), "\n".join(fan_lines)
    assert mirror_blob_bytes(mirror_host, since) <= 1.1 * wave["image_size"]  # the web seed's once


def test_the_seed_and_a_peer_going_away_mid_wave_the_hosts_pull_through_the_mirror(wave):
    """The mirror host's link slowed (tc on its end: the registry the seed host reads behind it),
    the seed host's swarm and another host's killed a few seconds after the seed's swarm starts,
    then the link freed: the swarms stall, each host that lacks a blob says so and the pull
    through the mirror completes the wave."""
    targets, mirror, digest, mirror_host = wave["targets"], wave["mirror"], wave["digest"], wave["mirror_host"]
    for h in targets:
        forget(h, mirror, digest)
    # who seeds with no topology data: the wave's first host by name
    seed_host = next(h for h in targets if h.name in torrent.seeds([(t.name, None, None) for t in targets]))
    peer = next(h for h in targets if h is not seed_host)
    cap = ["ip", "netns", "exec", mirror_host.netns, "tc", "qdisc"]
    hosts.sh(*cap, "replace", "dev", "host0", "root", "tbf", "rate", "8mbit", "burst", "64kb", "latency", "100ms")
    killed: list[str] = []

    def stop_seed():
        deadline = time.time() + 300
        while time.time() < deadline and not ssh(seed_host, f"ls {SWARMS}/*/pid 2>/dev/null", check=False).strip():
            time.sleep(0.5)
        time.sleep(3)
        killed.append(ssh(seed_host, f"for f in {SWARMS}/*/pid; do kill -s KILL -- \"-$(cat \"$f\")\" && echo seed; done",
                          check=False))
        killed.append(ssh(peer, f"for f in {SWARMS}/*/pid; do kill -s KILL -- \"-$(cat \"$f\")\" && echo peer; done",
                          check=False))
        hosts.sh(*cap, "del", "dev", "host0", "root", check=False)

    killer = threading.Thread(target=stop_seed)
    since = time.time() - 1
    killer.start()
    try:
        res, _ = pyinfra(DEPLOY, inventory=wave["inventory"], timeout=1200)
    finally:
        killer.join()
        hosts.sh(*cap, "del", "dev", "host0", "root", check=False)
    assert res.returncode == 0, res.stderr[-5000:]
    fan_lines = [ln for ln in res.stderr.splitlines() if "image fan-out" in ln]
    print("", *killed, *fan_lines, sep="\n")
    assert "seed" in killed[0] and "peer" in killed[1], killed
    fell_back = [h for h in targets if any(h.name in ln and "pulling through the mirror" in ln for ln in fan_lines)]
    assert fell_back, "\n".join(fan_lines)
    for h in targets:
        assert has_image(h, f"{mirror}/{REPO}@{digest}"), h.name
    # what the swarms lacked came through the mirror's registry: about once per host that fell back
    # (less what the seed's web seed had sent before it was killed)
    assert mirror_blob_bytes(mirror_host, since) >= 0.9 * wave["image_size"] * len(fell_back)
