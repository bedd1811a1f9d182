"""`bench/run.py scale`'s pull-mode rows: the control machine's cost of a pull-mode rollout
(`tritonfleet pull rollout`) at fleet sizes no test machine hosts, against fake self-converging
hosts.

The origin is a directory served by a real nginx on loopback (tritonfleet_testbed.origin_server:
GET for everything, PUT for reports/). The fake hosts are one process (``agents``, asyncio, one
keep-alive HTTP connection a host) doing what `tritonfleet converge` does on the wire: a
conditional GET of its pointer every ``--poll`` seconds (jittered), and when the pointer names a
new generation, a "run" of ``--run`` seconds and a PUT of its report (the release it names,
result ok), signed with the host's own report key (ssh-keygen, as the agent does). They do not
verify pointer signatures or run a deploy: what is measured is the control side (which verifies
each report that changed).

Measured, as a new process like an operator runs it: `tritonfleet pull rollout` (canary 1, batches
of 25%) of the repository's deploys/ and files/ with every host's inventory data (the fake
fleet's recorded host's, bench/fakefleet.json), from a release all hosts already report: wall
time, CPU (its own and its children's, ssh-keygen signing included; from wait4), peak memory; the
fake hosts' and nginx's CPU beside it (not the control machine's in a real fleet: the origin can
be any web server, the hosts are the hosts).

    python bench/pull_scale.py run --hosts 2000      # one row (JSON on stdout)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / ".work" / "pull"
BIN = Path(sys.executable).parent
BEFORE = "be" * 32  # the release every fake host runs before the measured rollout
sys.path[:0] = [str(ROOT), str(BENCH)]


def write_inventory(path: Path, n: int) -> None:
    """``n`` hosts with the recorded host's data (as bench/fake_inventory.py gives the push fake
    fleet), in its GPU group."""
    import fakefleet

    answers = fakefleet.Answers.load()
    data = fakefleet.replayable(answers.meta.get("data", {}))
    group = answers.meta.get("group", "t4")
    path.write_text("import json\n"
                    f"_data = json.loads({json.dumps(json.dumps(data))})\n"
                    f"{group} = [(f'pull-{{i:04d}}', dict(_data)) for i in range(1, {n + 1})]\n")


# --- the fake hosts -------------------------------------------------------------------------------

async def _signed(host: str, keys: Path, report: dict) -> bytes:
    """The report as a host PUTs it: its payload signed with the host's report key."""
    payload = json.dumps(report, sort_keys=True)
    msg = keys / f"{host}.msg"
    msg.write_text(payload)
    proc = await asyncio.create_subprocess_exec("ssh-keygen", "-q", "-Y", "sign", "-f", str(keys / host), "-n",
                                                "tritonfleet-report", str(msg), stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    await proc.wait()
    sig = Path(f"{msg}.sig")
    signature = sig.read_text()
    sig.unlink()
    return json.dumps({"payload": payload, "signature": signature}).encode()


async def _agent(host: str, port: int, poll: float, run: float, stop: asyncio.Event, stats: dict,
                 keys: Path) -> None:
    reader = writer = None
    etag, gen = "", 0
    rnd = random.Random(host)
    await asyncio.sleep(rnd.uniform(0, poll))
    while not stop.is_set():
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            status, headers, body = await _request(reader, writer, "GET", f"/desired/{host}.json",
                                                   {"If-None-Match": etag} if etag else {})
            stats["gets"] += 1
            if status == 200:
                etag = headers.get("etag", "")
                payload = json.loads(json.loads(body)["payload"])
                if payload["generation"] > gen:
                    gen = payload["generation"]
                    await asyncio.sleep(run)  # the deploy
                    report = await _signed(host, keys, {
                        "format": 1, "host": host, "release": payload["release"], "generation": gen, "result": "ok",
                        "error": "", "changed": 1, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                    status, _, _ = await _request(reader, writer, "PUT", f"/reports/{host}.json", {}, report)
                    stats["puts"] += 1
                    if status not in (201, 204):
                        stats["errors"] += 1
        except (OSError, ValueError, KeyError, asyncio.IncompleteReadError):
            stats["errors"] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
        await asyncio.sleep(poll * rnd.uniform(0.8, 1.2))


async def _request(reader, writer, method: str, path: str, headers: dict, body: bytes = b"") -> tuple[int, dict, bytes]:
    head = [f"{method} {path} HTTP/1.1", "Host: origin", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    status_line = await reader.readuntil(b"\r\n")
    status = int(status_line.split()[1])
    hdrs = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        k, _, v = line.decode().partition(":")
        hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", 0))
    data = await reader.readexactly(n) if n else b""
    return status, hdrs, data


def agents(hosts: list[str], port: int, poll: float, run: float, keys: Path) -> int:
    """Serve as the fake hosts until SIGTERM; prints 'ready', then its counts at the end."""
    from tritonfleet.core.open_files import raise_nofile

    raise_nofile()

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        stats = {"gets": 0, "puts": 0, "errors": 0}
        tasks = [asyncio.create_task(_agent(h, port, poll, run, stop, stats, keys)) for h in hosts]
        print("ready", flush=True)
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        print(json.dumps(stats), flush=True)

    asyncio.run(main())
    return 0


# --- one measurement ----------------------------------------------------------------------------

def run(n: int, poll: float = 2.0, run_s: float = 1.0) -> dict:
    import scale

    from tritonfleet.fleet.pull.origin import REPORT_NAMESPACE, PullSite, write_atomic
    from tritonfleet.fleet.pull.signing import enrol, make_key, publish_desired, sign
    from tritonfleet_testbed.origin_server import OriginServer

    work = WORK / str(n)
    subprocess.run(["rm", "-rf", str(work)], check=True)
    (work / "origin").mkdir(parents=True)
    inv = work / "inventory.py"
    write_inventory(inv, n)
    key = work / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    names = [f"pull-{i:04d}" for i in range(1, n + 1)]
    origin = PullSite(work / "origin")
    # before the rollout: every host has its report key (enrolled), runs release BEFORE and has
    # reported it (not measured)
    keys = work / "host-keys"
    enrol(origin, {h: make_key(keys / h, f"report {h}") for h in names})
    publish_desired(origin, key, dict.fromkeys(names, BEFORE), "bench-setup")
    for h in names:
        payload = json.dumps({"host": h, "release": BEFORE, "generation": 1, "result": "ok"}, sort_keys=True)
        sig = sign(keys / h, {"r": payload.encode()}, namespace=REPORT_NAMESPACE)["r"]
        write_atomic(origin.report(h), json.dumps({"payload": payload, "signature": sig}).encode())
    srv = OriginServer(origin.root, work / "nginx", workers=1, access_log=False)
    fake = subprocess.Popen([sys.executable, __file__, "agents", "--port", str(srv.port), "--poll", str(poll),
                             "--run", str(run_s), "--keys", str(keys), *names], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        assert "ready" in fake.stdout.readline()
        time.sleep(poll * 1.5)  # every fake host has its pointer's ETag
        nginx0, fake0 = srv.cpu_seconds(), _cpu(fake.pid)
        env = dict(os.environ, TRITONFLEET_LOG_DIR=str(work / "rollouts"))
        r = scale.measured([str(BIN / "tritonfleet"), "pull", "rollout", str(inv), "deploys/triton.py",
                            "--origin", str(origin.root), "--sign-key", str(key), "--canary", "1", "--batch", "25%",
                            "--timeout", "300", "--json"], env)
        nginx_cpu, fake_cpu = srv.cpu_seconds() - nginx0, _cpu(fake.pid) - fake0
    finally:
        fake.send_signal(signal.SIGTERM)
        out = fake.communicate(timeout=60)[0]
        srv.stop()
    stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    try:
        report = json.loads((scale.WORK / "scale-out.txt").read_text())
        ok = report["ok"] and all(h["result"] == "updated" for h in report["hosts"])
        batches = len(report["batches"])
    except (ValueError, KeyError):
        ok, batches = False, 0
    return {"what": "pull rollout", "hosts": n, "wall": r["wall"], "cpu": r["cpu"], "fake_cpu": fake_cpu,
            "origin_cpu": nginx_cpu, "rss_mb": r["rss_mb"], "tree_mb": r["tree_mb"], "procs": r["procs"],
            "commands_per_host": 0, "http_per_host": round((stats.get("gets", 0) + stats.get("puts", 0)) / n, 1),
            "batches": batches, "ok": ok and r["rc"] == 0 and not stats.get("errors"),
            "error": "" if ok and r["rc"] == 0 else f"exit {r['rc']}: {r['stderr'][-1500:]}",
            "agent_errors": stats.get("errors", 0)}


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("agents")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--poll", type=float, default=2.0)
    a.add_argument("--run", type=float, default=1.0)
    a.add_argument("--keys", type=Path, required=True, help="the hosts' report keys (<dir>/<host>)")
    a.add_argument("hosts", nargs="+")
    r = sub.add_parser("run")
    r.add_argument("--hosts", type=int, default=2000)
    args = ap.parse_args(argv)
    if args.what == "agents":
        return agents(args.hosts, args.port, args.poll, args.run, args.keys)
    row = run(args.hosts)
    print(json.dumps(row, indent=1))
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
