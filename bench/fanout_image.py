"""`bench/run.py fanout`'s image part: an image of M MB to a wave of test hosts with every link
capped, pulled through the image mirror directly and through the image fan-out (image_fanout: one
wave host reads the blobs from the mirror's registry as its web seed, the wave's hosts serve each
other, each loads by digest).

Conditions: the first N test hosts the wave (Docker installed unmeasured), the next one the image
mirror (deploys/mirror.py: Debian's registry proxying an upstream registry on the bridge), every
host's link capped both ways and the bridge capped (bench/fanout.py's caps: the mirror is a test
host, capped like the others). A new image of M MB (``--fanout-image-mb``, ``--fanout-image-layers``
layers of random bytes, gzip level 1) pushed to the upstream; an unmeasured staging run first
installs aria2, opentracker and the registry binary and fills the mirror. Each row: every wave host
without the image and without a swarm, then
bench/deploys/stage_image_only.py on the row's hosts and the mirror host. Figures: the run's wall
time; the mirror's bytes two ways, its registry's own log (blob bodies it sent: the pulls) and its
link's transmit counter (everything it sent: the pulls, the web seed's reads, SSH); each host's
received bytes; from the run's log, the mirror's torrent step (the blobs checked, the torrent
made) and, per host, the swarm's time and the load's (the throwaway registry, Docker's pull from it
with its layer extraction, the manifest from the mirror).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import sys
import time

import fanout
from fanout import ROOT, host_ssh, log, rx_bytes, sh

WORK = fanout.WORK / "image"
DEPLOY = "bench/deploys/stage_image_only.py"
REPO = "nvidia/tritonserver"
STORAGE = "/var/lib/docker-registry"  # image_mirror_storage's default


def tx_bytes(h) -> int:
    return int(sh(["ip", "netns", "exec", h.netns, "cat", "/sys/class/net/host0/statistics/tx_bytes"]).stdout)


def mirror_blob_bytes(mirror_host, since: float) -> int:
    """Blob bodies the mirror's registry sent since ``since`` (its JSON log, in journald)."""
    from tritonfleet_testbed.origin_servers import log_blob_bytes

    return log_blob_bytes(host_ssh(mirror_host, f"journalctl -u docker-registry -o cat --since=@{int(since)} --no-pager"))


def forget(wave: list, mirror_host, mirror: str, digest: str) -> None:
    """No image and no swarm on the wave's hosts (and no aria2c seed an earlier version left on the mirror)."""
    for h in wave:
        host_ssh(h, f"docker rmi -f {mirror}/{REPO}@{digest} >/dev/null 2>&1; "
                    "for f in /var/lib/tritonfleet-image-fanout/releases/.tritonfleet-swarm/*/pid; do [ -e \"$f\" ] && "
                    "kill -s TERM -- \"-$(cat \"$f\")\" 2>/dev/null; done; sleep 1; "
                    "rm -rf /var/lib/tritonfleet-image-fanout/releases; true", check=False)
    host_ssh(mirror_host, f"for f in {STORAGE}/tritonfleet-image-seed/*/pid; do [ -e \"$f\" ] && "
                          "kill -s TERM -- \"-$(cat \"$f\")\" 2>/dev/null; rm -f \"$f\"; done; true", check=False)


def setup(wave: list, mirror_host, upstream, mb: int, layers: int) -> dict:
    """Docker on the wave, the image in the upstream, the mirror on ``mirror_host``; the inventory."""

    from tritonfleet_testbed.origin_servers import free_port, tls_files

    sys.path.insert(0, str(ROOT))
    from tests.support.testbed import write_inventory

    for h in wave:
        host_ssh(h, "command -v docker >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                    "--no-install-recommends docker.io >/dev/null")
    from tritonfleet_testbed.origin_servers import synthetic_image

    archive = synthetic_image(WORK / "image.tar.gz", mb, layers)
    digest = upstream.push(archive, f"{REPO}:bench")
    archive.unlink()
    size = sum(p.stat().st_size for p in (upstream.storage / "docker/registry/v2/blobs").rglob("data"))
    os.environ.setdefault("TRITONFLEET_MIRROR_PASSWORD", f"mirror-client-{random.randrange(1 << 30)}")
    tls = tls_files(WORK / "tls", mirror_host.address)
    port = free_port()
    mirror = f"{mirror_host.address}:{port}"
    groups: dict[str, list[str]] = {"image_mirror": [mirror_host.name]}
    for h in wave:
        groups.setdefault(h.gpu_class, []).append(h.name)
    inventory = write_inventory(WORK / "inv", groups, image_mirror=mirror, image_mirror_port=port,
                                image_mirror_upstream=f"http://{upstream.host}", image_mirror_tls_cert=tls["mirror.crt"],
                                image_mirror_tls_key=tls["mirror.key"], image_mirror_ca=tls["ca.crt"],
                                model_fanout_seed_minutes=5, model_fanout_stall_seconds=30,
                                model_fanout_wait_seconds=900, triton_image=f"{upstream.host}/{REPO}:bench@{digest}")
    sh([fanout.PYINFRA, "-y", inventory, "deploys/mirror.py"], timeout=1800)
    return {"mirror": mirror, "digest": digest, "size": size, "inventory": inventory}


def teardown(wave: list, mirror_host, site: dict | None) -> None:
    if site:
        forget(wave, mirror_host, site["mirror"], site["digest"])
        for h in wave:
            host_ssh(h, f"docker logout {site['mirror']} >/dev/null 2>&1; rm -rf /etc/docker/certs.d/{site['mirror']}",
                     check=False)
    host_ssh(mirror_host, "systemctl stop docker-registry; DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "
                          "docker-registry apache2-utils >/dev/null; rm -rf /var/lib/docker-registry /etc/docker/registry "
                          "/etc/systemd/system/docker-registry.service.d; systemctl daemon-reload", check=False)


def stage(hosts: list, site: dict, fan: bool) -> tuple[float, str]:
    limit = [a for h in hosts for a in ("--limit", h.name)]
    t0 = time.perf_counter()
    res = sh([fanout.PYINFRA, "-y", *limit, site["inventory"], DEPLOY, "--data", f"image_fanout={fan}"], timeout=3600)
    return time.perf_counter() - t0, res.stdout + res.stderr


def measure(every: list, count: int, mirror_host, site: dict, mode: str, warmup: bool = False) -> dict:
    """One row: the first ``count`` of ``every`` wave host staged (every one of them forgets the
    image and stops its swarm first: a swarm left seeding would serve the row's hosts)."""
    forget(every, mirror_host, site["mirror"], site["digest"])
    wave = every[:count]
    before = {h.name: rx_bytes(h) for h in wave}
    sent0, since = tx_bytes(mirror_host), time.time() - 1
    wall, text = stage([*wave, mirror_host], site, mode == "fanout")
    got = {h.name: rx_bytes(h) - before[h.name] for h in wave}
    sent = tx_bytes(mirror_host) - sent0
    blobs = mirror_blob_bytes(mirror_host, since)
    swarm = [float(m.group(1)) for m in re.finditer(r"verified in ([\d.]+) s and loaded", text)]
    load = [float(m.group(1)) for m in re.finditer(r"loaded by digest in ([\d.]+) s", text)]
    seed = [float(m.group(1)) for m in re.finditer(r"image fan-out: \S+ torrent made .*? in ([\d.]+) s", text)]
    fallback = sum("pulling through the mirror" in ln for ln in text.splitlines())
    if mode == "fanout" and len(load) != len(wave):
        log(f"  only {len(load)} of {len(wave)} hosts loaded from the swarm ({fallback} fell back)")
    size = site["size"]
    row = {"part": "image", "mode": mode, "warmup": warmup, "hosts": len(wave), "image_mb": round(size / 1e6, 1), "seconds": round(wall, 1),
           "mirror_blob_bytes": blobs, "mirror_blob_ratio": round(blobs / size, 3),
           "mirror_sent_bytes": sent, "mirror_sent_ratio": round(sent / size, 3),
           "host_rx_mb_min": round(min(got.values()) / 1e6, 1), "host_rx_mb_max": round(max(got.values()) / 1e6, 1),
           "loaded_from_swarm": len(load), "fell_back": fallback,
           "seed_s": max(seed, default=None), "swarm_s_max": max(swarm, default=None),
           "load_s_min": min(load, default=None), "load_s_max": max(load, default=None)}
    log(f"  {row}")
    return row


def run(state_hosts: list, n: int, mb: int, layers: int, mbit: int, bridge: str, gateway: str) -> list[dict]:
    """The four rows (direct and fan-out, 1 host and N), caps on every link for all of them."""
    from tritonfleet_testbed.origin_servers import Registry

    wave, mirror_host = state_hosts[:n], state_hosts[n]
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    rows: list[dict] = []
    site = None
    with Registry(WORK / "upstream", gateway) as upstream:
        try:
            log(f"image: Docker on {n} host(s), a {mb} MB image of {layers} layers, the mirror on {mirror_host.name}")
            site = setup(wave, mirror_host, upstream, mb, layers)
            log("image: warming up (packages, the mirror's fill; links not capped: kept as the uncapped row)")
            rows.append(measure(wave, n, mirror_host, site, "fanout", warmup=True))
            fanout.caps_on([*wave, mirror_host], bridge, mbit)
            try:
                for mode, count in (("direct", 1), ("fanout", 1), ("direct", n), ("fanout", n)):
                    log(f"image {mode}: {site['size'] / 1e6:.0f} MB to {count} host(s), every link {mbit} Mbit/s")
                    rows.append(measure(wave, count, mirror_host, site, mode))
            finally:
                fanout.caps_off([*wave, mirror_host], bridge)
        finally:
            teardown(wave, mirror_host, site)
    shutil.rmtree(WORK, ignore_errors=True)
    return rows


def goals(rows: list[dict]) -> list[dict]:
    """The issue's two image goals from the rows, each met or not."""
    def pick(mode, hosts):
        return next(r for r in rows if r["mode"] == mode and r["hosts"] == hosts and not r["warmup"])

    n = max(r["hosts"] for r in rows)
    fan_n, fan_1, dir_1, dir_n = pick("fanout", n), pick("fanout", 1), pick("direct", 1), pick("direct", n)
    out = [{"goal": f"mirror bytes for the image to {n} hosts <= 1.1x the image (its link's counter: pulls, web seed, SSH)",
            "measured": fan_n["mirror_sent_ratio"], "met": fan_n["mirror_sent_ratio"] <= 1.1},
           {"goal": "the same, its registry's blob bodies only", "measured": fan_n["mirror_blob_ratio"],
            "met": fan_n["mirror_blob_ratio"] <= 1.1}]
    for name, one in (("one host through the fan-out", fan_1), ("one host pulling through the mirror", dir_1)):
        ratio = round(fan_n["seconds"] / one["seconds"], 2)
        out.append({"goal": f"a wave of {n} through the fan-out <= 1.5x {name}", "measured": ratio, "met": ratio <= 1.5})
    out.append({"goal": f"(for the ratio) the wave of {n} pulling through the mirror over one host doing so",
                "measured": round(dir_n["seconds"] / dir_1["seconds"], 2), "met": None})
    return out


def table(rows: list[dict], mbit: int) -> str:
    out = ["| mode | hosts | image | wall (staging run) | mirror sent, its link (x image) | mirror's registry, blob bodies "
           "(x image) | each host received | from the swarm / fell back | seed step | swarm (slowest) | load by digest |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]

    def s(v):
        return "-" if v is None else f"{v:.1f} s"

    for r in rows:
        load = "-" if r["load_s_min"] is None else f"{r['load_s_min']:.1f}-{r['load_s_max']:.1f} s"
        mode = f"{r['mode']} (warm-up, links not capped, the fill and packages included)" if r["warmup"] else r["mode"]
        out.append(f"| {mode} | {r['hosts']} | {r['image_mb']} MB | {r['seconds']:.1f} s | "
                   f"{r['mirror_sent_bytes'] / 1e6:.1f} MB ({r['mirror_sent_ratio']}x) | "
                   f"{r['mirror_blob_bytes'] / 1e6:.1f} MB ({r['mirror_blob_ratio']}x) | "
                   f"{r['host_rx_mb_min']}-{r['host_rx_mb_max']} MB | {r['loaded_from_swarm']} / {r['fell_back']} | "
                   f"{s(r['seed_s'])} | {s(r['swarm_s_max'])} | {load} |")
    out += ["", "| goal | measured | met |", "|---|---|---|"]
    for g in goals(rows):
        met = "-" if g["met"] is None else ("met" if g["met"] else "not met")
        out.append(f"| {g['goal']} | {g['measured']}x | {met} |")
    return "\n".join(out) + f"\n\nEvery link (each host's and the mirror host's, both ways, and the bridge) capped at {mbit} Mbit/s.\n"
