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
WORKERS_FROM = 100  # rows with worker processes from this many hosts on (as the split rows were)
PULL_SIZES = [500, 2000]  # pull-mode rollout rows (bench/pull_scale.py)


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
            "timed_out": wall >= timeout, "stdout": out_path.read_text(), "stderr": err_path.read_text()[-6000:]}


HOSTS_PER_SHARD = 100  # fake hosts one fake-fleet process answers (it is CPU-bound at a few hundred)


class Fleet:
    """A fake fleet of ``n`` hosts, split over one process per HOSTS_PER_SHARD hosts; its hosts
    file is the shards' files merged (what bench/fake_inventory.py reads)."""

    def __init__(self, n: int, log: Path | None = None):
        """``log``: every shard appends what its hosts were sent to a file of its own (``log`` when
        there is one shard, ``<log stem>.<shard>.jsonl`` otherwise; fakefleet.py serve --log)."""
        self.n = n
        self.shards = max(1, -(-n // HOSTS_PER_SHARD))
        self.logs: list[Path] = []
        self.hosts_file = WORK / f"fake-hosts-{n}.json"
        self.procs: list[subprocess.Popen] = []
        self.counts_files: list[Path] = []
        merged = None
        try:
            for i in range(self.shards):  # one at a time: the first writes the client key the others reuse
                hosts_file, counts = WORK / f"fake-hosts-{n}.{i}.json", WORK / f"fake-counts-{n}.{i}.json"
                counts.unlink(missing_ok=True)
                extra = []
                if log is not None:
                    self.logs.append(log if self.shards == 1 else log.with_name(f"{log.stem}.{i}.jsonl"))
                    self.logs[-1].unlink(missing_ok=True)
                    extra = ["--log", str(self.logs[-1])]
                p = subprocess.Popen([str(BIN / "python"), str(BENCH / "fakefleet.py"), "serve", "--hosts", str(n),
                                      "--shard", str(i), "--shards", str(self.shards), "--hosts-file", str(hosts_file),
                                      "--counts-file", str(counts), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                                     text=True)
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
              ansible_max_hosts: int | None = None, ansible_only: bool = False,
              pull_sizes: list[int] | None = None) -> list[dict]:
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
    tf = str(BIN / "tritonfleet")
    # one process (pyinfra runs on one core), then the same spread over one worker process per
    # CPU (tritonfleet.fleet.runner.workers) from WORKERS_FROM hosts on
    spread = {f"no-op deploy, {cpus} workers", f"status, {cpus} workers", f"rollout plan, {cpus} workers"}
    what = {
        "no-op deploy": [py, str(BENCH / "cmdprofile.py"), "--", "-y", inv, "deploys/triton.py"],
        f"no-op deploy, {cpus} workers": [tf, "deploy", inv, "deploys/triton.py", "--workers", str(cpus)],
        "status": [tf, "status", "--json", inv, "--data", "fleet_workers=1"],
        f"status, {cpus} workers": [tf, "status", "--json", inv, "--data", f"fleet_workers={cpus}"],
        "rollout plan": [py, str(BENCH / "scale.py"), "plan", inv, "deploys/triton.py", "1"],
        f"rollout plan, {cpus} workers": [py, str(BENCH / "scale.py"), "plan", inv, "deploys/triton.py", str(cpus)],
    }
    rows = []
    for n in sizes:
        log(f"{n} fake host(s)")
        fleet = Fleet(n)
        try:
            anchor = ansible_scale.commands(n, fleet.hosts_file, ansible_forks,
                                            ansible_max_hosts or ansible_scale.MAX_HOSTS)
            for name, cmd in (({} if ansible_only else what) | anchor).items():
                if name in spread and (n < WORKERS_FROM or cpus < 2):
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
                           f"{'; '.join(failures[:3])} {_status_drift(r['stdout']) if name.startswith('status') else ''}"
                           f"{r['stderr'][-1500:]}")}
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
    for n in ([] if ansible_only else (PULL_SIZES if pull_sizes is None else pull_sizes)):
        import pull_scale

        log(f"pull-mode rollout, {n} fake self-converging hosts")
        row = pull_scale.run(n)
        rows.append(row)
        log(f"  pull rollout: {row['wall']:.1f} s wall, {row['cpu']:.1f} s CPU ({row['cpu'] / n * 1000:.1f} ms/host; "
            f"fake hosts {row['fake_cpu']:.1f} s, nginx {row['origin_cpu']:.1f} s), {row['batches']} batches"
            f"{'' if row['ok'] else ' FAILED: ' + row['error'][:1500]}")
    return rows


# what `bench/run.py replay-check` runs against the fake hosts: everything the recording covers
REPLAY_CHECKS = ("no-op deploy", "status", "rollout plan")


def replay_check(n: int, received: Path, checks: tuple[str, ...] = REPLAY_CHECKS, tree: Path = ROOT,
                 commands: Path | None = None, speed: bool = True) -> int:
    """The recorded answers (bench/fakefleet.json) checked against today's deploy on ``n`` fake
    hosts: the no-op deploy (which must change nothing), `tritonfleet status` and a rollout's plan
    step. Exit status 1 if any run failed or any host was sent a command or request the
    recording has no answer for (a changed deploy, or a recording that no longer replays);
    ``received`` gets every command and request the fake hosts received (JSON lines).

    ``tree``: the checkout whose package, deploy files and plan step run, with its own virtualenv
    (another one than this: the code before a change, against this recording and fake fleet; its
    own installed package, since pyinfra loads every installed connector). ``commands``: a directory
    that gets each check's requests as matched, per host (``<check>.commands``, fakefleet.py
    commands): two trees that send the same give the same files, byte for byte. ``speed`` False:
    the runs with ``TRITONFLEET_SPEED=off`` (tritonfleet.core.speed: pyinfra's own paths, no caches)."""
    WORK.mkdir(parents=True, exist_ok=True)
    bin_dir = BIN if tree == ROOT else tree / ".venv" / "bin"
    if not (bin_dir / "pyinfra").exists():
        raise SystemExit(f"[bench] {tree} has no virtualenv of its own: `bash scripts/setup` there first")
    py, inv = str(bin_dir / "python"), "bench/fake_inventory.py"
    cmds = {"no-op deploy": [str(bin_dir / "pyinfra"), "-y", inv, "deploys/triton.py"],
            "status": [str(bin_dir / "tritonfleet"), "status", "--json", inv],
            "rollout plan": [py, str(tree / "bench" / "scale.py"), "plan", inv, "deploys/triton.py"]}
    bad = []
    fleet = Fleet(n, log=received)
    env = {k: v for k, v in fleet.env.items() if k != "TRITONFLEET_SPEED"}
    if not speed:
        env["TRITONFLEET_SPEED"] = "off"
    if commands is not None:
        sys.path.insert(0, str(BENCH))
        import fakefleet

        commands.mkdir(parents=True, exist_ok=True)
    seen: dict[Path, int] = {}
    try:
        for name in checks:
            t0 = time.perf_counter()
            res = subprocess.run(cmds[name], cwd=tree, env=env, capture_output=True, text=True,
                                 timeout=TIMEOUT, stdin=subprocess.DEVNULL)
            _, _, unanswered = fleet.commands()  # the fake hosts wrote every request before answering it
            if commands is not None:
                (commands / f"{name.replace(' ', '-')}.commands").write_text(fakefleet.command_log(fleet.logs, seen))
                seen = {p: len(p.read_text().splitlines()) for p in fleet.logs}
            ok = res.returncode == 0 or (name == "status" and res.returncode == 1 and _all_reachable(res.stdout, n))
            changed = changed_operations(res.stderr) if name == "no-op deploy" else []
            log_line = f"{name} on {n} fake hosts: exit {res.returncode}, {time.perf_counter() - t0:.1f} s"
            if ok and not unanswered and not changed:
                log(f"{log_line}: every request answered")
                continue
            bad.append(name)
            log(f"{log_line}: FAILED")
            for f in unanswered[:10]:
                log(f"  no recorded answer: {f[:800]}")
            for op in changed:
                log(f"  not a no-op: {op} changed")
            if not ok:
                log(f"  its output ends:\n{res.stderr[-3000:]}")
    finally:
        rc = fleet.stop()
    if rc != 0 and not bad:
        bad.append("fake fleet")
        log(f"the fake fleet exited {rc}: some request had no recorded answer (above)")
    log(f"every command and request received: {', '.join(str(p.relative_to(ROOT)) for p in fleet.logs)}")
    if bad:
        log(f"replay check FAILED ({', '.join(bad)}): if the deploy changed on purpose, re-record "
            "(docs/scale.md, Re-recording); otherwise the change sends a converged host something new")
        return 1
    log("replay check passed: the recording answers today's deploy whole")
    return 0


def compare_commands(ours: Path, theirs: Path, label: str) -> int:
    """``ours`` and ``theirs`` (replay_check's ``commands`` directories) byte for byte: 0 when
    every check sent the same, else 1 with the first differing lines of each check that did not."""
    import difflib

    differ = []
    for f in sorted(ours.glob("*.commands")):
        other = theirs / f.name
        a, b = f.read_text(), other.read_text() if other.exists() else ""
        if a == b:
            log(f"{f.stem}: the same {len(a.splitlines())} requests as {label}")
            continue
        differ.append(f.stem)
        log(f"{f.stem}: NOT what {label} sends ({len(b.splitlines())} requests there, {len(a.splitlines())} here):")
        for line in list(difflib.unified_diff(b.splitlines(), a.splitlines(), label, "this tree", n=0, lineterm=""))[:40]:
            log(f"  {line[:400]}")
    if differ:
        log(f"the commands differ from {label}'s ({', '.join(differ)}): {ours} and {theirs} hold them")
        return 1
    log(f"every check sent byte for byte what {label} sends")
    return 0


def changed_operations(stderr: str) -> list[str]:
    """Operations pyinfra's results table shows as changed (a success count) that are not checks
    (tritonfleet.pyinfra_ext.check: a check "succeeds" by finding nothing to do): a no-op changes none."""
    import re

    sys.path.insert(0, str(ROOT))
    from tritonfleet.core.checks import is_check

    rows = re.findall(r"^\s+(\S.*?)\s+\d+\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s*$", stderr, re.M)
    return [name for name, success, *_ in rows
            if success not in ("-", "0") and not is_check(name) and name != "Grand total"]


def _status_drift(stdout: str) -> str:
    """What `status --json` found wrong, for a FAILED row: the first hosts not reachable or with
    drift, and why."""
    try:
        rows = json.loads(stdout)
    except ValueError:
        return "(no JSON on stdout) "
    bad = [f"{r.get('host')}: {'unreachable ' + str(r.get('error') or '') if not r.get('reachable') else r.get('drift')}"
           for r in rows if not r.get("reachable") or r.get("drift")]
    return f"{len(bad)} host(s) not as asked: {'; '.join(bad[:3])} " if bad else ""


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
                     f"{_ms(r['cpu'] / r['hosts'])} | {r.get('fake_cpu', 0) + r.get('origin_cpu', 0):.1f} s | {r['rss_mb']:.0f} MB | {r.get('tree_mb', 0):.0f} MB in {r.get('procs', 0)} | {r['commands_per_host']} | {r['http_per_host']} | "
                     f"{'ok' if r['ok'] else _failed(r)} |")
    return "\n".join(lines) + "\n"


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


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


def plan(inventory: str, deploy: str, k: int = 1) -> int:
    """A rollout's plan step alone: probe every target, then the `--dry` run of the deploy on the
    reachable ones (what `tritonfleet rollout` does before its first batch), over ``k`` worker
    processes (tritonfleet.fleet.runner.workers, as the rollout does)."""
    sys.path.insert(0, str(ROOT))
    from tritonfleet.fleet import probe
    from tritonfleet.fleet.rollout.plan import plan_error
    from tritonfleet.fleet.runner import workers
    from tritonfleet.inventory import roster

    hosts = roster.load_inventory(inventory)
    before = workers.parallel(hosts, probe.probe, workers=k)
    for h in hosts:
        roster.disconnect(h)
    targets = [h.name for h, st in zip(hosts, before, strict=True) if st.reachable]
    if len(targets) != len(hosts):
        print(f"unreachable: {[h.name for h, st in zip(hosts, before, strict=True) if not st.reachable]}",
              file=sys.stderr)
        return 1
    WORK.mkdir(parents=True, exist_ok=True)
    dry = workers.run_pyinfra(inventory, deploy, targets, {}, settings=None, dry=True, log_path=WORK / "scale-plan.log", workers=k)
    if dry.rc != 0:
        print("\n".join(plan_error(dry.log)), file=sys.stderr)
    return dry.rc


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "plan":
        sys.exit(plan(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else 1))
    if len(sys.argv) == 3 and sys.argv[1] == "replot":
        sys.exit(replot(Path(sys.argv[2])))
    print(__doc__)
    sys.exit(2)
