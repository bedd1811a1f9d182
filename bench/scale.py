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


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def tree_rss_mb(root: int) -> tuple[float, int]:
    """Resident memory of ``root`` and all its descendants together (MB; pages shared between
    processes counted in each, so an upper bound), and how many processes that is."""
    children: dict[int, list[int]] = {}
    rss: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/statm") as f:
                rss[int(d)] = int(f.read().split()[1]) * PAGE_MB
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
    total, n, todo = 0.0, 0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0.0)
        n += 1
        todo += children.get(p, [])
    return total, n


def measured(cmd: list[str], env: dict, timeout: float = TIMEOUT) -> dict:
    """Run ``cmd``; wall, CPU and peak RSS of it (and its children), the peak of its whole process
    tree's resident memory (sampled every second), exit status, output tails."""
    out_path, err_path = WORK / "scale-out.txt", WORK / "scale-err.txt"
    t0 = time.perf_counter()
    with open(out_path, "w") as so, open(err_path, "w") as se:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
        deadline = t0 + timeout
        tree_peak, procs_peak, next_sample = 0.0, 0, 0.0
        while True:
            if time.perf_counter() >= next_sample:
                mb, n = tree_rss_mb(p.pid)
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


class Fleet:
    def __init__(self, n: int):
        self.n = n
        self.hosts_file = WORK / f"fake-hosts-{n}.json"
        self.counts_file = WORK / f"fake-counts-{n}.json"
        self.counts_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([str(BIN / "python"), str(BENCH / "fakefleet.py"), "serve", "--hosts", str(n),
                                      "--hosts-file", str(self.hosts_file), "--counts-file", str(self.counts_file)],
                                     cwd=ROOT, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "ready" not in line:
            self.proc.wait()
            raise SystemExit(f"[bench] the fake fleet of {n} hosts did not start (exit {self.proc.returncode})")
        self.env = dict(os.environ, TRITONFLEET_FAKEFLEET=str(self.hosts_file))
        self._last: dict[str, int] = {}
        self._last_http: dict[str, int] = {}
        self._failures_seen = 0

    def commands(self) -> tuple[int, int, list[str]]:
        """Remote commands and HTTP requests per host since the last call (max over hosts), and
        the requests with no recorded answer so far."""
        self.counts_file.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        for _ in range(100):
            if self.counts_file.exists():
                try:
                    data = json.loads(self.counts_file.read_text())
                    break
                except ValueError:
                    pass
            time.sleep(0.05)
        else:
            raise SystemExit("[bench] the fake fleet did not report its counts")
        counts, http = data["counts"], data["http"]
        per = [counts.get(h, 0) - self._last.get(h, 0) for h in counts]
        per_http = [http.get(h, 0) - self._last_http.get(h, 0) for h in http]
        self._last, self._last_http = dict(counts), dict(http)
        new = data["failures"][self._failures_seen:]  # this measurement's own
        self._failures_seen = len(data["failures"])
        return (max(per) if per else 0), (max(per_http) if per_http else 0), new

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


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
    what = {
        "no-op deploy": [py, str(BENCH / "cmdprofile.py"), "--", "-y", inv, "deploys/triton.py"],
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
                r = measured(cmd, fleet.env)
                per_host, http, failures = fleet.commands()
                ok = r["rc"] == 0 or (name == "status" and r["rc"] == 1 and _all_reachable(r["stdout"], n))
                row = {"what": name, "hosts": n, "wall": r["wall"], "cpu": r["cpu"], "rss_mb": r["rss_mb"],
                       "tree_mb": r["tree_mb"], "procs": r["procs"], "commands_per_host": per_host,
                       "http_per_host": http, "ok": ok and not failures,
                       "unanswered_hosts": len({f.split(":", 1)[0] for f in failures}),
                       "error": "" if ok and not failures else (
                           f"exit {r['rc']}{' (timed out)' if r['timed_out'] else ''}; "
                           f"{'; '.join(failures[:3])} {r['stderr'][-1500:]}")}
                rows.append(row)
                log(f"  {name}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU ({r['cpu'] / n * 1000:.0f} ms/host), "
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
    head = ["measurement", "hosts", "wall", "control CPU", "CPU per host", "peak RSS (largest process)",
            "peak RSS (all its processes)", "SSH commands/host",
            "HTTP requests/host", "result"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['what']} | {r['hosts']} | {r['wall']:.1f} s | {r['cpu']:.1f} s | "
                     f"{r['cpu'] / r['hosts'] * 1000:.0f} ms | {r['rss_mb']:.0f} MB | {r.get('tree_mb', 0):.0f} MB in {r.get('procs', 0)} | {r['commands_per_host']} | {r['http_per_host']} | "
                     f"{'ok' if r['ok'] else _failed(r)} |")
    return "\n".join(lines) + "\n"


def _failed(r: dict) -> str:
    n = r.get("unanswered_hosts")
    return f"FAILED ({n} hosts left the converged path)" if n else "FAILED"


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
        axes[2].plot(xs, [r["rss_mb"] for r in rs], marker="o", label=name)
    for ax, title in zip(axes, ["control CPU per host (ms)", "wall time (s)", "peak resident memory (MB)"],
                         strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("hosts")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
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
    from tritonfleet import fleet, probe, rollout

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
        print("\n".join(rollout._plan_error(dry.log)), file=sys.stderr)
    return dry.rc


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "plan":
        sys.exit(plan(sys.argv[2], sys.argv[3]))
    print(__doc__)
    sys.exit(2)
