"""A bare test host from its bootstrap script alone to serving, the control machine doing nothing
meanwhile (`bench/run.py bare-pull`; the pull-mode goal in docs/scale.md).

The first testbed host is destroyed and brought up bare (as `bench/run.py bare` does for the push
deploy). A real nginx on the testbed bridge serves a pull-mode origin (tritonfleet_testbed.
origin_server); `tritonfleet bootstrap` writes the host's script and `tritonfleet pull publish`
its first release, both before the clock starts. The script is then handed to the host over SSH
the way cloud-init's ``runcmd`` runs it, and from there the control machine runs nothing: the
bench reads the origin's directory for the host's report (the report is a file the host PUTs).
The clock stops when the host reports its first run ok. Then, read-only, `tritonfleet status` must
find it serving every model without drift.

Recorded per run: the wall time to the report (and to the script's own end: the agent's
install), the bytes the host fetched from the origin (nginx's own access log), the control
machine's CPU between the hand-over and the report (this process and its children: the SSH that
handed over the script, then the polling), and the host's own CPU (its cgroup). The host is left
serving, out of pull mode (its timer, agent and state removed).

Takes one host's deploy from bare plus the agent's install: 92 s from the hand-over to serving on
the 2-CPU machine at a load average of 5 (the script 24 s, the first run 67 s), about 8 minutes a
run with the host's destruction and bring-up; the same deploy took 14.7 min under a load average
of 20.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import time
from pathlib import Path

LEAVE_PULL_MODE = (
    "systemctl disable --now tritonfleet-converge.timer >/dev/null 2>&1; systemctl stop tritonfleet-converge.service; "
    "rm -f /etc/systemd/system/tritonfleet-converge.service /etc/systemd/system/tritonfleet-converge.timer; "
    "systemctl daemon-reload; rm -rf /opt/tritonfleet /etc/tritonfleet/pull.json /etc/tritonfleet/release-signers "
    "/etc/tritonfleet/pull "
    "/var/lib/tritonfleet/pull /var/lib/tritonfleet/bootstrap.sh /var/lib/prometheus/node-exporter/tritonfleet_pull.prom; "
    "true")
# nginx's default "combined" format: address - user [time] "request" status bytes "referer" "agent"
ACCESS = re.compile(r'^(\S+) \S+ \S+ \[[^\]]*\] "[^"]*" (\d{3}) (\d+) ')


def origin_bytes(access_log: Path, address: str) -> tuple[int, int]:
    """(requests, body bytes) nginx logged for ``address``."""
    n = size = 0
    for line in access_log.read_text(errors="replace").splitlines():
        m = ACCESS.match(line)
        if m and m.group(1) == address:
            n += 1
            size += int(m.group(3))
    return n, size


def _control_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run(results, args, log) -> int:
    from run import (
        INVENTORY,
        TRITONFLEET,
        WORK,
        Row,
        ensure_testbed,
        host_ssh,
        sh,
        ssh_opts,
        testbed_state,
    )

    from tritonfleet.fleet.pull.origin import RESULTS, PullSite
    from tritonfleet.fleet.pull.reports import Reports
    from tritonfleet_testbed import hosts as tb
    from tritonfleet_testbed.origin_server import OriginServer, agent_wheelhouse, build_wheel

    host = ensure_testbed(1)[0]
    n = len(testbed_state().hosts)
    work = WORK / f"bare-pull-{time.strftime('%Y%m%d-%H%M%S')}"
    (work / "origin").mkdir(parents=True)
    key = work / "release-key"
    sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "releases", "-f", str(key)])
    log("agent wheels and tritonfleet's wheel (cached after the first run)")
    wheels, wheel = agent_wheelhouse(), build_wheel(work / "dist")
    row = Row("pull: bare host to serving from its bootstrap script alone", target="serving, control machine idle")
    runs: list[dict] = []
    results.meta["bare_pull"] = runs
    ok = True
    for i in range(args.bare_runs):
        log(f"run {i + 1}: {host.name} destroyed and brought up bare")
        sh([TRITONFLEET, "testbed", "destroy", host.name])
        sh([TRITONFLEET, "testbed", "up", "--hosts", str(n)], timeout=1800)
        h = {x.name: x for x in testbed_state().hosts}[host.name]
        srv = OriginServer(work / "origin", work / f"nginx-{i}", addr=tb.GATEWAY)
        try:
            origin = PullSite(work / "origin", srv.url)
            data = ("--data", "pull_poll_interval=3")
            sh([TRITONFLEET, "bootstrap", INVENTORY, "--origin", str(origin.root), "--url", srv.url,
                "--out", str(work / "boot"), "--wheel", str(wheel), "--wheelhouse", str(wheels),
                "--sign-key", str(key), "--limit", h.name, *data], timeout=900)
            _, res = sh([TRITONFLEET, "pull", "publish", INVENTORY, "deploys/triton.py", "--origin",
                         str(origin.root), "--sign-key", str(key), "--limit", h.name, *data], timeout=900)
            release = res.stdout.strip().splitlines()[-1]
            script = (work / "boot" / h.name / "bootstrap.sh").read_text()
            cpu0, t0 = _control_cpu(), time.perf_counter()
            handed = subprocess.run(["ssh", *ssh_opts(tb.ssh_key()), f"root@{h.address}", "sh -s"], input=script,
                                    capture_output=True, text=True, timeout=1800)
            t_script = time.perf_counter() - t0
            if handed.returncode != 0:
                raise SystemExit(f"[bench] {h.name}: the bootstrap script failed ({handed.returncode}):\n"
                                 f"{handed.stdout[-2000:]}{handed.stderr[-3000:]}")
            reports = Reports(origin)
            rep: dict = {}
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                rep = reports.read(h.name) or {}
                if rep.get("release") == release and rep.get("result") in RESULTS:
                    break
                time.sleep(1)
            seconds = time.perf_counter() - t0
            control_cpu = _control_cpu() - cpu0
            requests_n, fetched = origin_bytes(work / f"nginx-{i}" / "access.log", h.address)
        finally:
            srv.stop()
        _, st = sh([TRITONFLEET, "status", INVENTORY, "--json", "--limit", h.name], check=False, timeout=600)
        try:
            (status,) = json.loads(st.stdout)
        except ValueError:
            status = {"error": (st.stdout + st.stderr)[-2000:]}
        serving = bool(status.get("reachable")) and status.get("drift") == [] and \
            status.get("unit_state") == "active" and \
            sorted(status.get("models_ready") or []) == ["resnet50_onnx", "text_classifier_onnx"]
        good = rep.get("result") == "ok" and serving
        ok = ok and good
        runs.append({"run": i + 1, "host": h.name, "seconds": round(seconds, 1), "script_s": round(t_script, 1),
                     "report": rep, "serving": serving, "status": status, "control_cpu_s": round(control_cpu, 2),
                     "origin_requests": requests_n, "origin_bytes": fetched})
        row.values.append(seconds)
        log(f"  run {i + 1}: {'serving' if good else 'NOT serving'} after {seconds:.1f} s (script {t_script:.1f} s), "
            f"{fetched / 1e6:.1f} MB in {requests_n} requests from the origin, control CPU {control_cpu:.2f} s")
        host_ssh(h, LEAVE_PULL_MODE, check=False)
    row.met = ok
    cpu = [r["control_cpu_s"] for r in runs]
    mb = [r["origin_bytes"] / 1e6 for r in runs]
    row.note = (f"{sum(r['serving'] for r in runs)}/{len(runs)} serving with no drift; control machine CPU "
                f"{max(cpu):.2f} s at most from hand-over to report (the SSH handing the script over, then "
                f"polling the origin's directory); {min(mb):.0f}-{max(mb):.0f} MB from the origin")
    results.add(row)
    return 0 if ok else 1
