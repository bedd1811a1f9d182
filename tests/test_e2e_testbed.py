"""End to end on real local hosts: testbed up -> full deploy from bare over real SSH ->
health gate -> inference -> metrics -> a second run changes nothing -> testbed down is clean.

Needs root on Debian 12 (systemd-nspawn, network namespaces); .ci/run provides both.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tritonfleet import ROOT
from tritonfleet.testbed import hosts

pytestmark = pytest.mark.testbed

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
TIMINGS: dict[str, float] = {}


def pyinfra(deploy: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    res = subprocess.run(
        [PYINFRA, "-y", "--json", *extra, "inventories/testbed.py", deploy],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=1500,
    )
    try:
        data = json.loads(res.stdout)
    except ValueError:
        data = {}
    return res, data


def changed_ops(data: dict) -> list[str]:
    ops = data.get("results", {}).get("operations", [])
    return [o["name"] for o in ops if o.get("success") and "check:" not in o["name"].split("|")[-1][:8]]


@pytest.fixture(scope="module")
def testbed():
    from tritonfleet.testbed.cli import bring_up

    hosts.down()  # from bare: no host left from an earlier run
    t0 = time.monotonic()
    state = bring_up(2)
    TIMINGS["testbed up (2 hosts)"] = time.monotonic() - t0
    yield state
    t0 = time.monotonic()
    hosts.down()
    TIMINGS["testbed down"] = time.monotonic() - t0
    print("\nend-to-end timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in TIMINGS.items()))


def _infer_resnet(address: str) -> np.ndarray:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=f"{address}:8000")
    data = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    inp = httpclient.InferInput("input", data.shape, "FP32")
    inp.set_data_from_numpy(data)
    res = client.infer("resnet50_onnx", [inp], outputs=[httpclient.InferRequestedOutput("output")])
    return res.as_numpy("output")


def _success_count(address: str, model: str) -> float:
    text = requests.get(f"http://{address}:8002/metrics", timeout=5).text
    total = 0.0
    for m in re.finditer(r'^nv_inference_request_success\{([^}]*)\}\s+([0-9.e+]+)$', text, re.M):
        if f'model="{model}"' in m.group(1):
            total += float(m.group(2))
    return total


def test_bare_to_serving_and_idempotent(testbed):
    t0 = time.monotonic()
    res, data = pyinfra("deploys/triton.py")
    TIMINGS["deploy from bare"] = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-6000:]
    assert data.get("results", {}).get("failed_hosts") == [], res.stderr[-4000:]
    # the checks ran on both hosts and printed the verification table
    assert res.stderr.count("GPU check") >= 4, res.stderr[-3000:]
    assert "Tesla T4" in res.stderr and "NVIDIA L4" in res.stderr

    for h in testbed.hosts:
        out = _infer_resnet(h.address)
        assert out.shape == (1, 1000)
        assert _success_count(h.address, "resnet50_onnx") >= 1

    t0 = time.monotonic()
    res2, data2 = pyinfra("deploys/triton.py")
    TIMINGS["re-run (no change)"] = time.monotonic() - t0
    assert res2.returncode == 0, res2.stderr[-4000:]
    assert changed_ops(data2) == [], changed_ops(data2)


def ssh(h, command: str) -> str:
    key = hosts.ssh_key()
    res = subprocess.run(
        ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"root@{h.address}", command],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_model_update_moves_only_changed_files(testbed, tmp_path):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "files" / "model_repository", repo)
    cfg = repo / "text_classifier_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_queue_delay_microseconds: 2000",
                                           "max_queue_delay_microseconds: 1000"))
    (repo / "resnet50_onnx" / "labels.txt").write_text("tench\ngoldfish\n")
    h = testbed.hosts[0]
    before = ssh(h, "readlink /opt/triton/model_repository").strip()
    res, data = pyinfra("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}")
    assert res.returncode == 0, res.stderr[-4000:]
    sent = [o["name"] for o in data["results"]["operations"] if o["name"].startswith("Model repository | model file")]
    assert sorted(sent) == ["Model repository | model file resnet50_onnx/labels.txt",
                            "Model repository | model file text_classifier_onnx/config.pbtxt"], sent
    after = ssh(h, "readlink /opt/triton/model_repository").strip()
    assert after != before
    # the new release shares the unchanged model file with the previous one (hard link)
    inode = ssh(h, f"stat -c %i /opt/triton/{before}/resnet50_onnx/1/model.onnx "
                   f"/opt/triton/{after}/resnet50_onnx/1/model.onnx").split()
    assert inode[0] == inode[1]
    # the previous release is kept for rollback; a file removed locally is gone remotely
    (repo / "resnet50_onnx" / "labels.txt").unlink()
    res, _ = pyinfra("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}")
    assert res.returncode == 0, res.stderr[-4000:]
    latest = ssh(h, "readlink /opt/triton/model_repository").strip()
    assert ssh(h, f"test -e /opt/triton/{latest}/resnet50_onnx/labels.txt || echo gone").strip() == "gone"
    assert ssh(h, f"test -d /opt/triton/{before} && echo kept").strip() == "kept"
    served = requests.get(f"http://{h.address}:8000/v2/models/text_classifier_onnx/config", timeout=5).json()
    assert served["dynamic_batching"]["max_queue_delay_microseconds"] == 1000


def test_down_leaves_nothing(testbed):
    # runs last in this module: tear down here and check what is left
    hosts.down()
    assert not list(Path("/run/netns").glob(f"{hosts.NETNS_PREFIX}*")) if Path("/run/netns").exists() else True
    assert not Path(f"/sys/class/net/{hosts.BRIDGE}").exists()
    nft = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert hosts.NFT_TABLE not in nft
    mounts = Path("/proc/mounts").read_text()
    assert str(hosts.STATE_DIR / "hosts") not in mounts
    assert not hosts.CGROUP_ROOT.exists()
