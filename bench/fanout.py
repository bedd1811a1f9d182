"""`bench/run.py fanout`: a release to a wave of test hosts with every link capped, fetched from
the origin directly and through the fan-out (model_fanout: the wave's hosts serve each other).

Conditions: the first N test hosts (``--fanout-hosts``), each host's link capped both ways with
traffic control (tbf on its end of the veth for what it sends, on the machine's end for what it
receives), and the origin's link capped the same (tbf on the testbed's bridge, which carries
everything the machine sends the hosts: nginx, the origin, runs on the bridge's address). A
release of S MB (``--fanout-mb``, 4 shards of random bytes, new each run) staged by
bench/deploys/stage_models_only.py. Figures: the wall time of the staging run, the origin's bytes
from nginx's own access log (GET bodies), each host's received bytes (its interface's counter),
for 1 host and for N hosts, direct and through the fan-out; and a model on paper for 500 hosts
from them. The image's part (``--fanout-image-mb``, on one more test host: the image mirror) is
bench/fanout_image.py; ``--fanout-parts`` picks the parts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work" / "fanout"
BIN = Path(sys.executable).parent
PYINFRA, TRITONFLEET = str(BIN / "pyinfra"), str(BIN / "tritonfleet")
INVENTORY = "inventories/testbed.py"
SCRATCH = "/opt/tritonfleet-bench-fanout"


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def sh(cmd: list[str], timeout: float = 3600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)
    if check and res.returncode != 0:
        raise SystemExit(f"[bench] failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def host_ssh(h, command: str, check: bool = True) -> str:
    from tritonfleet_testbed.hosts import ssh_key

    return sh(["ssh", "-i", str(ssh_key()), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"root@{h.address}", command], check=check).stdout


# --- the caps ----------------------------------------------------------------------------------------

def tbf(mbit: int) -> list[str]:
    return ["root", "tbf", "rate", f"{mbit}mbit", "burst", "256kb", "latency", "100ms"]


def caps_on(hosts: list, bridge: str, mbit: int) -> None:
    for h in hosts:
        sh(["ip", "netns", "exec", h.netns, "tc", "qdisc", "replace", "dev", "host0", *tbf(mbit)])  # what it sends
        sh(["tc", "qdisc", "replace", "dev", h.veth, *tbf(mbit)])  # what it receives
    sh(["tc", "qdisc", "replace", "dev", bridge, *tbf(mbit)])  # what the origin (this machine) sends


def caps_off(hosts: list, bridge: str) -> None:
    for h in hosts:
        sh(["ip", "netns", "exec", h.netns, "tc", "qdisc", "del", "dev", "host0", "root"], check=False)
        sh(["tc", "qdisc", "del", "dev", h.veth, "root"], check=False)
    sh(["tc", "qdisc", "del", "dev", bridge, "root"], check=False)


def rx_bytes(h) -> int:
    return int(sh(["ip", "netns", "exec", h.netns, "cat", "/sys/class/net/host0/statistics/rx_bytes"]).stdout)


# --- a run -------------------------------------------------------------------------------------------

def new_release(path: Path, mb: int, seed: int) -> None:
    import random

    shutil.rmtree(path, ignore_errors=True)
    (path / "llm" / "1").mkdir(parents=True)
    (path / "llm" / "config.pbtxt").write_text('name: "llm"\nbackend: "python"\n')
    rng = random.Random(seed)
    for i in range(4):
        with open(path / "llm" / "1" / f"shard-{i}.bin", "wb") as f:
            left = mb * 1_000_000 // 4
            while left > 0:
                n = min(1 << 20, left)
                f.write(rng.randbytes(n))
                left -= n


def clean(hosts: list) -> None:
    """No release and no swarm left on the hosts (a seeding aria2c of the last run stopped)."""
    for h in hosts:
        host_ssh(h, f"for f in {SCRATCH}/releases/.tritonfleet-swarm/*/pid; do [ -e \"$f\" ] && "
                    f"kill -s TERM -- \"-$(cat \"$f\")\" 2>/dev/null; done; rm -rf {SCRATCH}; true", check=False)


def stage(hosts: list, repo: Path, origin_url: str, fanout: bool, extra: tuple[str, ...] = ()) -> tuple[float, float]:
    """The staging run's wall time, and the longest a host spent moving the release (its swarm
    and its fetch from the origin, as the run logs them)."""
    limit = [a for h in hosts for a in ("--limit", h.name)]
    data = [f"triton_base_dir={SCRATCH}", f"model_repository={repo}", "model_overrides={}", f"model_origin={origin_url}",
            "gpu_count=1", f"model_fanout={fanout}", "model_fanout_seed_minutes=1", *extra]
    t0 = time.perf_counter()
    res = sh([PYINFRA, "-y", *limit, INVENTORY, "bench/deploys/stage_models_only.py",
              *[a for d in data for a in ("--data", d)]], timeout=3600)
    wall = time.perf_counter() - t0
    moved: dict[str, float] = {}
    for m in re.finditer(r"\[(\S+)\] (?:fan-out \(|model release: fetched ).*? in ([\d.]+) s", res.stdout + res.stderr):
        moved[m.group(1)] = moved.get(m.group(1), 0.0) + float(m.group(2))
    return wall, max(moved.values(), default=0.0)


def measure(hosts: list, web, mb: int, mode: str, seed: int, extra: tuple[str, ...] = ()) -> dict:
    clean(hosts)
    repo = WORK / "repo"
    new_release(repo, mb, seed)
    before = {h.name: rx_bytes(h) for h in hosts}
    mark = web.mark()
    wall, moved = stage(hosts, repo, web.url, mode != "direct", extra)
    got = {h.name: rx_bytes(h) - before[h.name] for h in hosts}
    served = sum(web.served(mark).values())
    size = mb * 1_000_000
    row = {"mode": mode, "hosts": len(hosts), "release_mb": mb, "seconds": round(wall, 1), "data_seconds": round(moved, 1),
           "origin_bytes": served, "origin_ratio": round(served / size, 3),
           "host_rx_mb_min": round(min(got.values()) / 1e6, 1), "host_rx_mb_max": round(max(got.values()) / 1e6, 1)}
    log(f"  {row}")
    return row


def paper(rows: list[dict], images: list[dict], mbit: int, n: int) -> dict:
    """500 hosts on 10 GbE from the measured figures: a host's rate is the cap times the link
    efficiency measured alone; the wave's time is one host's times the measured wave/alone ratio
    (the swarm's upload capacity grows with its hosts, so that ratio is taken as constant, not
    measured beyond N); direct: the origin's (the mirror's) link carries every host's copy. The
    image adds what does not move with the link, each scaled from its measured rate: the mirror's
    seed step (every blob's sha256, the torrent's SHA-1) and each host's load (the throwaway
    registry, Docker's pull from it with the layers' extraction)."""
    def pick(table, mode, hosts):
        return next(r for r in table if r["mode"] == mode and r["hosts"] == hosts and not r.get("warmup"))

    out: dict = {}
    release = None
    if rows:
        one, wave = pick(rows, "fanout", 1), pick(rows, "fanout", n)
        d1 = pick(rows, "direct", 1)
        rate = one["release_mb"] * 8 / max(one["data_seconds"], 1e-9)  # Mbit/s a host got alone
        efficiency = min(1.0, rate / mbit)
        ratio = wave["data_seconds"] / one["data_seconds"]
        gbe10 = 10_000 * efficiency / 8  # MB/s a host gets on 10 GbE at the measured efficiency
        out.update({"link_efficiency_alone": round(efficiency, 2), "wave_over_alone": round(ratio, 2),
                    "wave_over_alone_whole_run": round(wave["seconds"] / one["seconds"], 2),
                    "direct_wave_over_alone": round(pick(rows, "direct", n)["data_seconds"] / d1["data_seconds"], 2)})
        release = round(10_000 / gbe10 * ratio)
        out["release_10gb_500_fanout_s"] = release
        out["release_10gb_500_direct_s"] = round(500 * 10_000 / gbe10)
        out["origin_bytes_500_fanout_x"] = max(r["origin_ratio"] for r in rows if r["mode"] == "fanout")
    if images:
        one, wave = pick(images, "fanout", 1), pick(images, "fanout", n)
        mb = one["image_mb"]
        efficiency = min(1.0, mb * 8 / max(one["swarm_s_max"], 1e-9) / mbit)
        ratio = wave["swarm_s_max"] / one["swarm_s_max"]
        seed_rate = mb / max(wave["seed_s"], one["seed_s"])  # MB/s: the slower of the two runs
        # the load on a host with its own CPUs and disk (the one-host row); the wave's slowest host
        # shared this machine's 2 CPUs and one disk with the others, printed beside it
        load_rate = mb / one["load_s_max"]
        load_rate_shared = mb / wave["load_s_max"]
        gbe10 = 10_000 * efficiency / 8
        seed, move, load = 16_000 / seed_rate, 16_000 / gbe10 * ratio, 16_000 / load_rate
        out.update({"image_link_efficiency_alone": round(efficiency, 2), "image_wave_over_alone": round(ratio, 2),
                    "image_seed_mb_s": round(seed_rate, 1), "image_load_mb_s": round(load_rate, 1),
                    "image_load_mb_s_wave_sharing_cpus": round(load_rate_shared, 1),
                    "image_16gb_500_seed_s": round(seed), "image_16gb_500_swarm_s": round(move),
                    "image_16gb_500_load_s": round(load), "image_16gb_500_fanout_s": round(seed + move + load),
                    "image_16gb_500_fanout_s_at_the_shared_load_rate": round(seed + move + 16_000 / load_rate_shared),
                    "image_16gb_500_direct_s": round(500 * 16_000 / (10_000 / 8)),
                    "mirror_bytes_500_fanout_x": wave["mirror_sent_ratio"]})
        if release is not None:
            total = release + round(seed + move + load)
            out["release_and_image_500_s"] = total
            out["release_and_image_500_under_5_min"] = total <= 300
    return out


def testbed_hosts(need: int) -> list:
    """The first ``need`` test hosts (brought up when fewer run)."""
    from tritonfleet_testbed import hosts as tb

    state = tb.State.load()
    if len([h for h in state.hosts if h.pid]) < need:
        sh([TRITONFLEET, "testbed", "up", "--hosts", str(need)], timeout=3600)
        state = tb.State.load()
    return state.hosts[:need]


def run(args) -> list[dict]:
    from tritonfleet_testbed import hosts as tb
    from tritonfleet_testbed.origin_servers import Nginx

    n, mb, mbit = args.fanout_hosts, args.fanout_mb, args.fanout_mbit
    hosts = testbed_hosts(n)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    rows: list[dict] = []
    with Nginx(WORK / "origin", tb.GATEWAY) as web:
        # aria2 and opentracker installed on the hosts before anything is timed
        log(f"warming up {n} host(s) (packages; not measured)")
        measure(hosts, web, 4, "fanout", 0)
        caps_on(hosts, tb.BRIDGE, mbit)
        try:
            for i, (mode, count) in enumerate((("direct", 1), ("fanout", 1), ("direct", n), ("fanout", n))):
                log(f"{mode}: {mb} MB to {count} host(s), every link {mbit} Mbit/s")
                rows.append(measure(hosts[:count], web, mb, mode, seed=i + 1))
        finally:
            caps_off(hosts, tb.BRIDGE)
            clean(hosts)
    shutil.rmtree(WORK / "repo", ignore_errors=True)
    return rows


def table(rows: list[dict], mbit: int) -> str:
    out = ["| mode | hosts | release | wall (staging run) | slowest host's transfer | origin sent (x release) "
           "| each host received |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['mode']} | {r['hosts']} | {r['release_mb']} MB | {r['seconds']:.1f} s | {r['data_seconds']:.1f} s | "
                   f"{r['origin_bytes'] / 1e6:.1f} MB ({r['origin_ratio']}x) | "
                   f"{r['host_rx_mb_min']}-{r['host_rx_mb_max']} MB |")
    return "\n".join(out) + f"\n\nEvery link (each host's, both ways, and the origin's) capped at {mbit} Mbit/s.\n"

