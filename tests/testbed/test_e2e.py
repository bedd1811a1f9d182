"""End to end on real local hosts: testbed up -> full deploy from bare over real SSH ->
health gate -> inference -> metrics -> a second run changes nothing -> a model update moves
only the changed files. (The session teardown in conftest.py checks `testbed down` is clean.)

Needs root on Debian 12 (systemd-nspawn, network namespaces); .ci/run provides both.
"""

from __future__ import annotations

import shutil
import time

import requests

from tests.support.testbed import (
    api_headers,
    changed_ops,
    infer_resnet,
    live_release,
    pyinfra,
    ssh,
    success_count,
)
from tritonfleet import ROOT


def test_bare_to_serving_and_idempotent(deployed):
    testbed, res, data = deployed
    # the checks ran on every host and printed the verification table
    assert res.stderr.count("GPU check") >= 2 * len(testbed.hosts), res.stderr[-3000:]
    assert "Tesla T4" in res.stderr and "NVIDIA L4" in res.stderr

    for h in testbed.hosts:
        out = infer_resnet(h.address)
        assert out.shape == (1, 1000)
        assert success_count(h.address, "resnet50_onnx") >= 1
        # the SSH sessions step: root's manager is kept between sessions (loginctl enable-linger)
        assert ssh(h, "loginctl show-user root -p Linger").strip() == "Linger=yes", h.name

    t0 = time.monotonic()
    res2, data2 = pyinfra("deploys/triton.py", "--debug")  # --debug prints each command sent
    print(f"\nre-run on {len(testbed.hosts)} converged hosts: {time.monotonic() - t0:.1f}s")
    assert res2.returncode == 0, res2.stderr[-4000:]
    assert changed_ops(data2) == [], changed_ops(data2)
    # pre-flight's one read, once a host, whether it reached the host before its lock's holder or
    # after (a read that found this run's own holder line stands: hostlock.stands)
    assert res2.stderr.count("_tfa() (") == len(testbed.hosts), res2.stderr.count("_tfa() (")
    # the container check's recorded answer was checked again: nothing it depends on changed
    assert res2.stderr.count("(as when it last passed") == len(testbed.hosts), res2.stderr[-3000:]


def test_gpu_container_check_runs_again_when_what_it_depends_on_changes(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    daemon = ssh(h, "cat /etc/docker/daemon.json")
    try:
        # an operator's key added to daemon.json (the deploy keeps it): the container runs again
        ssh(h, "python3 - <<'EOF'\nimport json\np='/etc/docker/daemon.json'\nd=json.load(open(p))\n"
               "d['log-opts']={'max-size':'10m'}\njson.dump(d,open(p,'w'))\nEOF")
        res, data = pyinfra("deploys/verify.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "GPU check" in res.stderr and "(as when it last passed" not in res.stderr, res.stderr[-3000:]
        res, data = pyinfra("deploys/verify.py", "--limit", h.name)
        assert res.returncode == 0 and "(as when it last passed" in res.stderr, res.stderr[-3000:]
        # "always": a container every run
        res, data = pyinfra("deploys/verify.py", "--limit", h.name, "--data", "gpu_verify_container=always")
        assert res.returncode == 0 and "(as when it last passed" not in res.stderr, res.stderr[-3000:]
    finally:
        ssh(h, f"cat > /etc/docker/daemon.json <<'EOF'\n{daemon.rstrip(chr(10))}\nEOF")
    # daemon.json as it was: the container runs again, and recording its answer is the one change
    res, data = pyinfra("deploys/triton.py", "--limit", h.name)
    assert res.returncode == 0 and [n for n in changed_ops(data) if "GPU check's answer" not in n] == [], \
        changed_ops(data)
    assert len(changed_ops(data)) == 1, changed_ops(data)


def test_model_update_moves_only_changed_files(deployed, tmp_path):
    testbed, _, _ = deployed
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "files" / "model_repository", repo)
    cfg = repo / "text_classifier_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_queue_delay_microseconds: 2000",
                                           "max_queue_delay_microseconds: 1000"))
    (repo / "resnet50_onnx" / "labels.txt").write_text("tench\ngoldfish\n")
    h = testbed.hosts[0]
    before = live_release(h)
    res, data = pyinfra("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}")
    assert res.returncode == 0, res.stderr[-4000:]
    # the two changed files travel; the three unchanged ones are hard links to the live release
    assert "2 files to send (0.0 MB), 3 hard-linked from earlier releases" in res.stderr, res.stderr[-3000:]
    after = live_release(h)
    assert after != before
    inode = ssh(h, f"stat -c %i /opt/triton/{before}/resnet50_onnx/1/model.onnx "
                   f"/opt/triton/{after}/resnet50_onnx/1/model.onnx").split()
    assert inode[0] == inode[1]
    # the previous release is kept for rollback; a file removed locally is gone remotely
    (repo / "resnet50_onnx" / "labels.txt").unlink()
    res, _ = pyinfra("deploys/models.py", "--limit", h.name, "--data", f"model_repository={repo}")
    assert res.returncode == 0, res.stderr[-4000:]
    latest = live_release(h)
    assert ssh(h, f"test -e /opt/triton/{latest}/resnet50_onnx/labels.txt || echo gone").strip() == "gone"
    assert ssh(h, f"test -d /opt/triton/{before} && echo kept").strip() == "kept"
    served = requests.get(f"http://{h.address}:8000/v2/models/text_classifier_onnx/config", timeout=5,
                          headers=api_headers(h)).json()
    assert served["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    # put the host back on the repository every other test expects
    res, _ = pyinfra("deploys/models.py", "--limit", h.name)
    assert res.returncode == 0, res.stderr[-4000:]
    assert live_release(h) == before
