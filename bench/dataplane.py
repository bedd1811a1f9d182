"""`bench/run.py dataplane`: where a release's and the image's bytes come from, on the testbed.

Three measurements, each bounded (sizes and host counts given on the command line):

* **Model data plane** (a scratch release tree on each host, never served): a full release of S MB
  and then one changed shard (a tenth of it), to 1..N hosts, pushed over SSH and fetched from an
  S3 origin (rclone's ``serve s3`` on the bridge). Bytes the control machine sent each host: an nft
  counter of every byte reaching the host's sshd, in the host's own network namespace. Bytes the
  origin served: rclone's own transfer accounting. Wall time of the pyinfra run.
* **Rollout** of Triton serving every model (the runbook's models plus S MB of weight shards), to
  all hosts: pushed, fetched from the origin, fetched from the origin with ``--stage``, and for
  reference a rollout to a release already on the hosts. Wall time and the batch's time.
* **Image**: a new image of M MB (4 layers) pulled by N hosts through the pull-through mirror
  (Debian's registry in proxy mode, set up on the last host by deploys/mirror.py), cold (the hosts
  pull at once) and filled first (deploys/stage.py's fill); bytes the upstream registry served,
  from its own log.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / ".work" / "dataplane"
BIN = Path(sys.executable).parent
PYINFRA, TRITONFLEET = str(BIN / "pyinfra"), str(BIN / "tritonfleet")
INVENTORY = "inventories/testbed.py"
SCRATCH = "/opt/tritonfleet-bench-origin"
TABLE = "nft_dataplane"


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def sh(cmd: list[str], env: dict | None = None, timeout: float = 3600, check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env or os.environ.copy(), timeout=timeout)
    if check and res.returncode != 0:
        raise SystemExit(f"[bench] failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-4000:]}")
    return time.perf_counter() - t0, res


def host_ssh(h, command: str, check: bool = True) -> str:
    from tritonfleet_testbed.hosts import ssh_key

    _, res = sh(["ssh", "-i", str(ssh_key()), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                 "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"root@{h.address}", command], check=check)
    return res.stdout


# --- what the control machine sends each host: an nft counter of sshd's incoming bytes --------

def counters_on(hosts: list) -> None:
    rules = (f"table inet {TABLE} {{\n counter ssh_in {{ }}\n chain input {{\n  type filter hook input priority -5; "
             "policy accept;\n  tcp dport 22 counter name \"ssh_in\"\n }\n}\n")
    for h in hosts:
        subprocess.run(["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", TABLE], capture_output=True)
        subprocess.run(["ip", "netns", "exec", h.netns, "nft", "-f", "-"], input=rules, text=True, check=True)


def counters_read(hosts: list) -> dict[str, int]:
    out = {}
    for h in hosts:
        res = subprocess.run(["ip", "netns", "exec", h.netns, "nft", "-j", "list", "counter", "inet", TABLE, "ssh_in"],
                             capture_output=True, text=True, check=True)
        for item in json.loads(res.stdout)["nftables"]:
            if "counter" in item:
                out[h.name] = int(item["counter"]["bytes"])
    return out


def counters_off(hosts: list) -> None:
    for h in hosts:
        subprocess.run(["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", TABLE], capture_output=True)


# --- repositories -------------------------------------------------------------------------------

def gen_shards(root: Path, total_mb: int, seed: int, shards: int = 10, sub: str = "llm/1") -> None:
    rng = random.Random(seed)
    per = max(1, total_mb * 1_000_000 // shards)
    for i in range(shards):
        p = root / sub / f"shard-{i:02d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            left = per
            while left > 0:
                n = min(1 << 20, left)
                f.write(rng.randbytes(n))
                left -= n


def change_shard(root: Path, sub: str = "llm/1") -> int:
    p = root / sub / "shard-00.bin"
    with open(p, "r+b") as f:
        f.write(os.urandom(4096))
    return p.stat().st_size


def sync_run(names: list[str], repo: Path, env: dict, *data: str) -> float:
    limit = [a for n in names for a in ("--limit", n)]
    extra = [a for d in data for a in ("--data", d)]
    dt, _ = sh([PYINFRA, "-y", *limit, INVENTORY, "bench/deploys/models_only.py", "--data", f"triton_base_dir={SCRATCH}",
                "--data", f"model_repository={repo}", "--data", "model_overrides={}", *extra], env=env)
    return dt


def measure_models(results: list[dict], testbed, sizes: list[int], counts: list[int], s3, env: dict) -> None:
    for size in sizes:
        repo = WORK / f"repo-{size}"
        shutil.rmtree(repo, ignore_errors=True)
        (repo / "llm").mkdir(parents=True)
        (repo / "llm" / "config.pbtxt").write_text('name: "llm"\nbackend: "python"\n')
        gen_shards(repo, size, seed=size)
        for n in counts:
            hosts = testbed.hosts[:n]
            names = [h.name for h in hosts]
            for mode in ("push", "origin"):
                for h in hosts:
                    host_ssh(h, f"rm -rf {SCRATCH}")
                prefix = f"bench-{size}-{n}-{int(time.time())}"
                data = (f"model_origin=s3://{s3.bucket}/{prefix}", f"model_origin_endpoint={s3.endpoint}") \
                    if mode == "origin" else ()
                for step in ("full", "changed"):
                    if step == "changed":
                        changed = change_shard(repo)
                    counters_on(hosts)
                    s3.reset()
                    dt = sync_run(names, repo, env, *data)
                    sent = counters_read(hosts)
                    served = sum(s3.served().values()) if mode == "origin" else 0
                    moved = size * 1_000_000 if step == "full" else changed
                    row = {"part": "models", "mode": mode, "step": step, "hosts": n, "size_mb": size,
                           "seconds": round(dt, 2), "control_bytes_per_host": max(sent.values()),
                           "origin_bytes": served, "origin_ratio": round(served / (n * moved), 3) if served else None,
                           "moved_bytes_per_host": moved}
                    results.append(row)
                    log(f"  {row}")
                # the next mode starts from the same repository
                shutil.rmtree(repo / "llm" / "1")
                gen_shards(repo, size, seed=size)
            counters_off(hosts)
        shutil.rmtree(repo, ignore_errors=True)
    for h in testbed.hosts:
        host_ssh(h, f"rm -rf {SCRATCH}", check=False)


# --- rollouts -----------------------------------------------------------------------------------

def rollout(inventory: str, repo: Path, env: dict, *extra: str) -> dict:
    args = [TRITONFLEET, "rollout", inventory, "deploys/models.py", "--canary", "0", "--batch", "100%", "--json",
            "--data", f"model_repository={repo}"]
    for e in extra:
        args += ["--data", e] if "=" in e else [e]
    t0 = time.perf_counter()
    _, res = sh(args, env=env, check=False, timeout=3600)
    wall = time.perf_counter() - t0
    report = json.loads(res.stdout)
    if not report.get("ok"):
        raise SystemExit(f"[bench] rollout failed: {json.dumps(report)[-3000:]}\n{res.stderr[-3000:]}")
    batch = max(h["seconds"] for h in report["hosts"])
    return {"wall": round(wall, 1), "batch": round(batch, 1), "stage": (report.get("staged") or {}).get("seconds")}


def measure_rollouts(results: list[dict], testbed, size: int, s3, env: dict, runs: int) -> None:
    base = ROOT / "files" / "model_repository"
    origin = (f"model_origin=s3://{s3.bucket}/rollouts", f"model_origin_endpoint={s3.endpoint}")
    n = len(testbed.hosts)
    for i in range(runs):
        repos = []
        for k in range(4):
            r = WORK / f"roll-{i}-{k}"
            shutil.rmtree(r, ignore_errors=True)
            shutil.copytree(base, r)
            gen_shards(r, size, seed=1000 * i + k, sub="resnet50_onnx/weights")
            repos.append(r)
        for mode, repo, extra in (("push", repos[0], ()), ("origin", repos[1], origin),
                                  ("origin + staging", repos[2], (*origin, "--stage")),
                                  ("release already on the hosts", repos[0], (*origin, "--stage"))):
            r = rollout(INVENTORY, repo, env, *extra)
            row = {"part": "rollout", "mode": mode, "hosts": n, "size_mb": size, "run": i, **r}
            results.append(row)
            log(f"  {row}")
        for r in repos:
            shutil.rmtree(r, ignore_errors=True)


# --- the image through the mirror ---------------------------------------------------------------

def measure_image(results: list[dict], testbed, mb: int, upstream, mirror: str, mirror_host) -> None:
    from tritonfleet.serving import image_mirror
    from tritonfleet_testbed.origin_servers import synthetic_image

    archive = synthetic_image(WORK / "image.tar.gz", mb)
    digest = upstream.push(archive, "nvidia/bench:1")
    # the upstream holds this image only: its blobs are the image's size
    size = sum(p.stat().st_size for p in (upstream.storage / "docker/registry/v2/blobs").rglob("data"))
    ref = f"{mirror}/nvidia/bench@{digest}"
    storage = "/var/lib/docker-registry"
    for mode in ("cold (hosts pull at once)", "filled first, then the hosts pull"):
        host_ssh(mirror_host, f"systemctl stop docker-registry; rm -rf {storage}/docker; systemctl start docker-registry; "
                              "sleep 1")
        for h in testbed.hosts:
            host_ssh(h, f"docker rmi -f {ref} >/dev/null 2>&1; true")
        mark = upstream.mark()
        t0 = time.perf_counter()
        if mode.startswith("filled"):
            url = f"https://{mirror}"
            ca = "/etc/docker/registry/ca.crt"
            text = host_ssh(mirror_host, image_mirror.manifest_command(url, "nvidia/bench", digest, ca))
            _, blobs = image_mirror.parse_manifest(text)
            host_ssh(mirror_host, image_mirror.fill_script(url, "nvidia/bench", blobs, storage, ca))
        threads = [threading.Thread(target=host_ssh, args=(h, f"docker pull -q {ref} >/dev/null")) for h in testbed.hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        served = upstream.blob_bytes(mark)
        row = {"part": "image", "mode": mode, "hosts": len(testbed.hosts), "size_mb": round(size / 1e6),
               "seconds": round(dt, 1), "upstream_bytes": served, "upstream_ratio": round(served / size, 3)}
        results.append(row)
        log(f"  {row}")
    for h in testbed.hosts:
        host_ssh(h, f"docker rmi -f {ref} >/dev/null 2>&1; true", check=False)



# --- the whole measurement, its table, plot and docs ----------------------------------------------

def setup_mirror(testbed, upstream, work: Path) -> tuple[str, object]:
    """deploys/mirror.py on the last host (TLS with a throwaway CA), proxying ``upstream``."""
    from tritonfleet_testbed.origin_servers import free_port, tls_files

    sys.path.insert(0, str(ROOT))
    from tests.support.testbed import write_inventory

    host = testbed.hosts[-1]
    tls = tls_files(work / "tls", host.address)
    port = free_port()
    mirror = f"{host.address}:{port}"
    groups = {"t4": [h.name for h in testbed.hosts if h.gpu_class == "t4"],
              "l4": [h.name for h in testbed.hosts if h.gpu_class == "l4"], "image_mirror": [host.name]}
    inv = write_inventory(work / "inv", groups, image_mirror=mirror, image_mirror_port=port,
                          image_mirror_upstream=f"http://{upstream.host}", image_mirror_tls_cert=tls["mirror.crt"],
                          image_mirror_tls_key=tls["mirror.key"], image_mirror_ca=tls["ca.crt"])
    sh([PYINFRA, "-y", inv, "deploys/mirror.py"], timeout=1800)
    return mirror, host


def remove_mirror(testbed, mirror: str, host) -> None:
    host_ssh(host, "systemctl stop docker-registry; DEBIAN_FRONTEND=noninteractive apt-get purge -y -q docker-registry "
                   ">/dev/null; rm -rf /var/lib/docker-registry /etc/docker/registry "
                   "/etc/systemd/system/docker-registry.service.d; systemctl daemon-reload", check=False)
    for h in testbed.hosts:
        host_ssh(h, f"rm -rf /etc/docker/certs.d/{mirror}", check=False)


def run(args) -> list[dict]:
    from tritonfleet_testbed import hosts as tb
    from tritonfleet_testbed.origin_servers import RcloneS3, Registry

    counts = [int(x) for x in args.dataplane_hosts.split(",")]
    sizes = [int(x) for x in args.dataplane_sizes.split(",")]
    need = max(counts)
    state = tb.State.load()
    if len([h for h in state.hosts if h.pid]) < need:
        sh([TRITONFLEET, "testbed", "up", "--hosts", str(need)], timeout=3600)
        state = tb.State.load()
    testbed = state
    testbed.hosts = state.hosts[:need]
    log(f"converging {need} host(s) (not measured)")
    sh([PYINFRA, "-y", *[a for h in testbed.hosts for a in ("--limit", h.name)], INVENTORY, "deploys/triton.py"],
       timeout=3600)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    results: list[dict] = []
    with RcloneS3(WORK / "rclone", tb.GATEWAY) as s3, Registry(WORK / "upstream", tb.GATEWAY) as upstream:
        env = dict(os.environ, **s3.env())
        if "models" in args.dataplane_parts:
            log(f"model data plane: {sizes} MB to {counts} host(s), pushed and from the origin")
            measure_models(results, testbed, sizes, counts, s3, env)
        if "rollout" in args.dataplane_parts:
            log(f"rollouts of {args.dataplane_rollout_mb} MB to {need} host(s): push, origin, origin + staging")
            try:
                measure_rollouts(results, testbed, args.dataplane_rollout_mb, s3, env, args.dataplane_runs)
            finally:
                sh([PYINFRA, "-y", INVENTORY, "deploys/models.py"], timeout=3600, check=False)
        if "image" in args.dataplane_parts:
            log(f"a {args.dataplane_image_mb} MB image through the mirror to {need} host(s)")
            mirror, mhost = setup_mirror(testbed, upstream, WORK)
            try:
                measure_image(results, testbed, args.dataplane_image_mb, upstream, mirror, mhost)
            finally:
                remove_mirror(testbed, mirror, mhost)
    return results


def summary(results: list[dict]) -> dict:
    """The goal figures from the rows."""
    models = [r for r in results if r["part"] == "models"]
    origin = [r for r in models if r["mode"] == "origin"]
    roll = [r for r in results if r["part"] == "rollout"]
    image = [r for r in results if r["part"] == "image" and r["mode"].startswith("filled")]

    def median(xs):
        import statistics

        return statistics.median(xs) if xs else None

    staged = median([r["batch"] for r in roll if r["mode"] == "origin + staging"])
    there = median([r["batch"] for r in roll if r["mode"] == "release already on the hosts"])
    return {
        "control_bytes_per_host_max": max((r["control_bytes_per_host"] for r in origin), default=None),
        "origin_ratio_changed": [r["origin_ratio"] for r in origin if r["step"] == "changed"],
        "upstream_ratio_filled": [r["upstream_ratio"] for r in image],
        "batch_staged_over_there": round(staged / there, 2) if staged and there else None,
        # each run's staged rollout against the rollout right after it (same load, same hosts)
        "batch_ratio_per_run": [round(a["batch"] / b["batch"], 2) for a, b in zip(
            [r for r in roll if r["mode"] == "origin + staging"],
            [r for r in roll if r["mode"] == "release already on the hosts"], strict=False)],
    }


def table(results: list[dict]) -> str:
    mb = lambda b: f"{b / 1e6:.2f} MB" if b is not None else "-"  # noqa: E731
    out = ["| part | mode | step | hosts | release / image | wall | control machine -> each host | origin served "
           "(x changed bytes x hosts) | upstream registry served (x image) | batch | staging |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["part"] == "models":
            served = f"{mb(r['origin_bytes'])} ({r['origin_ratio']}x)" if r["origin_bytes"] else "-"
            out.append(f"| models | {r['mode']} | {r['step']} | {r['hosts']} | {r['size_mb']} MB | {r['seconds']:.1f} s | "
                       f"{mb(r['control_bytes_per_host'])} | {served} | - | - | - |")
        elif r["part"] == "rollout":
            stage = f"{r['stage']:.1f} s" if r["stage"] else "-"
            out.append(f"| rollout | {r['mode']} | run {r['run'] + 1} | {r['hosts']} | {r['size_mb']} MB | {r['wall']:.1f} s "
                       f"| - | - | - | {r['batch']:.1f} s | {stage} |")
        else:
            out.append(f"| image | {r['mode']} | - | {r['hosts']} | {r['size_mb']} MB | {r['seconds']:.1f} s | - | - | "
                       f"{mb(r['upstream_bytes'])} ({r['upstream_ratio']}x) | - | - |")
    return "\n".join(out) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for mode, marker in (("push", "o"), ("origin", "s")):
        rows = [r for r in results if r["part"] == "models" and r["mode"] == mode and r["step"] == "full"]
        for n in sorted({r["hosts"] for r in rows}):
            pts = sorted((r["size_mb"], r["control_bytes_per_host"] / 1e6) for r in rows if r["hosts"] == n)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=f"{mode}, {n} host(s)")
    ax.axhline(1.0, ls="--", color="gray", label="goal: at most 1 MB a host")
    ax.set_xlabel("release size (MB)")
    ax.set_ylabel("MB the control machine sends each host")
    ax.set_yscale("log")
    ax.set_title("a full release: push over SSH vs model origin")
    ax.legend(fontsize=8)
    ax = axes[1]
    roll = [r for r in results if r["part"] == "rollout"]
    modes = list(dict.fromkeys(r["mode"] for r in roll))
    import statistics

    walls = [statistics.median(r["wall"] for r in roll if r["mode"] == m) for m in modes]
    batches = [statistics.median(r["batch"] for r in roll if r["mode"] == m) for m in modes]
    x = range(len(modes))
    ax.bar([i - 0.2 for i in x], walls, 0.4, label="rollout wall time")
    ax.bar([i + 0.2 for i in x], batches, 0.4, label="its batch")
    ax.set_xticks(list(x))
    ax.set_xticklabels([m.replace(" + ", "\n+ ").replace("release already", "already") for m in modes], fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title("rollout to every test host (median of the runs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_docs(results: list[dict], meta: dict) -> None:
    doc = ROOT / "docs" / "scale.md"
    text = doc.read_text()
    block = (f"<!-- dataplane-table -->\n`bench/run.py dataplane`, {meta['time']}, {meta['cpus']} CPUs (the test hosts "
             "and the servers run on the same CPUs):\n\n" + table(results) + "<!-- /dataplane-table -->")
    start, end = text.find("<!-- dataplane-table -->"), text.find("<!-- /dataplane-table -->")
    if start != -1 and end != -1:
        text = text[:start] + block + text[end + len("<!-- /dataplane-table -->"):]
        doc.write_text(text)
    plot(results, ROOT / "docs" / "scale-dataplane.png")
