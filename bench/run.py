"""Benchmarks on the local testbed, each measurement run several times in one session so that
ratios compare like with like. Prints a table (median, min, max, ratios, targets) and writes it
to bench/results/<time>.{md,json}.

    bash bench/setup                                  # Ansible venv, rsync (once)
    export TRITONFLEET_TESTBED=<n>
    .venv/bin/python bench/run.py all                 # everything below
    .venv/bin/python bench/run.py noop [--runs 5]     # full-deploy no-op: tritonfleet vs Ansible
    .venv/bin/python bench/run.py parallel [--hosts 10]
    .venv/bin/python bench/run.py sync [--size-gb 10] # model sync vs rsync
    .venv/bin/python bench/run.py bare [--runs 3]     # bare host -> serving
    .venv/bin/python bench/run.py mirror-fill [--fill-mb 200] [--fill-layers 4] [--fill-runs 3]
        # what filling the image mirror costs the upstream a blob (bench/mirror_fill.py; no test host)
    .venv/bin/python bench/run.py noop-installed [--runs 5]   # a converged host's no-op as an
        # installation runs it (runtime lock + package) against .venv (bench/noop_installed.py)
    .venv/bin/python bench/run.py bare-pull [--bare-runs N]  # bare host -> serving from its bootstrap
        # script alone, pull mode (bench/pull_bare.py; not part of all)
    .venv/bin/python bench/run.py scale [--sizes 1,10,50,100,200,500]  # control side, fake fleet
        [--ansible-forks 5,auto] [--ansible-max-hosts 100] [--ansible-only]   # its Ansible anchor
        [--pull-sizes 500,2000]                        # pull-mode rollout rows (bench/pull_scale.py)
    .venv/bin/python bench/run.py replay-check [--hosts 3]   # the fake fleet's recording against
        # today's deploy: no-op, status, plan on a few fake hosts; exit 1 on anything unanswered;
        # every command received in bench/.work/replay-check.jsonl, each check's as matched in
        # bench/.work/replay-check/<check>.commands (about 15 s)
        [--against TREE]   # and the same checks run by another checkout (the code before a change)
        # on the same recording: exit 1 unless both sent the same, byte for byte (docs/architecture.md)
        [--speed on|off|both]   # with TRITONFLEET_SPEED=off too (both): exit 1 unless the
        # speed-only features change nothing sent (docs/scale.md, Speed-only features)
    .venv/bin/python bench/run.py dataplane [--dataplane-hosts 1,3] [--dataplane-sizes 100,500]
        # push over SSH vs model origin vs origin + staging; the image through the mirror
    .venv/bin/python bench/run.py xid-noise [--xid-lines 800000] [--xid-distinct 29] [--runs 3]
        # the GPU fault collector under an Xid flood: CPU per line, memory (bench/xid_noise.py;
        # no test host, no TRITONFLEET_TESTBED) [--against TREE]: another checkout's collector too
    .venv/bin/python bench/run.py storm [--storm-hosts 200] [--storm-budget 10%] [--storm-recover 5]
        # 200 hosts fault at once behind a real HAProxy, Prometheus, Alertmanager and the quarantine
        # receiver (bench/storm.py; no test host; not part of all) [--storm-path push|prometheus]
    .venv/bin/python bench/run.py driver-change [--driver-runs 1] [--driver-branches 570,580]
        # a converged host's driver branch moved by `tritonfleet rollout` and back, each move's
        # reboot-to-serving time by its parts (bench/driver_change.py; not part of all)
    .venv/bin/python bench/run.py fanout [--fanout-hosts 6] [--fanout-mb 150] [--fanout-mbit 100]
        [--fanout-image-mb 300] [--fanout-image-layers 4] [--fanout-parts release,image]
        # a release and an image to a wave with every link capped: direct from the origin (the
        # image: through the mirror, on one more host) vs the fan-out
    .venv/bin/python bench/run.py fast-path [--fast-path-runs 20] [--fast-path-push on|off]
        # one host's real GPU fault collector: fault line -> out of HAProxy at the default
        # intervals, the direct path or Prometheus alone (bench/fastpath.py; no test host)
    .venv/bin/python bench/run.py canary [--errors 10] [--latency 10] [--identical 20] [--capacity]
        # traffic canary and capacity rules (bench/canary.py; not part of all)

Brings the testbed up (and deploys it) as each measurement needs, generates its test data under
bench/.work and removes it again (--keep keeps it). Leaves the testbed running; `tritonfleet
testbed down` removes it. No timing is asserted anywhere: this reports.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / ".work"
BIN = Path(sys.executable).parent
PYINFRA = str(BIN / "pyinfra")
TRITONFLEET = str(BIN / "tritonfleet")
ANSIBLE = BENCH / ".venv-ansible" / "bin" / "ansible-playbook"
INVENTORY = "inventories/testbed.py"
SCRATCH = "/opt/tritonfleet-bench"       # model sync target on the host (never served)
RSYNC_TARGET = "/var/tmp/tritonfleet-bench-rsync"


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def sh(cmd: list[str], check: bool = True, env: dict | None = None, timeout: float = 3600,
       cwd: Path = ROOT) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env or os.environ.copy(),
                         timeout=timeout)
    dt = time.perf_counter() - t0
    if check and res.returncode != 0:
        raise SystemExit(f"[bench] failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout[-3000:]}\n"
                         f"{res.stderr[-3000:]}")
    return dt, res


# --- results ----------------------------------------------------------------------------------

@dataclass
class Row:
    name: str
    values: list[float] = field(default_factory=list)
    unit: str = "s"
    target: str = ""
    met: bool | None = None
    note: str = ""

    def cells(self) -> list[str]:
        if not self.values:
            return [self.name, "-", "-", "-", "-", self.target, self._met(), self.note]
        if self.unit != "s" and len(self.values) == 1:  # a ratio or a count: one figure
            v = self.values[0]
            text = f"{v:.1f}x" if self.unit == "x" else f"{v:g} {self.unit}".strip()
            return [self.name, "", text, "", "", self.target, self._met(), self.note]
        fmt = (lambda v: f"{v:.2f} s") if self.unit == "s" else (
            (lambda v: f"{v:.1f}x") if self.unit == "x" else (lambda v: f"{v:g} {self.unit}".strip()))
        return [self.name, str(len(self.values)), fmt(statistics.median(self.values)), fmt(min(self.values)),
                fmt(max(self.values)), self.target, self._met(), self.note]

    def _met(self) -> str:
        return "" if self.met is None else ("met" if self.met else "NOT met")

    @property
    def median(self) -> float:
        return statistics.median(self.values)


class Results:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.meta: dict = {}

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        log("  " + " | ".join(row.cells()))
        return row

    def markdown(self) -> str:
        head = ["measurement", "runs", "median", "min", "max", "target", "result", "notes"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r.cells()) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"

    def save(self) -> Path:
        out = BENCH / "results"
        out.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        md = self.markdown()
        (out / f"{stamp}.md").write_text(md)
        (out / f"{stamp}.json").write_text(json.dumps(
            {"meta": self.meta, "rows": [r.__dict__ for r in self.rows]}, indent=1))
        return out / f"{stamp}.md"


def ratio_row(name: str, num: Row, den: Row, target: str, ok) -> Row:
    """Ratio of medians, with the spread of the per-run ratios (runs were interleaved)."""
    pairs = [a / b for a, b in zip(num.values, den.values, strict=False) if b]
    r = num.median / den.median
    row = Row(name, [r], unit="x", target=target, met=ok(r),
              note=f"per-run ratios {min(pairs):.1f}x-{max(pairs):.1f}x" if pairs else "")
    return row


# --- testbed ----------------------------------------------------------------------------------

def testbed_state():
    from tritonfleet_testbed.hosts import State

    return State.load()


def ensure_testbed(n: int) -> list:
    state = testbed_state()
    alive = [h for h in state.hosts if h.pid]
    if len(alive) < n:
        log(f"testbed up --hosts {n}")
        sh([TRITONFLEET, "testbed", "up", "--hosts", str(n)], timeout=1800)
    return testbed_state().hosts[:n]


def limit_args(names: list[str]) -> list[str]:
    """pyinfra's --limit takes one host or group per option."""
    return [arg for name in names for arg in ("--limit", name)]


def deploy(limit: list[str] | None = None, timeout: float = 3600) -> float:
    dt, res = sh([PYINFRA, "-y", *limit_args(limit or []), INVENTORY, "deploys/triton.py"], check=False,
                 timeout=timeout)
    if res.returncode != 0:
        raise SystemExit(f"[bench] deploy failed:\n{res.stderr[-4000:]}")
    return dt


def host_ssh(h, command: str, check: bool = True, timeout: float = 3600) -> str:
    from tritonfleet_testbed.hosts import ssh_key

    _, res = sh(["ssh", *ssh_opts(ssh_key()), f"root@{h.address}", command], check=check, timeout=timeout)
    return res.stdout


def ssh_opts(key) -> list[str]:
    return ["-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]


def hosts_cpu_seconds() -> float:
    """CPU time used so far by all testbed hosts (their cgroup; they share this machine's CPUs)."""
    from tritonfleet_testbed.hosts import CGROUP_ROOT

    for line in (CGROUP_ROOT / "cpu.stat").read_text().splitlines():
        if line.startswith("usage_usec"):
            return int(line.split()[1]) / 1e6
    return 0.0


def children_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


CPU: dict[str, list[float]] = {}
# tag prefix -> [the run's phases (bench/cmdprofile.py), one a run]
PHASES: dict[str, list[dict]] = {}


def no_change(res: subprocess.CompletedProcess) -> None:
    """Fail unless the run succeeded and no operation other than the checks changed."""
    if res.returncode != 0:
        raise SystemExit(f"[bench] no-op run failed:\n{res.stderr[-4000:]}")
    from tritonfleet.core.checks import is_check

    changed = re.findall(r"^\s+(\S.*?)\s+\d+\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s*$", res.stderr, re.M)
    for name, success, *_ in changed:
        if success not in ("-", "0") and not is_check(name) and name != "Grand total":
            raise SystemExit(f"[bench] not a no-op: {name} changed\n{res.stderr[-3000:]}")


# seconds between an Ansible run and the next run of ours (the playbook's last module process was
# still seen running as it ended). The first run of a round was slower than the next anyway
# (0.77-1.22 s against 0.77-1.10 s, 2026-12-07 00:49, 7 runs each), cause not found: not the
# host's user manager (the playbook's ControlPersist connection keeps root's session: docs/scale.md)
SETTLE = 3


def plain_noop(limit: list[str], python: Path) -> float:
    """Wall time of a full-deploy run as an operator starts it (the virtualenv's ``pyinfra``
    command), with nothing of the bench's inside it: no command counted, no phase timed
    (bench/cmdprofile.py's wrappers and its meta path finder are in the profiled runs only)."""
    dt, res = sh([str(python.parent / "pyinfra"), "-y", *limit_args(limit), INVENTORY, "deploys/triton.py"],
                 check=False)
    no_change(res)
    return dt


def floor_noop(limit: list[str], python: Path) -> float:
    """Wall time of pyinfra doing nothing against the same host: bench/floor/nothing.py as its
    config and its deploy file (pyinfra starts, reads the inventory, connects, runs no operation,
    exits). No deploy can be faster on this machine at this minute, so the no-op's figure is read
    beside it: this shared VM's speed changes between runs and days, the difference much less."""
    nothing = str(BENCH / "floor" / "nothing.py")
    dt, res = sh([str(python.parent / "pyinfra"), "-y", "--config", nothing, *limit_args(limit), INVENTORY,
                  nothing], check=False)
    if res.returncode != 0 or f"[{limit[0]}] Connected" not in res.stdout + res.stderr:
        raise SystemExit(f"[bench] pyinfra's empty run failed or did not connect:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return dt


def profiled_noop(limit: list[str], tag: str, deploy_file: str = "deploys/triton.py",
                  python: Path | None = None) -> tuple[float, int]:
    """Wall time of a full-deploy run (a new process, as an operator runs it) and the number
    of remote commands per host; fails if any operation other than the checks changed. Records
    the CPU the run cost on this machine and on the test hosts (CPU[tag prefix]). ``python``: the
    interpreter of the virtualenv that runs it (this checkout's by default)."""
    out = WORK / f"profile-{tag}.json"
    h0, c0 = hosts_cpu_seconds(), children_cpu_seconds()
    launched = time.time()
    dt, res = sh([str(python or BIN / "python"), str(BENCH / "cmdprofile.py"), "--out", str(out), "--",
                  "-y", *limit_args(limit), INVENTORY, deploy_file], check=False,
                 env=dict(os.environ, TRITONFLEET_BENCH_T0=repr(launched)))
    no_change(res)
    key = tag.rsplit("-", 1)[0]
    CPU.setdefault(f"{key}-hosts", []).append(hosts_cpu_seconds() - h0)
    CPU.setdefault(f"{key}-control", []).append(children_cpu_seconds() - c0)
    data = json.loads(out.read_text())
    if sorted(data["hosts"]) != sorted(limit):
        raise SystemExit(f"[bench] the run reached {sorted(data['hosts'])}, not {sorted(limit)}")
    counts = {len(v) for v in data["hosts"].values()}
    PHASES.setdefault(key, []).append({**data["phases"], "wall": dt, "http_connections": data["http_connections"]})
    return dt, max(counts)


def phase_rows(runs: list[dict]) -> list[Row]:
    """The no-op's time by phase, each a median over the runs (bench/cmdprofile.py's phases):
    interpreter and pyinfra's start (imports), planning up to the SSH handshake, the handshake,
    each remote command (its round trip: the host's time and one network round trip), the time
    between (the control side's own work: facts parsed, operations planned and run), each HTTP
    request through the tunnel, and the exit after the CLI's last line."""
    def med(values: list[float]) -> list[float]:  # one figure: the median of the runs
        return [statistics.median(values)] if values else []

    rows = [Row("  phase: interpreter start + imports (pyinfra, tritonfleet)", med([r["start"] for r in runs])),
            Row("  phase: SSH handshake", med([sum(b - a for a, b in r["connect"]) for r in runs]))]
    locks = [r for r in runs if r.get("lock", {}).get("started")]
    if locks:
        rows.append(Row("  phase: the deploy lock's holder, started to held (its own OpenSSH connection)",
                        med([max(b for _, b in r["lock"]["waits"] or [[0, r["lock"]["started"][0]]])
                             - r["lock"]["started"][0] for r in locks])))
        rows.append(Row("  phase: of it, the deploy waiting for the lock (nothing else to do)",
                        med([sum(b - a for a, b in r["lock"]["waits"]) for r in locks])))
    for row in rows:
        row.note = f"median of {len(runs)} runs"
    n_cmds = min(len(r["commands"]) for r in runs)
    for i in range(n_cmds):
        text = " ".join(runs[0]["commands"][i][2].split())[:40]
        rows.append(Row(f"  phase: remote command {i + 1} ({text}...)",
                        med([r["commands"][i][1] - r["commands"][i][0] for r in runs])))
    n_http = min(len(r["http"]) for r in runs)
    for i in range(n_http):
        rows.append(Row(f"  phase: HTTP {runs[0]['http'][i][2]}", med([r["http"][i][1] - r["http"][i][0] for r in runs])))
    busy = [sum(b - a for a, b in r["connect"]) + sum(c[1] - c[0] for c in r["commands"])
            + sum(h[1] - h[0] for h in r["http"]) + sum(b - a for a, b in r.get("lock", {}).get("waits", []))
            for r in runs]
    rows.append(Row("  phase: control side between (deploy file, facts parsed, operations planned and run)",
                    med([r["main_done"] - r["start"] - b for r, b in zip(runs, busy, strict=True)])))
    rows.append(Row("  phase: exit (after the last line)", med([r["wall"] - r["main_done"] for r in runs])))
    rows.append(Row("HTTP connections per host in a no-op run (tritonfleet)",
                    [max(r["http_connections"] for r in runs)], unit="",
                    note="new connections opened by the health gate's session (through the SSH tunnel)"))
    return rows


# --- measurements -----------------------------------------------------------------------------

def bench_noop(results: Results, runs: int) -> None:
    log("full-deploy no-op on one converged host: tritonfleet vs the same steps in Ansible")
    if not ANSIBLE.exists():
        raise SystemExit("[bench] Ansible missing: run `bash bench/setup` first")
    hosts = ensure_testbed(1)
    h = hosts[0]
    log(f"converging {h.name} (not timed)")
    deploy([h.name])
    work = WORK / "ansible"
    sh([str(BIN / "python"), str(BENCH / "ansible_vars.py"), INVENTORY, str(work), "--limit", h.name])
    env = dict(os.environ, ANSIBLE_CONFIG=str(work / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    playbook = [str(ANSIBLE), "-l", h.name, str(BENCH / "ansible" / "triton.yml")]
    log("Ansible warm-up run (installs what its modules need on the host, e.g. python3-apt)")
    sh(playbook, env=env, timeout=1800)
    import noop_installed

    installed = noop_installed.venv(ROOT, WORK / "installed-venv", log) / "bin" / "python"
    ours = Row("full deploy no-op, 1 host: tritonfleet as installed (runtime lock + the package)", target="<= 0.75 s")
    profiled = Row("  same, run under bench/cmdprofile.py (the phases below come from these runs)")
    dev = Row("  same, this checkout's development virtualenv (test and bench tools too)")
    floor = Row("  pyinfra's floor: no operation at all, same host and installation (bench/floor/nothing.py)")
    theirs, commands = Row("same steps, Ansible playbook (pipelining, ControlPersist)"), None
    for i in range(runs):  # each way and Ansible alternately, so that a change of load hits each
        ours.values.append(plain_noop([h.name], installed))
        floor.values.append(floor_noop([h.name], installed))
        dt, commands = profiled_noop([h.name], f"noop-{i}", python=installed)
        profiled.values.append(dt)
        dev.values.append(profiled_noop([h.name], f"noopdev-{i}")[0])
        dt, res = sh(playbook, env=env, check=False, timeout=1800)
        recap = re.search(r"changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", res.stdout)
        if res.returncode != 0 or not recap or recap.group(1) != "0":
            raise SystemExit(f"[bench] the Ansible run was not a clean no-op:\n{res.stdout[-4000:]}")
        theirs.values.append(dt)
        time.sleep(SETTLE)
        log(f"  run {i + 1}: tritonfleet {ours.values[-1]:.2f}s (pyinfra's floor {floor.values[-1]:.2f}s, profiled "
            f"{profiled.values[-1]:.2f}s, development {dev.values[-1]:.2f}s), Ansible {dt:.2f}s")
    ours.met = ours.median <= 0.75
    results.add(ours)
    results.add(floor)
    above = Row("  the no-op above pyinfra's floor (each run's plain no-op less its floor run)",
                [a - b for a, b in zip(ours.values, floor.values, strict=True)])
    above.note = "what tritonfleet's steps, facts and health gate add: the part this code decides"
    results.add(above)
    results.add(profiled)
    for row in phase_rows(PHASES["noop"]):
        results.add(row)
    results.add(dev)
    results.add(theirs)
    results.add(ratio_row("ratio Ansible / tritonfleet", theirs, ours, ">= 15x", lambda r: r >= 15))
    results.add(Row("remote commands per host in a no-op run (tritonfleet)", [commands], unit="",
                    note="every command counted (bench/cmdprofile.py; the deploy lock's holder "
                    "besides); 4 before the one batch, 50 before the batching"))
    tasks = len(re.findall(r"^TASK \[", res.stdout, re.M))
    results.meta["ansible_tasks_per_run"] = tasks


def bench_parallel(results: Results, runs: int, n: int) -> None:
    log(f"no-op on {n} hosts in parallel vs one host")
    hosts = ensure_testbed(n)
    log(f"converging {n} hosts (not timed)")
    deploy([h.name for h in hosts])
    one, many = Row("full deploy no-op, 1 host"), Row(f"full deploy no-op, {n} hosts in parallel", target="")
    for i in range(runs):
        one.values.append(profiled_noop([hosts[0].name], f"one-{i}")[0])
        many.values.append(profiled_noop([h.name for h in hosts], f"many-{i}")[0])
        log(f"  run {i + 1}: 1 host {one.values[-1]:.2f}s, {n} hosts {many.values[-1]:.2f}s")
    cpus = os.cpu_count()

    def cpu_note(key: str) -> str:
        hosts_s, control_s = statistics.median(CPU[f"{key}-hosts"]), statistics.median(CPU[f"{key}-control"])
        return (f"CPU per run: test hosts {hosts_s:.1f} s + control {control_s:.1f} s, on the same "
                f"{cpus} CPUs (>= {(hosts_s + control_s) / cpus:.1f} s of wall time)")

    one.note, many.note = cpu_note("one"), cpu_note("many")
    results.add(one)
    results.add(many)
    results.add(ratio_row(f"ratio {n} hosts / 1 host", many, one, "<= 2x", lambda r: r <= 2))
    # the same without the GPU check's container (most of a host's CPU in a no-op)
    one_m, many_m = Row("deploys/models.py no-op (image, models, unit, health gate), 1 host"), \
        Row(f"deploys/models.py no-op, {n} hosts in parallel")
    for i in range(runs):
        one_m.values.append(profiled_noop([hosts[0].name], f"mone-{i}", "deploys/models.py")[0])
        many_m.values.append(profiled_noop([h.name for h in hosts], f"mmany-{i}", "deploys/models.py")[0])
    one_m.note, many_m.note = cpu_note("mone"), cpu_note("mmany")
    results.add(one_m)
    results.add(many_m)
    results.add(ratio_row(f"ratio {n} hosts / 1 host without the GPU check", many_m, one_m, "", lambda r: None))


def gen_repo(path: Path, size_gb: float) -> None:
    """A model repository of ``size_gb`` GB: three models, the big one in 1 GB weight shards."""
    if (path / ".complete").exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    log(f"generating a {size_gb:g} GB model repository in {path}")
    rng = __import__("random").Random(6)
    total = int(size_gb * 1e9)
    shards = max(1, round(total / 1e9))
    shard = total // shards
    files = {f"llm/1/shard-{i:02d}.bin": shard for i in range(shards)}
    files.update({"llm/config.pbtxt": 600, "llm/1/tokenizer.json": 2_000_000,
                  "embedder/config.pbtxt": 400, "embedder/1/model.onnx": 90_000_000,
                  "ranker/config.pbtxt": 400, "ranker/1/model.onnx": 30_000_000})
    block = 1 << 20
    for rel, size in files.items():
        p = path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            left = size
            while left > 0:
                n = min(block, left)
                f.write(rng.randbytes(n))
                left -= n
    (path / ".complete").write_text("")


def models_run(h, repo: Path, env: dict, *extra: str) -> tuple[float, subprocess.CompletedProcess]:
    dt, res = sh([PYINFRA, "-y", "--limit", h.name, INVENTORY, "bench/deploys/models_only.py",
                  "--data", f"triton_base_dir={SCRATCH}", "--data", f"model_repository={repo}",
                  "--data", "model_overrides={}", *extra], env=env, check=False, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"[bench] model sync failed:\n{res.stderr[-4000:]}")
    return dt, res


def bench_sync(results: Results, runs: int, size_gb: float, keep: bool, paramiko_run: bool = True) -> None:
    log(f"model sync of a {size_gb:g} GB repository: tritonfleet vs rsync over the same SSH settings")
    from tritonfleet_testbed.hosts import ssh_key

    h = ensure_testbed(1)[0]
    host_ssh(h, "command -v rsync >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q rsync "
                ">/dev/null")
    repo = WORK / f"repo-{size_gb:g}g"
    gen_repo(repo, size_gb)
    cache = WORK / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, TRITONFLEET_LOCAL_CACHE=str(cache))
    t0 = time.perf_counter()
    sh([str(BIN / "python"), "-c", f"from tritonfleet.model_repo import render as models; models.manifest(__import__('pathlib').Path({str(repo)!r}))"],
       env=env)
    hash_cold = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file() and not p.name.startswith("."))
    rsync_cmd = ["rsync", "-a", "--delete", "--exclude", ".complete", "-e", "ssh " + " ".join(ssh_opts(ssh_key())),
                 f"{repo}/", f"root@{h.address}:{RSYNC_TARGET}/"]
    full, rs_full = Row(f"model sync, full transfer of {size / 1e9:.1f} GB: tritonfleet"), \
        Row("same files, rsync -a over the same SSH settings")
    def fresh(target: str) -> None:
        """An empty target, and no writes of an earlier run still being flushed to the disk
        (the test hosts write to this machine's disk: that would slow whichever runs next)."""
        host_ssh(h, f"rm -rf {target}")
        sh(["sync"])

    try:
        for i in range(runs):
            tools = [("tritonfleet", SCRATCH, lambda: models_run(h, repo, env)[0], full),
                     ("rsync", RSYNC_TARGET, lambda: sh(rsync_cmd, timeout=3600)[0], rs_full)]
            for name, target, run, row in (tools if i % 2 == 0 else tools[::-1]):
                fresh(target)
                row.values.append(run())
                log(f"  full run {i + 1}: {name} {row.values[-1]:.1f}s")
        results.add(full)
        results.add(rs_full)
        results.add(ratio_row("ratio tritonfleet / rsync (full transfer)", full, rs_full, "<= 1.5x",
                              lambda r: r <= 1.5))
        if paramiko_run:
            fresh(SCRATCH)
            dt, _ = models_run(h, repo, env, "--data", "bulk_transfer=connection")
            results.add(Row("same full transfer through pyinfra's own connection (paramiko)", [dt],
                            note="bulk_transfer=connection, for comparison"))

        noop, step, rs_noop = Row(f"model sync no-op, {size / 1e9:.1f} GB: whole pyinfra run"), \
            Row("model sync no-op: the sync step itself (local manifest + 1 remote command)", target="<= 1 s"), \
            Row("same no-op, rsync -a")
        for _ in range(max(runs, 5)):
            dt, res = models_run(h, repo, env)
            if "Starting operation" in res.stderr:
                raise SystemExit(f"[bench] the no-op changed something:\n{res.stderr[-3000:]}")
            noop.values.append(dt)
            step.values.append(float(re.search(r"decided in ([0-9.]+)s", res.stderr).group(1)))
            rs_noop.values.append(sh(rsync_cmd)[0])
        step.met = step.median <= 1.0
        results.add(noop)
        results.add(step)
        results.add(rs_noop)

        changed = Row("one changed small file (config.pbtxt): sync", note="")
        big = Row("one changed 1 GB shard: sync", note="")
        for _ in range(runs):
            cfg = repo / "llm" / "config.pbtxt"
            with open(cfg, "a") as f:
                f.write(f"# change {time.time()}\n")
            dt, res = models_run(h, repo, env)
            changed.values.append(dt)
            changed.note = re.search(r"(\d+ files to send \([0-9.]+ MB\))", res.stderr).group(1)
            shard = repo / "llm" / "1" / "shard-00.bin"
            with open(shard, "r+b") as f:
                f.write(os.urandom(4096))
            dt, res = models_run(h, repo, env)
            big.values.append(dt)
            big.note = re.search(r"(\d+ files to send \([0-9.]+ MB\))", res.stderr).group(1) + \
                " (includes re-hashing the changed shard locally)"
        results.add(changed)
        results.add(big)
        results.add(Row(f"hashing {size / 1e9:.1f} GB locally once (cold cache; later runs stat only)",
                        [hash_cold]))
    finally:
        host_ssh(h, f"rm -rf {SCRATCH} {RSYNC_TARGET}", check=False)
        if not keep:
            shutil.rmtree(repo, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)


def bench_bare(results: Results, runs: int) -> None:
    log("bare host -> serving (image archives cached on this machine)")
    hosts = ensure_testbed(1)
    h = hosts[0]
    row = Row("bare host to serving, 1 host (full deploy)", target="<= 90 s")
    n = len(testbed_state().hosts)
    for i in range(runs):
        sh([TRITONFLEET, "testbed", "destroy", h.name])
        sh([TRITONFLEET, "testbed", "up", "--hosts", str(n)])
        row.values.append(deploy([h.name]))
        log(f"  run {i + 1}: {row.values[-1]:.1f}s")
    row.met = row.median <= 90
    results.add(row)


def bench_module(results: Results, args, kind: str, module: str) -> int:
    """A measurement with a table of its own: bench/<module>.py's run(results, args, log), its rows
    saved as bench/results/<kind>-<time>.{json,md}."""
    import importlib

    sys.path.insert(0, str(BENCH))
    rc = importlib.import_module(module).run(results, args, log)
    stamp = _save_results(kind, {"meta": results.meta, "rows": [r.__dict__ for r in results.rows]},
                          results.markdown())
    log(f"table in bench/results/{kind}-{stamp}.md")
    return rc


def bench_scale(results: Results, sizes: list[int], args) -> int:
    sys.path.insert(0, str(BENCH))
    import ansible_scale
    import scale

    pull = None if args.pull_sizes is None else [int(x) for x in args.pull_sizes.split(",") if x]
    if ansible_scale.parse_forks(args.ansible_forks) and not ANSIBLE.exists():
        # a fresh clone: the Ansible anchor's own virtualenv first (no manual step)
        log("Ansible for the anchor rows is not installed here: bash bench/setup")
        sh(["bash", str(BENCH / "setup")], timeout=1800)
    rows = scale.run_scale(sizes, ansible_scale.parse_forks(args.ansible_forks), args.ansible_max_hosts,
                           args.ansible_only, pull)
    results.meta["seconds"] = sum(r["wall"] for r in rows)
    results.meta["scale"] = rows
    stamp = _save_results("scale", results.meta, scale.table(rows))
    scale.write_docs(rows, results.meta)
    log(f"table in bench/results/scale-{stamp}.md, docs/scale.md and docs/scale.png")
    return 0 if all(r["ok"] for r in rows) else 1


def replay_check(scale, hosts: int, against: str | None, speed: str = "on") -> int:
    """bench/scale.py replay_check on this tree; with ``against``, on that checkout too, and the
    two trees' requests compared. ``speed``: the runs with the speed-only features on, "off"
    (TRITONFLEET_SPEED=off: pyinfra's own paths), or "both", and what each sent compared."""
    rc = scale.replay_check(hosts, WORK / "replay-check.jsonl", commands=WORK / "replay-check",
                            speed=speed != "off")
    if speed == "both":
        log("the same checks with TRITONFLEET_SPEED=off")
        plain = scale.replay_check(hosts, WORK / "replay-check-speed-off.jsonl",
                                   commands=WORK / "replay-check-speed-off", speed=False)
        same = scale.compare_commands(WORK / "replay-check", WORK / "replay-check-speed-off",
                                      "TRITONFLEET_SPEED=off")
        rc = rc or plain or same
    if against is None:
        return rc
    tree = Path(against).resolve()
    if not (tree / "tritonfleet").is_dir() or not (tree / "bench" / "scale.py").is_file():
        raise SystemExit(f"--against {against}: not a checkout of this repository (no tritonfleet/, bench/scale.py)")
    log(f"the same checks, run by {tree}")
    (tree / "bench" / ".work").mkdir(exist_ok=True)  # its plan step writes there (a fresh checkout has none)
    theirs = scale.replay_check(hosts, WORK / "replay-check-against.jsonl", tree=tree,
                                commands=WORK / "replay-check-against")
    same = scale.compare_commands(WORK / "replay-check", WORK / "replay-check-against", str(tree))
    return rc or theirs or same


def _save_results(kind: str, meta: dict, table: str) -> str:
    """bench/results/<kind>-<time>.json (the run's figures) and .md (its table, also printed);
    returns the time stamp."""
    out = BENCH / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"{kind}-{stamp}.json").write_text(json.dumps(meta, indent=1))
    (out / f"{kind}-{stamp}.md").write_text(table)
    print(table)
    return stamp


def bench_dataplane(results: Results, args) -> int:
    sys.path.insert(0, str(BENCH))
    import dataplane

    rows = dataplane.run(args)
    results.meta["dataplane"] = rows
    results.meta["summary"] = dataplane.summary(rows)
    stamp = _save_results("dataplane", results.meta, dataplane.table(rows))
    dataplane.write_docs(rows, results.meta)
    print(json.dumps(results.meta["summary"], indent=1))
    log(f"table in bench/results/dataplane-{stamp}.md, docs/scale.md and docs/scale-dataplane.png")
    return 0


def bench_fanout(results: Results, args) -> int:
    sys.path.insert(0, str(BENCH))
    import fanout
    import fanout_image

    from tritonfleet_testbed import hosts as tb

    parts = args.fanout_parts.split(",")
    rows = fanout.run(args) if "release" in parts else []
    images = []
    if "image" in parts:  # the wave's hosts and one more, the image mirror
        hosts = fanout.testbed_hosts(args.fanout_hosts + 1)
        images = fanout_image.run(hosts, args.fanout_hosts, args.fanout_image_mb, args.fanout_image_layers,
                                  args.fanout_mbit, tb.BRIDGE, tb.GATEWAY)
    results.meta["fanout"] = rows
    results.meta["fanout_image"] = images
    if images:
        results.meta["image_goals"] = fanout_image.goals(images)
    results.meta["paper_500"] = fanout.paper(rows, images, args.fanout_mbit, args.fanout_hosts)
    text = (fanout.table(rows, args.fanout_mbit) if rows else "") + (
        "\n" + fanout_image.table(images, args.fanout_mbit) if images else "")
    stamp = _save_results("fanout", results.meta, text)
    print(json.dumps(results.meta["paper_500"], indent=1))
    log(f"table in bench/results/fanout-{stamp}.md")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["noop", "parallel", "sync", "bare", "bare-pull", "driver-change", "scale", "replay-check", "dataplane",
                                       "canary", "mirror-fill", "noop-installed", "xid-noise", "storm", "fanout", "fast-path", "all"])
    ap.add_argument("--dataplane-hosts", default="1,3", help="dataplane: host counts for the model data plane")
    ap.add_argument("--dataplane-sizes", default="100,500", help="dataplane: release sizes (MB)")
    ap.add_argument("--dataplane-rollout-mb", type=int, default=200, help="dataplane: weights in the rollouts' release")
    ap.add_argument("--dataplane-image-mb", type=int, default=400, help="dataplane: size of the image through the mirror")
    ap.add_argument("--dataplane-runs", type=int, default=2, help="dataplane: rollout runs per mode")
    ap.add_argument("--dataplane-parts", default="models,rollout,image", help="dataplane: which parts")
    ap.add_argument("--driver-runs", type=int, default=1, help="driver-change: round trips of the branch moves")
    ap.add_argument("--driver-branches", default=None,
                    help="driver-change: the branches moved to in turn (default: 570, then the host's own)")
    ap.add_argument("--fanout-hosts", type=int, default=6, help="fanout: hosts of the wave")
    ap.add_argument("--fanout-mb", type=int, default=150, help="fanout: the release's size (MB)")
    ap.add_argument("--fanout-mbit", type=int, default=100, help="fanout: every link's cap (Mbit/s)")
    ap.add_argument("--fanout-parts", default="release,image", help="fanout: which parts (release, image)")
    ap.add_argument("--fanout-image-mb", type=int, default=300, help="fanout: the image's size (MB)")
    ap.add_argument("--fanout-image-layers", type=int, default=4, help="fanout: the image's layers")
    ap.add_argument("--errors", type=int, default=10, help="canary: runs of a release with 2%% errors")
    ap.add_argument("--latency", type=int, default=10, help="canary: runs of a release 50%% slower")
    ap.add_argument("--identical", type=int, default=20, help="canary: runs of a release that serves the same")
    ap.add_argument("--capacity", action="store_true", help="canary: also the max_unavailable rollouts")
    ap.add_argument("--canary-weight", type=float, default=25, help="canary: percent of the traffic")
    ap.add_argument("--canary-window", type=float, default=45, help="canary: analysis window, seconds")
    ap.add_argument("--canary-step", type=float, default=3, help="canary: step of the latency samples, seconds")
    ap.add_argument("--canary-rate", type=float, default=60, help="canary: the client's requests a second")
    ap.add_argument("--canary-mode", default="explicit", choices=["explicit", "none"],
                    help="canary: the hosts' model-control mode during the runs")
    ap.add_argument("--sizes", default="1,10,50,100,200,500", help="fake fleet sizes for scale")
    ap.add_argument("--ansible-forks", default="5,auto",
                    help="scale: Ansible no-op runs a size, by forks (auto: 20 x CPUs, pyinfra's parallelism; "
                    "none: no Ansible)")
    ap.add_argument("--ansible-max-hosts", type=int, default=100,
                    help="scale: sizes above this skip the Ansible no-op (logged)")
    ap.add_argument("--ansible-only", action="store_true", help="scale: the Ansible no-op alone")
    ap.add_argument("--pull-sizes", default=None,
                    help="scale: fake self-converging hosts for the pull-mode rollout rows (default 500,2000; '' none)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=None,
                    help="hosts for the parallel measurement (default 10) and replay-check (default 3)")
    ap.add_argument("--against", default=None, metavar="TREE",
                    help="replay-check: run the same checks with another checkout's code and compare what each sent")
    ap.add_argument("--speed", default="on", choices=["on", "off", "both"],
                    help="replay-check: with the speed-only features on, off (TRITONFLEET_SPEED=off) or both, "
                    "and what each sent compared")
    ap.add_argument("--size-gb", type=float, default=10.0, help="model repository size for sync")
    ap.add_argument("--sync-runs", type=int, default=3, help="full 10 GB transfers per tool")
    ap.add_argument("--bare-runs", type=int, default=3)
    ap.add_argument("--fill-mb", type=int, default=200, help="mirror-fill: the synthetic image's size (MB)")
    ap.add_argument("--fill-layers", type=int, default=4, help="mirror-fill: its layers")
    ap.add_argument("--fill-runs", type=int, default=3, help="mirror-fill: fills of an empty mirror per client")
    ap.add_argument("--storm-hosts", type=int, default=200, help="storm: hosts (HAProxy servers) that fault at once")
    ap.add_argument("--storm-budget", default="10%", help="storm: quarantine_budget of their group")
    ap.add_argument("--storm-recover", type=int, default=5, help="storm: drained hosts whose fault then clears")
    ap.add_argument("--storm-rate", type=float, default=100, help="storm: the client's requests a second")
    ap.add_argument("--storm-check-inter", default="2s", help="storm: HAProxy's health check interval")
    ap.add_argument("--fast-path-runs", type=int, default=20, help="fast-path: faults on the one host, one at a time")
    ap.add_argument("--fast-path-push", default="on", choices=["on", "off"],
                    help="fast-path: the collector pushes its fault to the receiver (on) or Prometheus alone (off)")
    ap.add_argument("--storm-path", default="push", choices=["push", "prometheus"],
                    help="storm: the hosts push their fault to the receiver too (the direct path), or not")
    ap.add_argument("--storm-settle", type=float, default=15,
                    help="storm: seconds after the last alert before the recovered hosts' faults clear")
    ap.add_argument("--keep", action="store_true", help="keep the generated model repository")
    ap.add_argument("--xid-lines", type=int, default=800_000, help="xid-noise: Xid lines in the flood")
    ap.add_argument("--xid-distinct", type=int, default=29, help="xid-noise: distinct texts among them")
    ap.add_argument("--xid-batch", type=int, default=50_000, help="xid-noise: lines the file grows by between reads")
    args = ap.parse_args()
    if args.what == "xid-noise":  # the collector alone on this machine: no test host (not part of all)
        results = Results()
        results.meta = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                        "load": os.getloadavg(), "args": vars(args), "python": sys.version.split()[0]}
        return bench_module(results, args, "xid-noise", "xid_noise")
    if "TRITONFLEET_TESTBED" not in os.environ:
        raise SystemExit("[bench] export TRITONFLEET_TESTBED=<instance> first (see docs/performance.md)")
    os.chdir(ROOT)
    WORK.mkdir(parents=True, exist_ok=True)
    results = Results()
    results.meta = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                    "load": os.getloadavg(), "args": vars(args)}
    t0 = time.perf_counter()
    if args.what == "scale":  # no testbed host: bench/fakefleet.py's fake fleet (not part of all)
        return bench_scale(results, [int(x) for x in args.sizes.split(",")], args)
    if args.what == "replay-check":  # no testbed host either
        sys.path.insert(0, str(BENCH))
        import scale

        return replay_check(scale, args.hosts or 3, args.against, args.speed)
    if args.what == "dataplane":  # its own table in docs/scale.md (not part of all)
        return bench_dataplane(results, args)
    if args.what == "fanout":  # its own table (not part of all)
        return bench_fanout(results, args)
    if args.what == "bare-pull":  # its own table (not part of all)
        return bench_module(results, args, "bare-pull", "pull_bare")
    if args.what == "driver-change":  # a test host's driver branch moved and back; its own table (not part of all)
        return bench_module(results, args, "driver-change", "driver_change")
    if args.what == "mirror-fill":  # no testbed host; its own table (not part of all)
        return bench_module(results, args, "mirror-fill", "mirror_fill")
    if args.what == "storm":  # no testbed host; its own table (not part of all)
        return bench_module(results, args, "storm", "storm")
    if args.what == "fast-path":  # no testbed host; its own table (not part of all)
        return bench_module(results, args, "fast-path", "fastpath")
    if args.what == "noop-installed":  # no testbed host; its own table (not part of all)
        return bench_module(results, args, "noop-installed", "noop_installed")
    if args.what == "canary":  # about an hour of rollouts under a client's load (not part of all)
        sys.path.insert(0, str(BENCH))
        import canary

        canary.run(results, args, log)
    if args.what in ("noop", "all"):
        bench_noop(results, args.runs)
    if args.what in ("parallel", "all"):
        bench_parallel(results, args.runs, args.hosts or 10)
    if args.what in ("sync", "all"):
        bench_sync(results, args.sync_runs, args.size_gb, args.keep)
    if args.what in ("bare", "all"):
        bench_bare(results, args.bare_runs)
    results.meta["seconds"] = time.perf_counter() - t0
    results.meta["load_after"] = os.getloadavg()
    path = results.save()
    print(results.markdown())
    log(f"table written to {path.relative_to(ROOT)} (load average before/after: "
        f"{results.meta['load'][0]:.1f}/{results.meta['load_after'][0]:.1f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
