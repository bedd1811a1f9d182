"""One host's fault line to out of rotation (``bench/run.py fast-path``), at an operator's default
intervals, through real components, many runs:

* **Host**: the storm's fake hosts (bench/storm.py: Triton's readiness and the client's requests),
  four in one group (``quarantine_budget`` 1, the default); the first runs the **real GPU fault
  collector** (tritonfleet/gpu/telemetry.py run as a script as its unit runs it, default
  ``--interval`` 5, a kernel-message file as its source, ``--push-*`` as the telemetry step renders
  them with ``quarantine_push_url``), and its fake node exporter serves the collector's textfile.
* **Load balancer**: Debian's HAProxy (tests/support/haproxy.py).
* **Alerting**: Debian's Prometheus and Alertmanager with the files of `tritonfleet prometheus`
  at their defaults (health scrape and evaluation every 5 s): the record, beside the direct path.
* **Receiver**: ``Receiver`` and ``serve`` in this process (``quarantine_check_interval`` 5 s), with
  the push secret; its warm gate the host's readiness answer.

A run: an Xid 79 record appended to the collector's source, its kernel timestamp the moment of the
append (the collector's fault time); the clock stops when HAProxy's runtime API reports the server
in maintenance (polled every 20 ms). The fault stands until the Prometheus path's alert is active
in Alertmanager; then the "reboot" (the source emptied), the alert resolved, a release through the
receiver's API, the host back, and a pause of a random 0-5 s so the faults fall at every phase of
the 5 s scrape and rounds. ``--fast-path-push off`` measures the Prometheus path alone the same way.
Reported: p50, p99, max over the runs. No timing is asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import storm

ROOT = storm.ROOT


def run(results, args, log) -> int:
    from run import WORK, Row

    from tests.support.haproxy import HAProxy
    from tritonfleet.fleet import quarantine
    from tritonfleet.gpu import fault_push
    from tritonfleet.gpu.telemetry import boot_time
    from tritonfleet.inventory.roster import FleetHost
    from tritonfleet.settings.defaults import DEFAULTS
    from tritonfleet_testbed.ports import free_port

    n, runs, push = 4, args.fast_path_runs, args.fast_path_push == "on"
    work = WORK / f"fastpath-{time.strftime('%Y%m%d-%H%M%S')}"
    faults = work / "faults"
    faults.mkdir(parents=True)
    stack = contextlib.ExitStack()
    with stack:
        start = storm.process_starter(work, stack)  # whatever was started is stopped, however the run ends
        ports_file = work / "ports.json"
        start([sys.executable, storm.__file__, "backends", str(n), str(ports_file), str(faults)], "backends")
        ports = storm._until(lambda: json.loads(ports_file.read_text()) if ports_file.exists() else None, "hosts", 60)
        names = [f"h{i:03d}" for i in range(n)]
        (work / "hap").mkdir()
        hap = HAProxy(work / "hap", [(h, f"127.0.0.1:{ports[2 * i]}") for i, h in enumerate(names)], inter="2s")
        stack.callback(hap.stop)
        token_file = quarantine.write_token(work / "token")
        secret_file = quarantine.write_token(work / "push.secret")
        rport, amport, pport = free_port(), free_port(), free_port()
        url = f"http://127.0.0.1:{rport}"
        common = {"ssh_hostname": "127.0.0.1", "health_host": "127.0.0.1", "lb": "haproxy",
                  "lb_haproxy_sockets": [hap.socket], "lb_drain_timeout": 30, "quarantine_token_file": str(token_file),
                  "quarantine_url": url, "ssh_strict_host_key_checking": "off"}
        data = {h: {**common, "triton_http_port": ports[2 * i], "triton_metrics_port": ports[2 * i + 1],
                    "telemetry_node_exporter_port": ports[2 * i]} for i, h in enumerate(names)}
        inv = work / "fastpath_inventory.py"
        inv.write_text("fleet = [" + ", ".join(f"({h!r}, {d!r})" for h, d in data.items()) + "]\n")
        cfg = work / "prom"
        res = subprocess.run([str(Path(sys.executable).parent / "tritonfleet"), "prometheus", str(inv), "--out", str(cfg),
                              "--alertmanager", f"127.0.0.1:{amport}", "--quarantine-url", url], cwd=ROOT,
                             capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"[fast-path] tritonfleet prometheus: {res.stderr}")
        start([storm.PROMETHEUS, f"--config.file={cfg / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn"], "prometheus")
        start([storm.ALERTMANAGER, f"--config.file={cfg / 'alertmanager.yml'}", f"--storage.path={work / 'am'}",
               f"--web.listen-address=127.0.0.1:{amport}", "--cluster.listen-address=", "--log.level=warn"],
              "alertmanager")
        hosts = [FleetHost(h, [], {**DEFAULTS, **d}) for h, d in data.items()]
        events = stack.enter_context(open(work / "receiver.log", "w"))  # noqa: SIM115 - closed with the stack

        def gate(fh, timeout: float) -> tuple[bool, str]:
            ok = storm._get(f"http://127.0.0.1:{fh.get('triton_http_port')}/v2/health/ready") is not None
            return ok, "ready" if ok else "not ready"

        rec = quarantine.Receiver(hosts, work / "state", alertmanager=f"http://127.0.0.1:{amport}",
                                  echo=lambda line: events.write(line + "\n"), gate=gate)
        stack.callback(rec.stop.set)
        secret = quarantine.read_token(secret_file)
        threading.Thread(target=quarantine.serve, daemon=True, args=(
            rec, f"127.0.0.1:{rport}", [quarantine.Caller("operator", quarantine.read_token(token_file))], False,
            secret)).start()
        # the first host's real collector, as its unit runs it
        host = names[0]
        kmsg, textfiles = faults / f"{host}.kmsg", faults / f"{host}.d"
        kmsg.write_text("")
        textfiles.mkdir()
        host_token = work / f"{host}.push.token"
        host_token.write_text(fault_push.host_token(secret, host) + "\n")
        cmd = [sys.executable, str(ROOT / "tritonfleet/gpu/telemetry.py"), f"--textfile-dir={textfiles}",
               "--nvidia-smi=false", f"--kmsg={kmsg}", f"--interval={DEFAULTS['telemetry_interval']}"]
        if push:
            cmd += [f"--push-url={url}", f"--push-host={host}", f"--push-token-file={host_token}"]
        start(cmd, "collector")
        storm._until(lambda: storm._get(f"http://127.0.0.1:{pport}/-/ready"), "prometheus", 60)
        storm._until(lambda: storm._get(f"http://127.0.0.1:{amport}/-/ready"), "alertmanager", 60)
        storm._until(lambda: storm._get(url + "/-/healthy"), "receiver", 30)
        storm._until(lambda: (textfiles / "tritonfleet-gpu.prom").exists(), "the collector", 30)
        lb = quarantine.balancer(hosts[0])
        storm._until(lambda: lb.state().serving, "haproxy serving", 60)
        time.sleep(12)  # two scrapes: every target up
        def firing(name: str) -> bool:
            query = f"active=true&filter=host%3D%22{name}%22&filter=quarantine%3D%22true%22"
            body = storm._get(f"http://127.0.0.1:{amport}/api/v2/alerts?{query}")
            return body is not None and bool(json.loads(body))

        def release(name: str) -> bool:
            if name in rec.snapshot()["hosts"]:
                quarantine.ask(url, name, "release", by="bench", token=quarantine.read_token(token_file))
            return name not in rec.snapshot()["hosts"]

        btime = boot_time()
        took: list[float] = []
        for i in range(runs):
            t0 = time.time()
            with open(kmsg, "a") as f:
                f.write(f"3,{i + 1},{int((t0 - btime) * 1e6)},-;NVRM: Xid (PCI:0000:3b:00): 79, pid=7, "
                        "name=tritonserver, GPU has fallen off the bus.\n")
            storm._until(lambda: lb.state().maintenance, f"run {i + 1}: {host} out", 60, 0.02)
            took.append(time.time() - t0)
            log(f"fast-path: run {i + 1}: out {took[-1]:.2f} s after the fault line")
            # the Prometheus path's alert of this fault comes (the fault stands until then, as until a
            # reboot) and goes before the next run (else it would take the host out again)
            storm._until(lambda: firing(host), f"run {i + 1}: the Prometheus path's alert", 60, 0.2)
            kmsg.write_text("")  # the "reboot": the kernel's messages start empty
            storm._until(lambda: storm._get(f"http://127.0.0.1:{amport}/-/ready") and not firing(host), f"run {i + 1}: its alert resolved in Alertmanager", 90, 0.5)
            storm._until(lambda: release(host), f"run {i + 1}: released and back", 90, 1)
            storm._until(lambda: lb.state().serving and host not in rec.snapshot()["hosts"], f"run {i + 1}: back",
                         60, 0.2)
            time.sleep(random.uniform(0, 5))
    figures = {"runs": runs, "path": "direct (push) and Prometheus" if push else "Prometheus only",
               "p50": storm._pct(took, 0.5), "p99": storm._pct(took, 0.99), "max": max(took), "min": min(took),
               "all": [round(t, 3) for t in took],
               "settings": {"collector --interval": DEFAULTS["telemetry_interval"],
                            "health scrape and evaluation": "5s (defaults)",
                            "quarantine_check_interval": DEFAULTS["quarantine_check_interval"],
                            "load": os.getloadavg()}}
    results.meta["fast-path"] = figures
    results.add(Row(f"fast-path: one host's fault line -> out of rotation ({figures['path']})", took,
                    target="p50 <= 1.5 s, p99 <= 3 s", met=figures["p50"] <= 1.5 and figures["p99"] <= 3,
                    note=f"{runs} runs; p50 {figures['p50']:.2f} s, p99 {figures['p99']:.2f} s"))
    print(json.dumps(figures, indent=1))
    log(f"fast-path: work files in {work}")
    return 0
