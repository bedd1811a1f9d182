"""A fault storm (``bench/run.py storm``): many hosts report a critical Xid at once, through real
components and an operator's default intervals.

* **Hosts**: one process of small HTTP servers on loopback, one port a host (``backends`` below):
  each answers Triton's readiness (``/v2/health/ready``, HAProxy's check), the client's requests,
  and ``/metrics`` with the GPU fault collector's Xid series (its own ``render``, NVIDIA's action
  label included) while the host's fault file exists (its content: the collector's timestamp of
  the fault). With ``--storm-path push`` (the default) each host's fault is also pushed to the
  receiver the moment its file is there, with the collector's own code (``collectors`` below).
* **Load balancer**: Debian's HAProxy with one server a host (tests/support/haproxy.py).
* **Alerting**: Debian's Prometheus and Alertmanager with the files `tritonfleet prometheus
  --alertmanager --quarantine-url` writes for the inventory (its defaults: the health scrape and
  evaluation every 5 s, Alertmanager's quarantine route with group_wait 0 s, group_interval 10 s).
* **Receiver**: tritonfleet's quarantine receiver (``Receiver`` and ``serve``, in this process),
  with the inventory's budget and breaker; its warm gate is the host's readiness answer (the fake
  hosts have no model to infer with).
* **Client**: a bounded load through HAProxy all along; a failed request is any answer but 200.

The run: every host faults at once; the receiver takes out the first ones within the budget and
alerts on the rest; the breaker opens; a few of the drained hosts recover (their Xid series
gone, as after a reset) and must return while the breaker stays open. Reported: fault to out of
rotation (p50, p99) for the hosts within the budget, fault to alert for every host, the breaker,
the client's failed requests, recovered hosts back in service. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the helpers the integration tests start servers with

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"


# ---- the fake hosts (a process of their own: python bench/storm.py backends N PORTS FAULTS) ----

def _metrics(fault: Path) -> bytes:
    """What the host's node exporter serves of the GPU fault collector: the real collector's
    textfile where one runs (bench/fastpath.py), else the collector's own rendering of an Xid 79
    (RESTART_BM in NVIDIA's catalog) seen at the fault file's time, while that file exists."""
    from tritonfleet.gpu import telemetry

    textfile = fault.with_name(fault.name + ".d") / telemetry.TEXTFILE
    with contextlib.suppress(OSError):
        return textfile.read_bytes()
    try:
        seen = float(fault.read_text())
        rows = [("0000:00:1e", 79, "RESTART_BM", 1, 1, seen, True)]
    except (OSError, ValueError):
        rows = []
    return telemetry.render([], True, 0.04, rows, True).encode()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, fault: Path) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            body = _metrics(fault) if path.startswith(b"/metrics") else b"{}"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        writer.close()


async def _backends(n: int, ports_file: Path, faults: Path) -> None:
    servers, ports = [], []
    for i in range(2 * n):  # each host: its Triton and node exporter port, its Triton metrics port
        fault = faults / (f"h{i // 2:03d}" if i % 2 == 0 else "none")
        srv = await asyncio.start_server(lambda r, w, f=fault: _serve(r, w, f), "127.0.0.1", 0, backlog=256)
        servers.append(srv)
        ports.append(srv.sockets[0].getsockname()[1])
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(ports))
    os.replace(tmp, ports_file)
    await asyncio.Event().wait()


def _collectors(names: list[str], faults: Path, url: str, secret: str) -> None:
    """Each host's GPU fault collector as far as the direct path goes: its source polled as the
    collector polls a file (every 0.25 s, KernelLog.wait), and the fault pushed with the
    collector's own code (tritonfleet.gpu.fault_push.Pusher, the host's own token) the moment it
    is there."""
    from tritonfleet.gpu import fault_push

    def one(h: str) -> None:
        p = fault_push.Pusher(url, h, fault_push.host_token(secret, h), {"RESTART_BM"},
                              say=lambda t: print(f"{h}: {t}", flush=True))
        while True:
            with contextlib.suppress(OSError, ValueError):
                seen = float((faults / h).read_text())
                p.push(79, "0000:00:1e", "RESTART_BM", seen, "NVRM: Xid (PCI:0000:00:1e): 79, GPU has fallen off the bus.")
                for t in p.threads:
                    t.join()
                return
            time.sleep(0.25)

    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    threading.Event().wait()


# ---- the run ----------------------------------------------------------------------------------

def _get(url: str, timeout: float = 3) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read() if r.status == 200 else None
    except OSError:
        return None


def process_starter(work: Path, stack: contextlib.ExitStack):
    """``start(cmd, name)``: a process in a session of its own, its output in ``work/<name>.log``;
    every one started is stopped (TERM, then KILL after 20 s) when ``stack`` closes."""
    procs: list[subprocess.Popen] = []

    def stop() -> None:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    stack.callback(stop)

    def start(cmd: list[str], name: str) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=open(work / f"{name}.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                             stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        return p

    return start


def _until(check, what: str, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SystemExit(f"[storm] {what}: not after {timeout:.0f} s")
        time.sleep(step)


class Load:
    """Threads sending GETs through HAProxy at a bounded rate; every answer but 200 is a failure."""

    def __init__(self, url: str, rate: float, threads: int = 4):
        self.url, self.gap = url, threads / rate
        self.ok = self.failed = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                with opener.open(self.url + "/v2/models/m/infer", timeout=10) as r:
                    good = r.status == 200
                    r.read()
                why = ""
            except OSError as e:
                good, why = False, str(e)
            with self.lock:
                if good:
                    self.ok += 1
                else:
                    self.failed += 1
                    self.errors.append(why)
            self.stop.wait(max(0.0, self.gap - (time.monotonic() - t)))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run(results, args, log) -> int:
    from run import WORK, Row

    from tests.support.haproxy import HAProxy
    from tritonfleet.fleet import quarantine
    from tritonfleet.inventory.roster import FleetHost
    from tritonfleet.settings.defaults import DEFAULTS
    from tritonfleet_testbed.ports import free_port

    n, budget, recover = args.storm_hosts, args.storm_budget, args.storm_recover
    work = WORK / f"storm-{time.strftime('%Y%m%d-%H%M%S')}"
    faults = work / "faults"
    faults.mkdir(parents=True)
    stack = contextlib.ExitStack()
    with stack:
        start = process_starter(work, stack)  # whatever was started is stopped, however the run ends
        ports_file = work / "ports.json"
        start([sys.executable, __file__, "backends", str(n), str(ports_file), str(faults)], "backends")
        ports = _until(lambda: json.loads(ports_file.read_text()) if ports_file.exists() else None, "fake hosts", 60)
        names = [f"h{i:03d}" for i in range(n)]
        (work / "hap").mkdir()
        hap = HAProxy(work / "hap", [(h, f"127.0.0.1:{ports[2 * i]}") for i, h in enumerate(names)],
                      inter=args.storm_check_inter)
        stack.callback(hap.stop)
        token_file = quarantine.write_token(work / "token")
        push = args.storm_path == "push"
        secret = quarantine.read_token(quarantine.write_token(work / "push.secret")) if push else ""
        rport, amport, pport = free_port(), free_port(), free_port()
        url = f"http://127.0.0.1:{rport}"
        common = {"ssh_hostname": "127.0.0.1", "health_host": "127.0.0.1", "lb": "haproxy",
                  "lb_haproxy_sockets": [hap.socket], "lb_drain_timeout": 30, "quarantine_budget": budget,
                  "quarantine_token_file": str(token_file), "quarantine_url": url, "ssh_strict_host_key_checking": "off"}
        data = {h: {**common, "triton_http_port": ports[2 * i], "triton_metrics_port": ports[2 * i + 1],
                    "telemetry_node_exporter_port": ports[2 * i]} for i, h in enumerate(names)}
        inv = work / "storm_inventory.py"
        inv.write_text("fleet = [" + ", ".join(f"({h!r}, {d!r})" for h, d in data.items()) + "]\n")
        cfg = work / "prom"
        res = subprocess.run([str(Path(sys.executable).parent / "tritonfleet"), "prometheus", str(inv), "--out", str(cfg),
                              "--alertmanager", f"127.0.0.1:{amport}", "--quarantine-url", url], cwd=ROOT,
                             capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"[storm] tritonfleet prometheus: {res.stderr}")
        settings_used = {"health scrape and evaluation": "5s (tritonfleet prometheus --health-interval default)",
                         "alertmanager": "group_wait 0s, group_interval 10s (the generated quarantine route)",
                         "receiver rounds": "5 s (quarantine_check_interval), and one a notification",
                         "path": ("direct: each host's fault pushed (fault_push.Pusher, the source polled every "
                                  "0.25 s) beside Prometheus and Alertmanager" if push else
                                  "Prometheus and Alertmanager only"),
                         "haproxy check inter": args.storm_check_inter, "budget": budget,
                         "breaker": "quarantine_breaker_fraction 0.5, quarantine_breaker_window 300 s (defaults)"}
        start([PROMETHEUS, f"--config.file={cfg / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn"], "prometheus")
        start([ALERTMANAGER, f"--config.file={cfg / 'alertmanager.yml'}", f"--storage.path={work / 'am'}",
               f"--web.listen-address=127.0.0.1:{amport}", "--cluster.listen-address=", "--log.level=warn"],
              "alertmanager")
        hosts = [FleetHost(h, [], {**DEFAULTS, **d}) for h, d in data.items()]  # as the inventory loads them
        lines: list[str] = []
        events = stack.enter_context(open(work / "receiver.log", "w"))  # noqa: SIM115 - closed with the stack

        def echo(line: str) -> None:
            lines.append(line)
            events.write(line + "\n")

        def gate(fh, timeout: float) -> tuple[bool, str]:
            ok = _get(f"http://127.0.0.1:{fh.get('triton_http_port')}/v2/health/ready") is not None
            return ok, "ready" if ok else "not ready"

        rec = quarantine.Receiver(hosts, work / "state", alertmanager=f"http://127.0.0.1:{amport}", echo=echo, gate=gate)
        stack.callback(rec.stop.set)
        server = threading.Thread(target=quarantine.serve, daemon=True,
                                  args=(rec, f"127.0.0.1:{rport}",
                                        [quarantine.Caller("operator", quarantine.read_token(token_file))], False,
                                        secret))

        rc = 0
        _until(lambda: _get(f"http://127.0.0.1:{pport}/-/ready"), "prometheus", 60)
        _until(lambda: _get(f"http://127.0.0.1:{amport}/-/ready"), "alertmanager", 60)
        server.start()
        _until(lambda: _get(url + "/-/healthy"), "receiver", 30)
        if push:
            start([sys.executable, __file__, "collectors", json.dumps(names), str(faults), url, secret], "collectors")

        def targets_up() -> bool:
            body = _get(f"http://127.0.0.1:{pport}/api/v1/query?query=count(up%7Bjob%3D~%22.*-health%22%7D%3D%3D1)")
            r = json.loads(body)["data"]["result"] if body else []
            return bool(r) and int(float(r[0]["value"][1])) == n

        _until(targets_up, "every health target scraped", 120, 1)
        _until(lambda: all(quarantine.balancer(fh).state().serving for fh in hosts[:: max(1, n // 10)]),
               "haproxy serving", 60)
        log(f"storm: {n} hosts up behind HAProxy; client load at {args.storm_rate:g} requests/s")
        with Load(hap.url, args.storm_rate) as load:
            time.sleep(5)
            t_fault = time.time()
            for h in names:  # every host's collector sees the fault now
                (faults / h).write_text(f"{t_fault:.3f}")
            log(f"storm: {n} hosts faulted at once")
            _until(lambda: len(rec.alert_at) >= n, f"{n} alerts at the receiver", 120, 0.5)
            time.sleep(args.storm_settle)
            alerted = [t - t_fault for t in rec.alert_at.values()]
            state = rec.snapshot()
            out = dict(state["hosts"])
            opened = [line for line in lines if "CIRCUIT BREAKER OPEN" in line]
            log(f"storm: {len(out)} hosts out, breaker {'open' if opened else 'closed'}")
            back_names = sorted(out)[:recover]
            t_recover = time.time()
            for h in back_names:  # the fault cleared (a GPU reset): no Xid any more
                (faults / h).unlink()
            _until(lambda: not set(back_names) & set(rec.snapshot()["hosts"]), "recovered hosts returned", 180, 0.5)
            t_back = time.time()
            still_open = bool(rec.snapshot().get("breaker"))
            time.sleep(2)
        metrics = rec.latency.text().decode()
    drained = [r["drained_at"] - r["fault_at"] for r in out.values() if r.get("fault_at") and r.get("drained_at")]
    over = n - len(out)
    trip = next((i for i, line in enumerate(lines) if "CIRCUIT BREAKER OPEN" in line), len(lines))
    after_trip = sum(1 for line in lines[trip:] if line.split(" ", 3)[2:3] == ["quarantined:"])
    figures = {"hosts": n, "budget": budget, "drained": len(out), "alert_only": over,
               "fault_to_out_p50": _pct(drained, 0.5), "fault_to_out_p99": _pct(drained, 0.99),
               "fault_to_out_max": max(drained, default=float("nan")),
               "fault_to_alert_p50": _pct(alerted, 0.5), "fault_to_alert_p99": _pct(alerted, 0.99),
               "breaker_opened": bool(opened), "drained_after_the_breaker_opened": after_trip, "breaker_open_while_returning": still_open,
               "recovered": len(back_names), "recovered_back_s": t_back - t_recover,
               "requests_ok": load.ok, "requests_failed": load.failed, "settings": settings_used}
    results.meta["storm"] = figures
    (work / "metrics.txt").write_text(metrics)
    results.add(Row("storm: fault -> out of rotation, hosts within the budget", drained, target="p99 <= 5 s",
                    met=figures["fault_to_out_p99"] <= 5,
                    note=f"{len(drained)} hosts; p50 {figures['fault_to_out_p50']:.2f} s, "
                         f"p99 {figures['fault_to_out_p99']:.2f} s"))
    results.add(Row("storm: fault -> alert at the receiver, every host", alerted,
                    note=f"{len(alerted)} alerts; p50 {figures['fault_to_alert_p50']:.2f} s, "
                         f"p99 {figures['fault_to_alert_p99']:.2f} s"))
    results.add(Row("storm: hosts alerted only (budget, breaker)", [float(over)], unit="hosts"))
    results.add(Row("storm: breaker opened, still open as recovered hosts returned",
                    [float(bool(opened) and still_open)], unit="yes", target="1", met=bool(opened) and still_open))
    results.add(Row("storm: hosts taken out after the breaker opened", [float(after_trip)], unit="hosts", target="0",
                    met=after_trip == 0))
    results.add(Row("storm: recovered hosts back in service (Xid cleared -> serving)", [t_back - t_recover],
                    note=f"{len(back_names)} hosts"))
    results.add(Row("storm: failed client requests", [float(load.failed)], unit="requests", target="0",
                    met=load.failed == 0, note=f"of {load.ok + load.failed}"))
    print(json.dumps(figures, indent=1))
    log(f"storm: work files (receiver log, metrics, configs) in {work}")
    if load.failed:
        log(f"storm: failed requests, first: {load.errors[:3]}")
    return rc


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "backends":
    asyncio.run(_backends(int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])))
if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "collectors":
    _collectors(json.loads(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5])
