"""`bench/run.py scale`: the control side alone at fleet sizes this machine cannot host for real.

For each size, one fake fleet (bench/fakefleet.py: loopback SSH endpoints answering as the
converged testbed host they were recorded from) and three measurements, each a new process:
the no-op deploy of deploys/triton.py, `tritonfleet status`, and a rollout's plan step (probe
every target, then the `pyinfra --dry` run; `python bench/scale.py plan`). Per process: wall
time, CPU (user + system, from wait4: that process and its children only, not the fake hosts)
and peak resident memory; remote commands per host, as the fake hosts counted them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / ".work"
BIN = Path(sys.executable).parent
SIZES = [1, 10, 50, 100, 200, 500]
DOCS = ROOT / "docs"
TIMEOUT = 900
SPLIT_FROM = 100  # the no-op split over one process per CPU is measured from this many hosts on


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _pss_mb(pid: int) -> float:
    """Proportional set size: resident pages with each shared page divided among the processes
    sharing it, so summing it over processes counts the memory they use once."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_mb(root: int) -> tuple[float, int]:
    """Memory of ``root`` and all its descendants together (MB, the sum of their PSS), and how
    many processes that is."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
    total, n, todo = 0.0, 0, [root]
    while todo:
        p = todo.pop()
        total += _pss_mb(p)
        n += 1
        todo += children.get(p, [])
    return total, n


def measured(cmd: list[str], env: dict, timeout: float = TIMEOUT) -> dict:
    """Run ``cmd``; wall, CPU and peak RSS of it (and its children), the peak of its whole process
    tree's memory (sum of PSS, sampled every second), exit status, output tails."""
    out_path, err_path = WORK / "scale-out.txt", WORK / "scale-err.txt"
    t0 = time.perf_counter()
    with open(out_path, "w") as so, open(err_path, "w") as se:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
        deadline = t0 + timeout
        tree_peak, procs_peak, next_sample = 0.0, 0, 0.0
        while True:
            if time.perf_counter() >= next_sample:
                mb, n = tree_mb(p.pid)
                tree_peak, procs_peak = max(tree_peak, mb), max(procs_peak, n)
                next_sample = time.perf_counter() + 1.0
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024, "tree_mb": tree_peak,
            "procs": procs_peak, "rc": p.returncode,
            "timed_out": wall >= timeout, "stdout": out_path.read_text()[-4000:], "stderr": err_path.read_text()[-6000:]}


HOSTS_PER_SHARD = 100  # fake hosts one fake-fleet process answers (it is CPU-bound at a few hundred)


class Fleet:
    """A fake fleet of ``n`` hosts, split over one process per HOSTS_PER_SHARD hosts; its hosts
    file is the shards' files merged (what bench/fake_inventory.py reads)."""

    def __init__(self, n: int):
        self.n = n
        self.shards = max(1, -(-n // HOSTS_PER_SHARD))
        self.hosts_file = WORK / f"fake-hosts-{n}.json"
        self.procs: list[subprocess.Popen] = []
        self.counts_files: list[Path] = []
        merged = None
        try:
            for i in range(self.shards):  # one at a time: the first writes the client key the others reuse
                hosts_file, counts = WORK / f"fake-hosts-{n}.{i}.json", WORK / f"fake-counts-{n}.{i}.json"
                counts.unlink(missing_ok=True)
                p = subprocess.Popen([str(BIN / "python"), str(BENCH / "fakefleet.py"), "serve", "--hosts", str(n),
                                      "--shard", str(i), "--shards", str(self.shards), "--hosts-file", str(hosts_file),
                                      "--counts-file", str(counts)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
                self.procs.append(p)
                self.counts_files.append(counts)
                if "ready" not in p.stdout.readline():
                    p.wait()
                    raise SystemExit(f"[bench] the fake fleet of {n} hosts (shard {i}) did not start "
                                     f"(exit {p.returncode})")
                part = json.loads(hosts_file.read_text())
                if merged is None:
                    merged = part
                else:
                    merged["hosts"] += part["hosts"]
        except BaseException:
            self.stop()
            raise
        merged["hosts"].sort()
        self.hosts_file.write_text(json.dumps(merged, indent=1))
        self.env = dict(os.environ, TRITONFLEET_FAKEFLEET=str(self.hosts_file))
        self._last: dict[str, int] = {}
        self._last_http: dict[str, int] = {}
        self._failures_seen = [0] * self.shards

    def _counts(self) -> dict:
        """Every shard's counts (SIGUSR1 makes each write its file), merged."""
        for f in self.counts_files:
            f.unlink(missing_ok=True)
        for p in self.procs:
            p.send_signal(signal.SIGUSR1)
        merged = {"counts": {}, "http": {}, "failures": []}  # failures: a list per shard
        for f in self.counts_files:
            for _ in range(200):
                if f.exists():
                    try:
                        data = json.loads(f.read_text())
                        break
                    except ValueError:
                        pass
                time.sleep(0.05)
            else:
                raise SystemExit(f"[bench] the fake fleet did not report its counts ({f})")
            merged["counts"].update(data["counts"])
            merged["http"].update(data["http"])
            merged["failures"].append(data["failures"])
        return merged

    def commands(self) -> tuple[int, int, list[str]]:
        """Remote commands and HTTP requests per host since the last call (max over hosts), and
        the requests with no recorded answer since the last call."""
        data = self._counts()
        counts, http = data["counts"], data["http"]
        per = [counts.get(h, 0) - self._last.get(h, 0) for h in counts]
        per_http = [http.get(h, 0) - self._last_http.get(h, 0) for h in http]
        self._last, self._last_http = dict(counts), dict(http)
        new = [f for seen, fs in zip(self._failures_seen, data["failures"], strict=True) for f in fs[seen:]]
        self._failures_seen = [len(fs) for fs in data["failures"]]  # each shard's list only grows
        return (max(per) if per else 0), (max(per_http) if per_http else 0), new

    def cpu(self) -> float:
        """CPU seconds the fake hosts' processes used so far (user + system, all their threads):
        what the machine spent answering, not the control side's."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for p in self.procs:
            try:
                with open(f"/proc/{p.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except OSError:
                pass
        return total

    def stop(self) -> int:
        """Stop every shard; the worst exit status (3: some request had no recorded answer)."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        worst = 0
        for p in self.procs:
            try:
                rc = p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            worst = worst or rc
        return worst


def run_scale(sizes: list[int] | None = None, ansible_forks: list[int] | None = None,
              ansible_max_hosts: int | None = None, ansible_only: bool = False) -> list[dict]:
    """``ansible_forks``: the Ansible anchor's runs a size (bench/ansible_scale.py; [] for none),
    up to ``ansible_max_hosts`` hosts; ``ansible_only``: those alone."""
    import ansible_scale

    sizes = sizes or SIZES
    if ansible_forks is None:
        ansible_forks = ansible_scale.parse_forks(ansible_scale.FORKS)
    WORK.mkdir(parents=True, exist_ok=True)
    py = str(BIN / "python")
    inv = "bench/fake_inventory.py"
    cpus = os.cpu_count() or 1
    split = f"no-op deploy, {cpus} processes"
    what = {
        "no-op deploy": [py, str(BENCH / "cmdprofile.py"), "--", "-y", inv, "deploys/triton.py"],
        # the same no-op as one pyinfra process per CPU, each on a --limit slice of the inventory
        # (pyinfra runs on one core): from SPLIT_FROM hosts on
        split: [py, str(BENCH / "scale.py"), "split", str(cpus), inv, "deploys/triton.py"],
        "status": [str(BIN / "tritonfleet"), "status", "--json", inv],
        "rollout plan": [py, str(BENCH / "scale.py"), "plan", inv, "deploys/triton.py"],
    }
    rows = []
    for n in sizes:
        log(f"{n} fake host(s)")
        fleet = Fleet(n)
        try:
            anchor = ansible_scale.commands(n, fleet.hosts_file, ansible_forks,
                                            ansible_max_hosts or ansible_scale.MAX_HOSTS)
            for name, cmd in (({} if ansible_only else what) | anchor).items():
                if name == split and (n < SPLIT_FROM or cpus < 2):
                    continue
                fake0 = fleet.cpu()
                r = measured(cmd, fleet.env)
                r["fake_cpu"] = fleet.cpu() - fake0
                per_host, http, failures = fleet.commands()
                ok = r["rc"] == 0 or (name == "status" and r["rc"] == 1 and _all_reachable(r["stdout"], n))
                row = {"what": name, "hosts": n, "wall": r["wall"], "cpu": r["cpu"], "fake_cpu": r["fake_cpu"],
                       "rss_mb": r["rss_mb"],
                       "tree_mb": r["tree_mb"], "procs": r["procs"], "commands_per_host": per_host,
                       "http_per_host": http, "ok": ok and not failures,
                       "unanswered_hosts": len({f.split(":", 1)[0] for f in failures}),
                       "error": "" if ok and not failures else (
                           f"exit {r['rc']}{' (timed out)' if r['timed_out'] else ''}; "
                           f"{'; '.join(failures[:3])} {r['stderr'][-1500:]}")}
                rows.append(row)
                log(f"  {name}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU ({r['cpu'] / n * 1000:.0f} ms/host; "
                    f"fake hosts {r['fake_cpu']:.1f} s), "
                    f"{r['rss_mb']:.0f} MB peak RSS ({r['tree_mb']:.0f} MB in {r['procs']} processes), {per_host} commands + {http} HTTP requests/host{'' if row['ok'] else ' FAILED: ' + row['error'][:1500]}")
        finally:
            rc = fleet.stop()
        if rc != 0:  # the rows say which measurement; the table is still written
            log(f"the fake fleet of {n} hosts exited {rc}: some request had no recorded answer (above): a "
                "host took a path a converged host does not (its row is FAILED), or the deploy changed: "
                "re-record with `python bench/fakefleet.py record`")
    return rows


def _all_reachable(stdout: str, n: int) -> bool:
    try:
        rows = json.loads(stdout)
    except ValueError:
        return False
    return len(rows) == n and all(r.get("reachable") for r in rows)


def table(rows: list[dict]) -> str:
    head = ["measurement", "hosts", "wall", "control CPU", "CPU per host", "fake hosts' CPU", "peak RSS (largest process)",
            "peak memory, all its processes (PSS)", "SSH commands/host",
            "HTTP requests/host", "result"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['what']} | {r['hosts']} | {r['wall']:.1f} s | {r['cpu']:.1f} s | "
                     f"{r['cpu'] / r['hosts'] * 1000:.0f} ms | {r.get('fake_cpu', 0):.1f} s | {r['rss_mb']:.0f} MB | {r.get('tree_mb', 0):.0f} MB in {r.get('procs', 0)} | {r['commands_per_host']} | {r['http_per_host']} | "
                     f"{'ok' if r['ok'] else _failed(r)} |")
    return "\n".join(lines) + "\n"


def _failed(r: dict) -> str:
    n = r.get("unanswered_hosts")
    return f"FAILED ({n} hosts left the converged path)" if n else "FAILED"


def replot(results: Path) -> None:
    """docs/scale.png again from a run's recorded rows (bench/results/scale-*.json)."""
    plot(json.loads(results.read_text())["scale"], DOCS / "scale.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for name in dict.fromkeys(r["what"] for r in rows):
        rs = [r for r in rows if r["what"] == name]
        xs = [r["hosts"] for r in rs]
        axes[0].plot(xs, [r["cpu"] / r["hosts"] * 1000 for r in rs], marker="o", label=name)
        axes[1].plot(xs, [r["wall"] for r in rs], marker="o", label=name)
        line = axes[2].plot(xs, [r.get("tree_mb", 0) for r in rs], marker="o", label=f"{name}: all processes (PSS)")
        axes[2].plot(xs, [r["rss_mb"] for r in rs], marker=".", linestyle="--", color=line[0].get_color(),
                     label=f"{name}: largest process (RSS)")
    for ax, title in zip(axes, ["control CPU per host (ms, log scale)", "wall time (s, log scale)",
                                "peak memory (MB)"], strict=True):
        ax.set_xscale("log")
        if ax is not axes[2]:  # Ansible's per-host cost is ~50x ours: both readable
            ax.set_yscale("log")
        ax.set_xlabel("hosts")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def write_docs(rows: list[dict], meta: dict) -> None:
    """The table into docs/scale.md (between the markers), the plot next to it."""
    plot(rows, DOCS / "scale.png")
    doc = DOCS / "scale.md"
    text = doc.read_text()
    start, end = "<!-- scale-table -->", "<!-- /scale-table -->"
    if start in text and end in text:
        body = (f"{start}\n`bench/run.py scale`, {meta['time']}, {meta['cpus']} CPUs (the fake hosts run on the "
                f"same CPUs):\n\n{table(rows)}{end}")
        text = text[:text.index(start)] + body + text[text.index(end) + len(end):]
        doc.write_text(text)


def plan(inventory: str, deploy: str) -> int:
    """A rollout's plan step alone: probe every target, then the `--dry` run of the deploy on the
    reachable ones (what `tritonfleet rollout` does before its first batch)."""
    sys.path.insert(0, str(ROOT))
    from tritonfleet.fleet import inventory as fleet
    from tritonfleet.fleet import probe, rollout
    from tritonfleet.fleet.rollout.plan import _plan_error

    hosts = fleet.load_inventory(inventory)
    before = fleet.parallel(hosts, probe.probe)
    for h in hosts:
        fleet.disconnect(h)
    targets = [h.name for h, st in zip(hosts, before, strict=True) if st.reachable]
    if len(targets) != len(hosts):
        print(f"unreachable: {[h.name for h, st in zip(hosts, before, strict=True) if not st.reachable]}",
              file=sys.stderr)
        return 1
    dry = rollout.run_pyinfra(inventory, deploy, targets, {}, dry=True, log_path=WORK / "scale-plan.log")
    if dry.rc != 0:
        print("\n".join(_plan_error(dry.log)), file=sys.stderr)
    return dry.rc


def split(k: int, inventory: str, deploy: str) -> int:
    """The no-op deploy as ``k`` pyinfra processes side by side, each with a --limit slice of the
    fleet (every k-th host): what an operator does to use more than one core of the control
    machine (docs/scale.md). Exit status: the worst of them."""
    hosts = [name for name, _ in json.loads(Path(os.environ["TRITONFLEET_FAKEFLEET"]).read_text())["hosts"]]
    procs = []
    for i in range(k):
        limits = [a for h in hosts[i::k] for a in ("--limit", h)]
        if limits:
            procs.append(subprocess.Popen([sys.executable, str(BENCH / "cmdprofile.py"), "--", "-y", *limits,
                                           inventory, deploy], cwd=ROOT))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "plan":
        sys.exit(plan(sys.argv[2], sys.argv[3]))
    if len(sys.argv) == 3 and sys.argv[1] == "replot":
        sys.exit(replot(Path(sys.argv[2])))
    if len(sys.argv) == 5 and sys.argv[1] == "split":
        sys.exit(split(int(sys.argv[2]), sys.argv[3], sys.argv[4]))
    print(__doc__)
    sys.exit(2)
