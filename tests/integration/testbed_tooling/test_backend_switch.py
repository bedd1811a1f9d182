"""The stand-in onnxruntime backend's fault switch (tritonfleet_testbed/backend_onnxruntime/model.py)
under contention, against the real tritonserver: while the switch is on, every request of the
model fails with the switch's message, Triton counts them as failed requests, the server keeps
running and serves again once the switch is off.

Why it is tested this way: the switch used to return a batch of error responses from
``execute()``; with requests arriving from several clients at once and the CPUs busy, the Python
backend's library then crashed tritonserver (signal 11 in ``TRITONBACKEND_ModelInstanceExecute``)
within a second of the switch (3 runs of 3 of this test with the old switch), so a testbed host's Triton
restarted in the middle of the GPU health tests (the switch, in the container's /tmp, gone with it).
The switch now raises, which is also how a failed run is reported to Triton."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.tritonproc import copy_repository, local_server
from tests.testbed.test_drain import BODY

MODEL = "text_classifier_onnx"
CLIENTS = 8          # closed-loop clients, each one request at a time
BURNERS = 4          # busy processes, so the server's threads are preempted at any point
WINDOW_S = 4.0       # seconds the switch is on
MAX_REQUESTS = 4000  # per client: the bound on the load, whatever the speed


def _burn(until: float) -> None:
    while time.monotonic() < until:
        pass


def _post(port: int) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer",
                                 data=json.dumps(BODY).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _failures(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if fam.name == "nv_inference_request_failure" and s.labels.get("model") == MODEL)


@pytest.fixture
def server(tmp_path, monkeypatch):
    faults = tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv("TRITONFLEET_TESTBED_FAULT_DIR", str(faults))
    with local_server(copy_repository(tmp_path / "repo", kind_cpu=True), tmp_path) as srv:
        yield srv, faults / MODEL


def test_the_switch_fails_every_request_and_the_server_survives_contention(server):
    srv, switch = server
    assert _post(srv.http_port) == (200, "")
    before = _failures(srv.metrics_port)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client():
        for _ in range(MAX_REQUESTS):
            if stop.is_set():
                return
            try:
                got = _post(srv.http_port)
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:  # the server is gone
                got = (0, str(e))
            with lock:
                results.append(got)

    until = time.monotonic() + WINDOW_S + 2
    burners = [multiprocessing.Process(target=_burn, args=(until,)) for _ in range(BURNERS)]
    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    switch.touch()
    try:
        for p in burners:
            p.start()
        for t in threads:
            t.start()
        time.sleep(WINDOW_S)
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        for p in burners:
            p.join(30)
        switch.unlink()
    assert srv.proc.poll() is None, f"tritonserver exited ({srv.proc.returncode}):\n{srv.log()[-3000:]}"
    assert len(results) >= CLIENTS, len(results)
    wrong = [r for r in results if r[0] != 500 or "switched to fail" not in r[1]]
    assert not wrong, (len(wrong), wrong[:3])
    assert _failures(srv.metrics_port) - before >= len(results)
    assert _post(srv.http_port) == (200, "")  # switch off: it serves again
