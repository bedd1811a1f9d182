"""Drain behind a real load balancer on the testbed: Debian's HAProxy on this machine's loopback in
front of the three deployed hosts, a client sending inferences through it at a steady rate, and a
`tritonfleet rollout` that restarts Triton on every host (a unit change in `none` model-control
mode). With the drain: zero failed requests. The same rollout back without the drain: failed
requests (the figures are in docs/operations.md). And a drain that cannot read Triton's requests in
flight (its metrics port refused on the host) does not restart the host: zero failed requests, the
host back in HAProxy, the report saying why."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.support.haproxy import HAProxy
from tests.support.testbed import ROOT, container_started, pyinfra, tritonfleet

INV = "inventories/testbed.py"
RATE = 20            # requests a second, steady
MAX_SECONDS = 900    # the client never runs longer than this
BODY = {"inputs": [{"name": n, "shape": [1, 128], "datatype": "INT64", "data": [1] * 128}
                   for n in ("input_ids", "attention_mask")]}


class Client:
    """Sends one inference every 1/RATE s through the load balancer (a pool keeps the rate while
    some requests wait), until stopped or MAX_SECONDS."""

    def __init__(self, url: str):
        self.url = f"{url}/v2/models/text_classifier_onnx/infer"
        self.stop = threading.Event()
        self.sent = 0
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run)
        self.seconds = 0.0

    def _one(self):
        try:
            r = requests.post(self.url, json=BODY, timeout=30)
            bad = "" if r.status_code == 200 else f"HTTP {r.status_code} {r.text[:120]}"
        except requests.RequestException as e:
            bad = f"{type(e).__name__}: {str(e)[:120]}"
        with self.lock:
            self.sent += 1
            if bad:
                self.failed.append(f"{time.strftime('%H:%M:%S')} {bad}")

    def _run(self):
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            i = 0
            while not self.stop.is_set() and time.monotonic() - t0 < MAX_SECONDS:
                pool.submit(self._one)
                i += 1
                time.sleep(max(0.0, t0 + i / RATE - time.monotonic()))
        self.seconds = time.monotonic() - t0

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def rollout(*args: str) -> tuple[int, dict, str]:
    res = tritonfleet("rollout", INV, "deploys/models.py", "--batch", "1", *args, "--json")
    try:
        return res.returncode, json.loads(res.stdout), res.stderr
    except ValueError:
        return res.returncode, {}, res.stdout + res.stderr


def test_rollout_restarting_every_host_behind_haproxy_fails_no_request(deployed, tmp_path):
    testbed, _, _ = deployed
    hosts = testbed.hosts
    with HAProxy(tmp_path, [(h.name, f"{h.address}:8000") for h in hosts]) as hap:
        from tritonfleet.serving.drain import HAProxy as Runtime

        for h in hosts:
            Runtime([hap.socket], "triton", h.name).wait_serving(30)
        lb = ("--data", "lb=haproxy", "--data", f"lb_haproxy_sockets={json.dumps([hap.socket])}")
        started = {h.name: container_started(h) for h in hosts}
        # 1. with the drain: a unit change (another stop timeout) restarts Triton on every host
        with Client(hap.url) as drained:
            time.sleep(3)
            rc, report, err = rollout(*lb, "--data", "triton_stop_timeout=25")
            time.sleep(3)
        assert rc == 0, (report.get("halted"), err[-3000:])
        assert [h["result"] for h in report["hosts"]] == ["updated"] * len(hosts)
        restarted = {h.name: container_started(h) for h in hosts}
        assert all(restarted[n] != started[n] for n in started), "every host's Triton restarted"
        for h in hosts:  # every server back in, serving
            assert Runtime([hap.socket], "triton", h.name).state().serving
        # 2. the same rollout back to the default unit without the drain
        with Client(hap.url) as plain:
            time.sleep(3)
            rc2, report2, err2 = rollout()
            time.sleep(3)
        assert rc2 == 0, (report2.get("halted"), err2[-3000:])
        assert all(container_started(h) != restarted[h.name] for h in hosts)
    figures = {"rate": RATE, "drain": {"sent": drained.sent, "failed": len(drained.failed),
                                       "seconds": round(drained.seconds, 1), "rollout_s": round(report["seconds"], 1)},
               "no_drain": {"sent": plain.sent, "failed": len(plain.failed), "seconds": round(plain.seconds, 1),
                            "rollout_s": round(report2["seconds"], 1), "first": plain.failed[:3]}}
    print("\ndrain figures: " + json.dumps(figures))
    assert drained.sent >= RATE * 30 and drained.failed == [], (drained.sent, drained.failed[:5])
    # the client does see a restart that is not drained: what the drain prevents
    assert plain.failed, f"no failed request without the drain either ({plain.sent} sent)"


METRICS_BLOCK = "tritonfleet_test_metrics"


def refuse_metrics(h, port: int = 8002) -> None:
    """Connections on the host to its own Triton metrics port are refused (a reset), before
    Docker's address translation sees them: what a wrong port or a dead exporter looks like to the
    drain's read. HAProxy's checks and Triton's other ports are untouched."""
    rules = (f"table inet {METRICS_BLOCK} {{\n chain output {{\n  type filter hook output priority -300; "
             f"policy accept;\n  ip daddr 127.0.0.1 tcp dport {port} reject with tcp reset\n }}\n}}\n")
    subprocess.run(["ip", "netns", "exec", h.netns, "nft", "-f", "-"], input=rules, text=True, check=True)


def allow_metrics(h) -> None:
    subprocess.run(["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", METRICS_BLOCK],
                   check=False, capture_output=True)


def test_a_drain_that_cannot_read_tritons_metrics_restarts_nothing_behind_haproxy(deployed, tmp_path):
    testbed, _, _ = deployed
    hosts = testbed.hosts
    target = hosts[0]
    with HAProxy(tmp_path, [(h.name, f"{h.address}:8000") for h in hosts]) as hap:
        from tritonfleet.serving.drain import HAProxy as Runtime

        for h in hosts:
            Runtime([hap.socket], "triton", h.name).wait_serving(30)
        hook = f'{sys.executable} {ROOT / "tests" / "support" / "haproxy.py"} {hap.socket} "set server triton/$TRITONFLEET_HOST state'
        lb = ("--data", "lb=hooks", "--data", f'lb_drain_command={hook} drain"',
              "--data", f'lb_ready_command={hook} ready"', "--data", "lb_drain_timeout=8")
        started = container_started(target)
        refuse_metrics(target)
        try:
            with Client(hap.url) as client:
                time.sleep(2)
                # a unit change (another stop timeout): a restart, drained first
                t0 = time.monotonic()
                res, data = pyinfra("deploys/models.py", "--limit", target.name, *lb, "--data", "triton_stop_timeout=25")
                took = time.monotonic() - t0
                time.sleep(2)
        finally:
            allow_metrics(target)
        out = res.stderr
        # the only host failed: pyinfra ends with "No hosts remaining" and gives no JSON
        assert res.returncode != 0 and f"{target.name} failed at load balancer drain" in out, out[-4000:]
        assert "the requests in flight cannot be read" in out and "counts as busy" in out, out[-4000:]
        assert "could not be read for 8s (lb_drain_timeout)" in out and "while triton.service is active" in out
        assert "Triton was not restarted and serves as before" in out
        assert container_started(target) == started, "the host was restarted"
        assert Runtime([hap.socket], "triton", target.name).state().serving  # put back by the ready hook
        print(f"\nunreadable-metrics drain: {client.sent} requests in {client.seconds:.1f}s, "
              f"{len(client.failed)} failed; the deploy took {took:.1f}s")
        assert client.sent >= 20 and client.failed == [], (client.sent, client.failed[:5])
    # as found: the default unit (the failed run left the new one on disk, not running)
    res, data = pyinfra("deploys/models.py", "--limit", target.name)
    assert res.returncode == 0 and data.get("results", {}).get("failed_hosts") == [], res.stderr[-3000:]
