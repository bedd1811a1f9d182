"""The image fan-out on the test hosts (image_fanout: the Triton image's blobs shared between a
wave's hosts, the image mirror their one seed, loaded into Docker by digest;
docs/model-origin.md#the-image): Debian's registry on the bridge as the upstream, the mirror set
up by deploys/mirror.py on the last test host, its blob bytes counted from its own log (journald:
``http.response.written`` of each GET of a blob); bench/deploys/stage_image_only.py as the
staging run (no Triton needed: Docker only, installed here when missing)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from tests.support.testbed import pyinfra, ssh, write_inventory
from tritonfleet_testbed import hosts
from tritonfleet_testbed.origin_servers import Registry, free_port, tls_files

DEPLOY = "bench/deploys/stage_image_only.py"
REPO = "nvidia/tritonserver"


@pytest.fixture(scope="module")
def wave(testbed, tmp_path_factory):
    work = tmp_path_factory.mktemp("imgfan")
    mirror_host, targets = testbed.hosts[-1], testbed.hosts[:-1]
    for h in targets:
        ssh(h, "command -v docker >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
               "--no-install-recommends docker.io >/dev/null", timeout=900)
    with pytest.MonkeyPatch.context() as env, Registry(work / "upstream", hosts.GATEWAY) as upstream:
        env.setenv("TRITONFLEET_MIRROR_PASSWORD", f"mirror-client-{random.randrange(1 << 30)}")
        digest = upstream.push(Path(testbed.images["triton"]), f"{REPO}:24.08-py3")
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
                   "inventory": inventory, "upstream": upstream,
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
           "for f in /var/lib/tritonfleet-image-fanout/releases/.tritonfleet-swarm/*/pid; do [ -e \"$f\" ] && "
           "kill -s TERM -- \"-$(cat \"$f\")\" 2>/dev/null; done; sleep 1; "
           "rm -rf /var/lib/tritonfleet-image-fanout/releases; true", check=False)


def mirror_blob_bytes(mirror_host, since: float) -> int:
    """Bytes of blob bodies the mirror sent since ``since`` (its own JSON log, in journald)."""
    out = ssh(mirror_host, f"journalctl -u docker-registry -o cat --since=@{int(since)} --no-pager")
    total = 0
    for line in out.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "/blobs/" in str(d.get("http.request.uri", "")) and d.get("http.request.method") == "GET":
            total += int(d.get("http.response.written", 0))
    return total


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
    assert sent <= 1.1 * wave["image_size"], (sent, wave["image_size"], fan)


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
    # the mirror sent the image once: to the host that pulled through it (its log counts blobs)
    sent = mirror_blob_bytes(wave["mirror_host"], since)
    assert 0.9 * wave["image_size"] <= sent <= 1.1 * wave["image_size"], (sent, wave["image_size"])
