"""The direct path with real components: the GPU fault collector run as its unit runs it (the file
as a script, a kernel-message file as its source, ``--push-*`` as the telemetry step renders them)
pushes a critical Xid to ``tritonfleet quarantine serve``'s API, which takes the host out of a
real HAProxy; each host's token is good for itself only, and no other credential is taken there."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.integration.fleet.test_quarantine import Rig, triton, until  # noqa: F401 - triton: the fixture
from tritonfleet.gpu import fault_push
from tritonfleet.gpu.telemetry import boot_time

SECRET = "push-secret-of-the-rig"


@pytest.fixture
def push_rig(tmp_path, triton):  # noqa: F811 - the imported fixture, by its name
    srv, repo, _ = triton
    r = Rig(tmp_path, srv, repo, push_secret=SECRET)
    try:
        yield r
    finally:
        r.close()


def post(url: str, host: str, token: str, body: dict) -> int:
    req = urllib.request.Request(fault_push.fault_url(url, host), data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_collector_pushes_a_critical_xid_and_the_host_is_out_at_once(push_rig, tmp_path):
    token_file = tmp_path / "h2.token"
    token_file.write_text(fault_push.host_token(SECRET, "h2") + "\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    collector = subprocess.Popen(
        [sys.executable, fault_push.__file__.replace("fault_push.py", "telemetry.py"), f"--textfile-dir={textfiles}",
         "--nvidia-smi=false", f"--kmsg={kmsg}", "--interval=5", f"--push-url={push_rig.url}", "--push-host=h2",
         f"--push-token-file={token_file}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        until(lambda: (textfiles / "tritonfleet-gpu.prom").exists(), "the collector running")
        usec = int((time.time() - boot_time()) * 1e6)
        t0 = time.monotonic()
        with open(kmsg, "a") as f:
            f.write(f"3,1,{usec},-;NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=tritonserver, "
                    "GPU has fallen off the bus.\n")
        until(lambda: push_rig.drained() == ["h2"], "h2 out of HAProxy by the pushed fault", timeout=20)
        took = time.monotonic() - t0
        [ev] = push_rig.events("quarantined")
        assert ev["host"] == "h2" and "pushed by the host's collector" in ev["text"], ev
        assert took < 20  # not a timing goal: the bench measures it (docs/operations.md)
    finally:
        collector.terminate()
        out = collector.communicate(timeout=10)[0].decode()
    assert "not pushed" not in out, out


def test_a_hosts_token_is_good_for_itself_only(push_rig):
    body = {"xid": 79, "pci": "0000:3b:00", "action": "RESTART_BM", "seen": time.time(), "text": "x"}
    assert post(push_rig.url, "h3", fault_push.host_token(SECRET, "h1"), body) == 401  # another host's
    assert post(push_rig.url, "h3", push_rig.token, body) == 401  # the operators' token does not push
    assert post(push_rig.url, "nowhere", fault_push.host_token(SECRET, "nowhere"), body) == 401  # not in the inventory
    assert post(push_rig.url, "h3", fault_push.host_token(SECRET, "h3"), {**body, "xid": "79"}) == 400
    h1 = fault_push.host_token(SECRET, "h1")
    req = urllib.request.Request(push_rig.url + "/v1/hosts/h1/release", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {h1}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401  # a host's token does nothing but push its faults
    time.sleep(1)
    assert push_rig.drained() == []
