"""A model that fails while Triton stays ready, behind Debian's HAProxy 2.6 with the backend lines
docs/operations.md recommends (``haproxy_config.TRAFFIC_LINES``): two real tritonservers on
loopback, a client sending 20 inferences a second through HAProxy while one server's model fails
(the stand-in backend's switch: HTTP 500, as Triton answers an internal error). With the lines, at
most 2 client requests fail (HAProxy sends the 500s again, to the other server); without them,
about every other request fails until something else takes the server out; a request too big to
be sent again is limited by the observe line to 2 failures a flap. HAProxy's mark-down is not a drain or a hold: tritonfleet reads it as a server down by its
checks, and the quarantine's hold still puts it in maintenance."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time

import pytest
import requests

from tests.support.haproxy import HAProxy
from tests.support.tritonproc import copy_repository, local_server
from tests.testbed.test_drain import BODY, RATE, Client
from tests.unit.serving.test_haproxy_config import DOC, block
from tritonfleet.serving import drain

MODEL = "text_classifier_onnx"
FAILING_S = 6.0  # seconds the model fails, client running


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two tritonservers, each with its own fault directory (the switch of one is not the other's)."""
    work = tmp_path_factory.mktemp("retry")
    mp = pytest.MonkeyPatch()
    with contextlib.ExitStack() as stack:
        out = []
        for name in ("a", "b"):
            (work / name).mkdir()
            faults = work / name / "faults"
            faults.mkdir()
            mp.setenv("TRITONFLEET_TESTBED_FAULT_DIR", str(faults))
            repo = copy_repository(work / name / "repo", kind_cpu=True)
            srv = stack.enter_context(local_server(repo, work / name))
            out.append((name, srv, faults / MODEL))
        mp.undo()
        yield out


def run(tmp_path, servers, recommended: bool) -> tuple[Client, list[str], dict]:
    """The client through HAProxy while server a's model fails; (the client, a's states seen, a's
    `show stat` row)."""
    (_, a, switch), (_, b, _) = servers
    seen: list[str] = []
    with HAProxy(tmp_path, [("a", f"127.0.0.1:{a.http_port}"), ("b", f"127.0.0.1:{b.http_port}")],
                 inter="500ms", recommended=recommended) as hap:
        lb = drain.HAProxy([hap.socket], "triton", "a")
        for name in ("a", "b"):
            drain.HAProxy([hap.socket], "triton", name).wait_serving(30)
        with Client(hap.url) as client:
            time.sleep(1)
            switch.touch()
            try:
                t_end = time.monotonic() + FAILING_S
                while time.monotonic() < t_end:
                    st = lb.state()
                    seen.append(st.status)
                    assert not st.maintenance and not st.drained, st  # HAProxy's own mark-down is neither
                    time.sleep(0.1)
            finally:
                switch.unlink()
        row = next(r for r in drain.parse_stat(hap.command("show stat")) if r.get("svname") == "a")
    return client, seen, row


def test_a_failing_model_costs_at_most_2_requests_with_the_recommended_backend(tmp_path, servers):
    client, seen, row = run(tmp_path, servers, recommended=True)
    print(f"\nrecommended backend: {len(client.failed)} of {client.sent} failed, a's requests sent again "
          f"{row['wredis']}, a's states {sorted(set(seen))}")
    assert client.sent >= RATE * FAILING_S * 0.8, client.sent
    assert len(client.failed) <= 2, (len(client.failed), client.sent, client.failed[:5])
    # HAProxy sent a's failures again to b (retried, redispatched): counted on a, never answered
    assert int(row["wredis"]) >= 10, row


def test_without_the_recommended_lines_the_failing_server_costs_many_requests(tmp_path, servers):
    client, seen, row = run(tmp_path, servers, recommended=False)
    print(f"\nplain backend: {len(client.failed)} of {client.sent} failed")
    assert len(client.failed) >= 10, (len(client.failed), client.sent)
    assert all("HTTP 500" in f for f in client.failed), client.failed[:3]
    assert all(s.startswith("UP") for s in seen), seen  # its check (ready) never sees the failure
    assert int(row["wredis"]) == 0 and int(row["hrsp_5xx"]) == len(client.failed), row


def test_a_body_too_big_to_send_again_costs_2_requests_a_flap(tmp_path, servers):
    """A request over HAProxy's buffer (tune.bufsize, 16384 bytes by default: configuration.txt) is
    never sent again; for it the observe line is what limits the failures: 2 errors in a row mark
    the server down until its check passes ``rise`` times (2 failures per flap, and 1 more when the
    loop ends inside a flap)."""
    (_, a, switch), (_, b, _) = servers
    big = json.dumps(BODY) + " " * 20000  # JSON whitespace: the same inference, over the buffer
    codes: list[int] = []
    with HAProxy(tmp_path, [("a", f"127.0.0.1:{a.http_port}"), ("b", f"127.0.0.1:{b.http_port}")],
                 inter="500ms", recommended=True) as hap:
        for name in ("a", "b"):
            drain.HAProxy([hap.socket], "triton", name).wait_serving(30)
        url = f"{hap.url}/v2/models/{MODEL}/infer"
        lb = drain.HAProxy([hap.socket], "triton", "a", hold=True)  # as the quarantine holds it
        down: list[drain.ServerState] = []
        switch.touch()
        try:
            t_end = time.monotonic() + FAILING_S
            while time.monotonic() < t_end:
                codes.append(requests.post(url, data=big, headers={"Content-Type": "application/json"},
                                           timeout=30).status_code)
                st = lb.state()
                if st.status.startswith("DOWN") and not down:
                    down.append(st)
                    # the quarantine's hold (maintenance) and its end work on a server HAProxy marked down
                    assert lb.hold() == "haproxy triton/a held in maintenance" and lb.state().maintenance
                    assert lb.ready() == "haproxy triton/a set to ready"
                time.sleep(1 / RATE)
        finally:
            switch.unlink()
    flaps = (tmp_path / "haproxy.log").read_text().count("Server triton/a is DOWN, reason: Health analyze")
    failed = codes.count(500)
    print(f"\nbody over the buffer: {failed} of {len(codes)} failed, {flaps} mark-down(s)")
    assert set(codes) <= {200, 500}, codes
    # HAProxy's own mark-down: down by its checks, neither a drain nor a hold, not serving
    assert down and not down[0].maintenance and not down[0].drained and not down[0].serving, down
    # each mark-down took 2 failures; the loop may end after the first failure of the next flap,
    # which HAProxy had no second error to mark down on yet (seen: 15 failed, 7 mark-downs)
    assert flaps >= 1 and failed <= 2 * flaps + 1, (failed, flaps, len(codes))
    assert failed < len(codes) / 4, (failed, len(codes))  # without the line: about every other one


def test_the_docs_backend_is_valid_for_debians_haproxy(tmp_path):
    """What operators copy from docs/operations.md parses in HAProxy 2.6 (``haproxy -c``)."""
    text = "\n".join(block(DOC.read_text())).replace("/run/haproxy/admin.sock", str(tmp_path / "admin.sock"))
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text + "\n")
    exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
    res = subprocess.run([exe, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING" not in res.stdout + res.stderr, res.stdout + res.stderr
