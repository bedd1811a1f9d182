"""A driver change's time from reboot to serving, per host and by what it is made of
(`bench/run.py driver-change`; docs/fleet-operations.md, "Driver changes").

The first testbed host, converged by the full deploy (from bare on a fresh clone), is moved
580 -> 570 -> 580 (``--driver-runs`` such round trips, ``--driver-branches`` to name others) by
``tritonfleet rollout inventories/testbed.py deploys/triton.py --limit <host> --data
nvidia_driver_branch=<B> --json``, as an operator moves a canary. Each move is then read, never
timed from outside, from:

* the rollout's own journal (``journal.jsonl`` in its log directory: when its batch started and
  ended) and its batch's pyinfra log (the reboot's new boot id, the health gate's "healthy in X s",
  whether an image was loaded);
* the host's ``/var/log/dpkg.log`` (the driver packages, and the DKMS package's configure: the
  module build; one-second resolution);
* the host's journal of the boot before and the boot after (microseconds): systemd-logind's "The
  system will reboot now!", sshd listening again, docker.service and triton.service started, the
  Triton container's first line and "Started HTTPService" (models loaded, serving), and the
  containers the deploy and the rollout ran after it (the last one: the CUDA validation).

The host is left on the branch it started on. Takes about 25 s a move on the loaded 2-CPU machine
once the host is converged (a deploy from bare first: minutes); the figures are in
docs/fleet-operations.md.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path

DPKG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (\S+) (.*)$")
DKMS = re.compile(r"^(?:configure|status installed) (\S*dkms\S*?):")
HEALTHY = re.compile(r"healthy in ([0-9.]+)s")
REBOOTED = re.compile(r"rebooted \(boot id ([0-9a-f-]+)\)")
SCOPE = re.compile(r"^Started (docker-[0-9a-f]+\.scope)")


def journal(entries_text: str) -> list[tuple[float, str, str]]:
    """``journalctl -o json`` lines -> [(time, unit or identifier, message)], oldest first."""
    out = []
    for line in entries_text.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        msg = e.get("MESSAGE")
        if isinstance(msg, list):  # journald's bytes for a message that is not UTF-8
            msg = bytes(msg).decode(errors="replace")
        who = e.get("UNIT") or e.get("_SYSTEMD_UNIT") or e.get("SYSLOG_IDENTIFIER") or ""
        out.append((int(e["__REALTIME_TIMESTAMP"]) / 1e6, who, msg or ""))
    return sorted(out)


def first(entries, test, after: float = 0.0, what: str = "") -> float:
    for t, who, msg in entries:
        if t >= after and test(who, msg):
            return t
    raise SystemExit(f"[bench] not in the host's journal: {what}")


def dpkg_lines(text: str, since: float) -> list[tuple[float, str]]:
    """/var/log/dpkg.log's lines from ``since`` on (the host's clock is this machine's: UTC)."""
    out = []
    for line in text.splitlines():
        m = DPKG_LINE.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
        if t >= int(since):
            out.append((t, f"{m.group(2)} {m.group(3)}"))
    return out


def phases(rollout: dict, batch_log: str, dpkg: list[tuple[float, str]], old_boot, new_boot) -> dict:
    """One move's phases (seconds) from what the rollout, dpkg and the host's journal recorded."""
    start, done = rollout["batch"], rollout["batch-done"]
    reboot = first(old_boot, lambda w, m: "The system will reboot now" in m, start, "logind's reboot")
    booted = new_boot[0][0]
    ssh_up = first(new_boot, lambda w, m: m.startswith("Server listening on"), what="sshd listening")
    docker = first(new_boot, lambda w, m: w == "docker.service" and m.startswith("Started "), what="docker started")
    unit = first(new_boot, lambda w, m: w == "triton.service" and m.startswith("Started "), what="triton started")
    output = first(new_boot, lambda w, m: w == "triton.service" and not m.startswith(("Start", "Error: No such")),
                   unit, "the Triton container's first line")
    serving = first(new_boot, lambda w, m: "Started HTTPService" in m, unit, "Triton's HTTP service")
    scopes = [t for t, w, m in new_boot if SCOPE.match(m) and serving < t <= done]
    gate = HEALTHY.search(batch_log)
    if not gate:
        raise SystemExit("[bench] the batch's pyinfra log has no health gate line ('healthy in X s')")
    before = [t for t, _ in dpkg if t <= reboot]
    dkms = [t for t, line in dpkg if DKMS.match(line) and t <= reboot]
    return {
        "deploy start to the first package change": before[0] - start if before else 0.0,
        "driver packages (apt: the old branch out, the new in)": (before[-1] - before[0]) if before else 0.0,
        "module build (the DKMS package's configure)": (dkms[-1] - dkms[0]) if len(dkms) >= 2 else 0.0,
        "last package to the reboot (holds, pins, the reboot check)": reboot - before[-1] if before else 0.0,
        "reboot: shutdown to sshd listening in the new boot": ssh_up - reboot,
        "Docker: boot to docker.service started": docker - booted,
        "image: triton.service started to the container's first line": output - unit,
        "Triton: first line to HTTP service started (models loaded)": serving - output,
        "warm gate: the deploy's health gate (live, ready, models, metrics, first inference)": float(gate.group(1)),
        "CUDA validation container (vectorAdd in the Triton image)": (done - scopes[-1]) if scopes else 0.0,
        "reboot to Triton serving": serving - reboot,
        "reboot to validated (the rollout's batch done)": done - reboot,
        "whole move (the rollout's batch)": done - start,
        "image loaded (docker load) during the move": float(batch_log.count("docker load:")),
    }


def move(h, branch: str, work: Path, log) -> dict:
    """One rollout of ``h`` to ``branch``; its phases."""
    from run import INVENTORY, TRITONFLEET, host_ssh, sh

    logs = work / f"move-{time.strftime('%H%M%S')}-{branch}"
    env = dict(os.environ, TRITONFLEET_LOG_DIR=str(logs))
    old = host_ssh(h, "cat /proc/sys/kernel/random/boot_id").strip()
    log(f"{h.name}: rollout to nvidia_driver_branch={branch}")
    wall, res = sh([TRITONFLEET, "rollout", INVENTORY, "deploys/triton.py", "--limit", h.name, "--data",
                 f"nvidia_driver_branch={branch}", "--json"], check=False, env=env, timeout=3600)
    report = json.loads(res.stdout or "{}")
    rows = {r["host"]: r for r in report.get("hosts", [])}
    if res.returncode != 0 or rows.get(h.name, {}).get("result") != "updated":
        raise SystemExit(f"[bench] the rollout to {branch} did not update {h.name} ({res.returncode}):\n"
                         f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    (run_dir,) = [p for p in logs.iterdir() if (p / "journal.jsonl").is_file()]
    events = {}
    for line in (run_dir / "journal.jsonl").read_text().splitlines():
        e = json.loads(line)
        events.setdefault(e["event"], e["time"])
    batch_log = (run_dir / "batch-1.log").read_text()
    new = host_ssh(h, "cat /proc/sys/kernel/random/boot_id").strip()
    said = REBOOTED.search(batch_log)
    if new == old or not said or said.group(1) != new:
        raise SystemExit(f"[bench] {h.name}: the move to {branch} did not reboot it once (boot {old} -> {new}, "
                         f"the deploy's log: {said.group(0) if said else 'no reboot'})")
    fields = "--output-fields=MESSAGE,UNIT,_SYSTEMD_UNIT,SYSLOG_IDENTIFIER"
    old_boot = journal(host_ssh(h, f"journalctl -b {old.replace('-', '')} -o json {fields} --no-pager "
                                   "SYSLOG_IDENTIFIER=systemd-logind"))
    new_boot = journal(host_ssh(h, f"journalctl -b {new.replace('-', '')} -o json {fields} --no-pager"))
    dpkg = dpkg_lines(host_ssh(h, "cat /var/log/dpkg.log"), events["batch"])
    driver = host_ssh(h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").strip()
    if not driver.startswith(f"{branch}."):
        raise SystemExit(f"[bench] {h.name} runs driver {driver} after the move to {branch}")
    out = phases(events, batch_log, dpkg, old_boot, new_boot)
    out["the rollout's own time for the host (its report)"] = rows[h.name]["seconds"]
    out["command wall time (tritonfleet rollout: plan, probe, batch, report)"] = wall
    return {"branch": branch, "driver": driver, "boot": [old, new], "log": str(run_dir), "phases": out}


def run(results, args, log) -> int:
    from run import WORK, Row, deploy, ensure_testbed, host_ssh

    h = ensure_testbed(1)[0]
    log(f"{h.name}: the full deploy first (converged: a no-op; bare: from bare)")
    deploy([h.name])
    start = host_ssh(h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").strip().split(".", 1)[0]
    there = (args.driver_branches or f"570,{start}").split(",")
    work = WORK / f"driver-change-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True)
    moves: list[dict] = []
    results.meta["driver_change"] = moves
    results.meta["host"] = h.name
    try:
        for _ in range(args.driver_runs):
            for branch in there:
                moves.append(move(h, branch, work, log))
                log("  " + ", ".join(f"{k.split(':')[0]} {v:.1f}" for k, v in moves[-1]["phases"].items()))
    finally:
        now = host_ssh(h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader", check=False).strip()
        if not now.startswith(f"{start}."):
            log(f"{h.name}: back to {start} (the inventory's branch)")
            deploy([h.name])
    names = list(moves[0]["phases"]) if moves else []
    path = " -> ".join([start, *[m["branch"] for m in moves]])
    for name in names:
        values = [m["phases"][name] for m in moves]
        if name.startswith("image loaded"):
            results.add(Row(f"{name} (count)", [sum(values)], unit="", note="0: the image stays in Docker's store"))
            continue
        note = ""
        if name.startswith(("driver packages", "module build", "deploy start", "last package")):
            note = "dpkg.log: 1 s resolution"
        results.add(Row(name, values, note=note or f"moves {path}"))
    return 0
