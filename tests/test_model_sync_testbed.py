"""Model sync and connection tuning over real SSH on the testbed: OpenSSH and pyinfra's own
connection as transports, changed/added/removed/renamed files, files changed on the host, an
interrupted transfer while Triton serves, TCP_NODELAY on the deploy's and the fleet commands'
connections. (The same logic on this machine alone: test_release_sync.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import shutil
import socket
import subprocess

import pytest
from testbed_util import (
    INVENTORY,
    PYINFRA,
    changed_ops,
    env,
    infer_resnet,
    live_release,
    pyinfra,
    ssh,
)

from tritonfleet import FILES, ROOT, models

pytestmark = pytest.mark.testbed

SCRATCH = "/opt/tritonfleet-sync-test"  # a release tree next to the served one, never served


def run(deploy: str, *extra: str, path_first: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    e = env()
    if path_first:
        e["PATH"] = f"{path_first}:{e['PATH']}"
    res = subprocess.run([PYINFRA, "-y", "--json", *extra, INVENTORY, deploy], cwd=ROOT,
                         capture_output=True, text=True, env=e, timeout=900)
    try:
        data = json.loads(res.stdout)
    except ValueError:
        data = {}
    return res, data


def overrides() -> dict:
    return runpy.run_path(str(ROOT / INVENTORY))["_test_data"]["model_overrides"]


def expected_manifest(repo) -> dict:
    return models.manifest(models.render(repo, overrides()))


def host_manifest(h, base: str) -> dict:
    """path -> [size, sha256] of what the host's live release holds (read on the host)."""
    out = ssh(h, f"cd {base}/model_repository/ && find . -type f ! -name '.tritonfleet-*' "
                 "-printf '%P\\n' | while read -r f; do echo \"$(stat -c %s \"$f\") $(sha256sum \"$f\")\"; done")
    man = {}
    for line in out.splitlines():
        size, digest, path = line.split(None, 2)
        man[path] = [int(size), digest]
    return man


def inode(h, path: str) -> str:
    return ssh(h, f"stat -c %i {path}").strip()


def test_deploy_and_fleet_connections_have_tcp_nodelay(deployed, monkeypatch):
    res, _ = pyinfra("tests/deploys/nodelay.py")
    assert res.returncode == 0, res.stderr[-3000:]

    from tritonfleet import fleet
    from tritonfleet.connection import transport_of

    monkeypatch.chdir(ROOT)
    hosts = fleet.load_inventory(INVENTORY)
    try:
        ok, out = fleet.run(hosts[0], "true")
        assert ok, out
        sock = transport_of(hosts[0].pyinfra_host).sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        for h in hosts:
            fleet.disconnect(h)


def test_sync_changes_over_openssh_and_pyinfra_connection(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[-1]
    repo = tmp_path / "repo"
    shutil.copytree(FILES / "model_repository", repo)
    base = ["--limit", h.name, "--data", f"triton_base_dir={SCRATCH}"]
    try:
        res, _ = run("tests/deploys/models_only.py", *base, "--data", f"model_repository={repo}")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "over ssh" in res.stderr and "4 files to send" in res.stderr, res.stderr[-3000:]
        first = ssh(h, f"readlink {SCRATCH}/model_repository").strip()
        assert host_manifest(h, SCRATCH) == expected_manifest(repo)

        # a no-op: nothing changes, nothing is read but the stat listing
        res, data = run("tests/deploys/models_only.py", *base, "--data", f"model_repository={repo}")
        assert res.returncode == 0 and changed_ops(data) == [], res.stderr[-3000:]

        # changed, added, removed, renamed in one release
        cfg = repo / "text_classifier_onnx" / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace("max_queue_delay_microseconds: 2000",
                                               "max_queue_delay_microseconds: 1000"))
        (repo / "resnet50_onnx" / "labels.txt").write_text("tench\ngoldfish\n")
        (repo / "text_classifier_onnx" / "1" / "model.onnx").rename(repo / "text_classifier_onnx" / "1" / "model_b.onnx")
        res, _ = run("tests/deploys/models_only.py", *base, "--data", f"model_repository={repo}")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "2 files to send" in res.stderr and "3 hard-linked" in res.stderr, res.stderr[-3000:]
        second = ssh(h, f"readlink {SCRATCH}/model_repository").strip()
        assert second != first
        assert host_manifest(h, SCRATCH) == expected_manifest(repo)
        assert inode(h, f"{SCRATCH}/{first}/text_classifier_onnx/1/model.onnx") == \
            inode(h, f"{SCRATCH}/{second}/text_classifier_onnx/1/model_b.onnx")
        (repo / "resnet50_onnx" / "labels.txt").unlink()  # removed
        res, _ = run("tests/deploys/models_only.py", *base, "--data", f"model_repository={repo}")
        assert res.returncode == 0 and "0 files to send" in res.stderr, res.stderr[-3000:]
        assert host_manifest(h, SCRATCH) == expected_manifest(repo)

        # a file changed on the host is noticed by its mtime and size, and replaced
        ssh(h, f"echo tampered >> {SCRATCH}/model_repository/text_classifier_onnx/config.pbtxt")
        res, _ = run("tests/deploys/models_only.py", *base, "--data", f"model_repository={repo}")
        assert res.returncode == 0 and "rebuilding" in res.stderr, res.stderr[-3000:]
        assert host_manifest(h, SCRATCH) == expected_manifest(repo)

        # the same through pyinfra's own SSH connection
        (repo / "resnet50_onnx" / "1" / "extra.bin").write_bytes(os.urandom(2_000_000))
        res, _ = run("tests/deploys/models_only.py", *base, "--data", f"model_repository={repo}",
                     "--data", "bulk_transfer=connection")
        assert res.returncode == 0 and "over connection" in res.stderr, res.stderr[-3000:]
        assert host_manifest(h, SCRATCH) == expected_manifest(repo)
    finally:
        ssh(h, f"rm -rf {SCRATCH}")


def test_interrupted_transfer_keeps_triton_serving_and_resumes(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[1]
    before = live_release(h)
    repo = tmp_path / "repo"
    shutil.copytree(FILES / "model_repository", repo)
    (repo / "resnet50_onnx" / "1" / "LICENSE").write_text("sent (and complete) before the cut\n")
    big = os.urandom(8_000_000)
    (repo / "resnet50_onnx" / "1" / "weights.bin").write_bytes(big)
    # the connection drops after 2 MB of the stream: an `ssh` first on PATH that cuts it
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "ssh").write_text(f"#!/bin/sh\nhead -c 2000000 | {shutil.which('ssh')} \"$@\"\n")
    (cut / "ssh").chmod(0o755)
    try:
        res, _ = run("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}",
                     path_first=str(cut))
        assert res.returncode != 0, res.stderr[-3000:]
        assert "the transfer failed" in res.stderr, res.stderr[-3000:]
        # nothing half-written is visible: the live link is unchanged and Triton keeps serving it
        assert live_release(h) == before
        assert infer_resnet(h.address).shape == (1, 1000)
        incoming = ssh(h, "ls -d /opt/triton/releases/.incoming-*").split()
        assert len(incoming) == 1
        rid = incoming[0].rsplit(".incoming-", 1)[1]
        assert ssh(h, f"test -e /opt/triton/releases/{rid} || echo absent").strip() == "absent"
        partial = int(ssh(h, f"stat -c %s {incoming[0]}/resnet50_onnx/1/weights.bin").strip())
        assert 0 < partial < len(big)

        # the next run resumes: only the cut file travels again
        res, _ = run("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "1 files to send (8.0 MB), 0 hard-linked from earlier releases, 5 kept" in res.stderr, \
            res.stderr[-3000:]
        assert live_release(h) == f"releases/{rid}"
        digest = ssh(h, "sha256sum /opt/triton/model_repository/resnet50_onnx/1/weights.bin").split()[0]
        assert digest == hashlib.sha256(big).hexdigest()
        assert infer_resnet(h.address).shape == (1, 1000)
    finally:
        # put the host back on the repository every other test expects
        res, _ = pyinfra("deploys/models.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-3000:]
    assert live_release(h) == before
