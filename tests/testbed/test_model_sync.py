"""Model sync and connection tuning over real SSH on the testbed: OpenSSH and pyinfra's own
connection as transports, changed/added/removed/renamed files, files changed on the host, an
interrupted transfer while Triton serves, TCP_NODELAY on the deploy's and the fleet commands'
connections. (The same logic on this machine alone: unit/model_repo/test_release_sync.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import shutil
import socket
import subprocess

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.model_repo.test_release_sync import trees
from tests.support.testbed import (
    INVENTORY,
    PYINFRA,
    changed_ops,
    env,
    infer_resnet,
    live_release,
    pyinfra,
    ssh,
)
from tritonfleet import ROOT
from tritonfleet.model_repo import render as models
from tritonfleet_testbed import hosts

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

    from tritonfleet.inventory import roster
    from tritonfleet.pyinfra_ext.connection import transport_of

    monkeypatch.chdir(ROOT)
    hosts = roster.load_inventory(INVENTORY)
    try:
        ok, out = roster.run(hosts[0], "true")
        assert ok, out
        sock = transport_of(hosts[0].pyinfra_host).sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        for h in hosts:
            roster.disconnect(h)


def test_sync_changes_over_openssh_and_pyinfra_connection(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[-1]
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "files" / "model_repository", repo)
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
    shutil.copytree(ROOT / "files" / "model_repository", repo)
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
        rid = incoming[0].rsplit(".incoming-", 1)[1].split(".", 1)[0]  # .incoming-<release>.<run>
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


# ---- the release is the repository, exactly: a few generated trees over real SSH --------------

def host_tree(h, base: str, dest) -> dict:
    """The host's live release as this machine sees it (streamed back as a tar archive), minus
    the release record at its top: {path: bytes} of files, {path/: None} of directories."""
    from tests.integration.model_repo.test_release_sync import snapshot

    dest.mkdir()
    with subprocess.Popen(["tar", "-x", "-f", "-", "-C", str(dest)], stdin=subprocess.PIPE) as untar:
        res = subprocess.run(
            ["ssh", "-i", str(hosts.ssh_key()), "-o", "StrictHostKeyChecking=no", "-o",
             "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
             f"root@{h.address}", f"tar -c -f - -C {base}/model_repository/ ."],
            stdout=untar.stdin, stderr=subprocess.PIPE, timeout=120)
        untar.stdin.close()
    assert res.returncode == 0 and untar.returncode == 0, res.stderr
    return snapshot(dest, host=True)


ODD = {  # every kind of entry the generated local test draws, in one tree
    "ensemble_x/1": None,  # an empty version directory
    "ensemble_x/config.pbtxt": b'platform: "ensemble"\n',
    "m -odd/1/.hidden/.keep": b"",
    "m -odd/1/it's $HOME & *?.bin": bytes(range(256)),
    "m -odd/2/deep/er/empty": None,
    "m -odd/labels-é日.txt": b"a\nb\n",
    ".top-hidden/x\\y": b"backslash\n",
}


def _write_tree(root, entries: dict) -> None:
    for rel, data in entries.items():
        p = root / rel
        if data is None:
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(extra=trees(), then=st.data())
def test_generated_trees_arrive_exactly_over_ssh(deployed, tmp_path_factory, extra, then):
    """Next to the runbook's models: empty and nested directories, hidden files at any depth,
    odd names, zero-byte files, a symlinked directory and file (followed), then renames,
    deletions and additions; over OpenSSH, the host's live release is the local repository as
    this host's class serves it (model_overrides applied), in paths, types and bytes."""
    from tests.integration.model_repo.test_release_sync import changed, flat, snapshot

    testbed, _, _ = deployed
    h = testbed.hosts[-1]
    work = tmp_path_factory.mktemp("tree")
    repo = work / "repo"
    shutil.copytree(ROOT / "files" / "model_repository", repo)
    _write_tree(repo, ODD)
    (repo / "m -odd/3").symlink_to("1")
    (repo / "m -odd/1/link.bin").symlink_to("it's $HOME & *?.bin")
    _write_tree(repo, {f"gen/{p}": v for p, v in flat(extra).items()})
    base = ["--limit", h.name, "--data", f"triton_base_dir={SCRATCH}", "--data", f"model_repository={repo}"]
    try:
        for step in range(2):
            if step:
                shutil.rmtree(repo / "gen", ignore_errors=True)
                _write_tree(repo, {f"gen/{p}": v for p, v in flat(then.draw(changed(extra))).items()})
                (repo / "m -odd/labels-é日.txt").rename(repo / "m -odd/2/labels renamed")
                shutil.rmtree(repo / "ensemble_x")
            res, _ = run("tests/deploys/models_only.py", *base)
            assert res.returncode == 0, res.stderr[-3000:]
            rendered = models.render(repo, overrides())
            assert host_tree(h, SCRATCH, work / f"host{step}") == snapshot(rendered)
        res, data = run("tests/deploys/models_only.py", *base)
        assert res.returncode == 0 and changed_ops(data) == [], res.stderr[-3000:]
    finally:
        ssh(h, f"rm -rf {SCRATCH}")


# ---- an ensemble deploys and serves ----------------------------------------------------------

ENSEMBLE = '''name: "text_pipeline"
platform: "ensemble"
max_batch_size: 32
input [
  { name: "TOKENS" data_type: TYPE_INT64 dims: [ 128 ] },
  { name: "MASK" data_type: TYPE_INT64 dims: [ 128 ] }
]
output [
  { name: "PROBS" data_type: TYPE_FP32 dims: [ 2 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "text_classifier_onnx"
      model_version: -1
      input_map { key: "input_ids" value: "TOKENS" }
      input_map { key: "attention_mask" value: "MASK" }
      output_map { key: "probabilities" value: "PROBS" }
    }
  ]
}
'''


def test_an_ensemble_deploys_and_serves(deployed, tmp_path):
    """An ensemble over the text classifier, its version directory 1/ empty as Triton wants it:
    validated, synced with 1/ in place, Triton (restarted with it) passes the health gate with
    every model ready, and an inference through the ensemble answers."""
    import numpy as np
    import tritonclient.http as httpclient

    testbed, _, _ = deployed
    h = testbed.hosts[0]
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "files" / "model_repository", repo)
    (repo / "text_pipeline" / "1").mkdir(parents=True)
    (repo / "text_pipeline" / "config.pbtxt").write_text(ENSEMBLE)
    try:
        res, _ = run("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}")
        assert res.returncode == 0, res.stderr[-3000:]
        assert ssh(h, "find /opt/triton/model_repository/text_pipeline/1 -type d -empty").strip()
        client = httpclient.InferenceServerClient(url=f"{h.address}:8000")
        assert client.is_model_ready("text_pipeline")
        tokens = np.ones((1, 128), dtype=np.int64)
        inputs = [httpclient.InferInput("TOKENS", tokens.shape, "INT64"),
                  httpclient.InferInput("MASK", tokens.shape, "INT64")]
        for i in inputs:
            i.set_data_from_numpy(tokens)
        out = client.infer("text_pipeline", inputs, outputs=[httpclient.InferRequestedOutput("PROBS")])
        probs = out.as_numpy("PROBS")
        assert probs.shape == (1, 2) and np.isfinite(probs).all()
    finally:
        res, _ = pyinfra("deploys/models.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-3000:]
