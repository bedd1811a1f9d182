"""Fleet operations on the testbed: status, health-gated rollouts (success, unhealthy canary,
unreachable host), rollback, zero-downtime model updates in explicit mode, rebuild from bare.

Every test leaves the fleet serving the default model repository in model-control mode none,
as the shared `deployed` fixture made it.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
import requests

from tests.support.testbed import (
    api_headers,
    break_model_at_load,
    changed_ops,
    container_started,
    infer_resnet,
    live_release,
    pyinfra,
    repository_copy,
    ssh,
    ssh_blocked,
    tritonfleet,
)
from tritonfleet_testbed import hosts

INV = "inventories/testbed.py"


def status(*extra: str) -> tuple[int, dict]:
    res = tritonfleet("status", INV, "--json", *extra)
    rows = json.loads(res.stdout)
    return res.returncode, {r["host"]: r for r in rows}


def rollout(*args: str) -> tuple[subprocess.CompletedProcess, dict]:
    res = tritonfleet("rollout", INV, *args, "--json")
    try:
        report = json.loads(res.stdout)
    except ValueError:
        report = {}
    return res, report


def by_host(report: dict) -> dict:
    return {h["host"]: h for h in report.get("hosts", [])}


def served_delay(h) -> int:
    cfg = requests.get(f"http://{h.address}:8000/v2/models/text_classifier_onnx/config", timeout=5,
                       headers=api_headers(h)).json()
    return cfg["dynamic_batching"]["max_queue_delay_microseconds"]


def history(h) -> list[dict]:
    return [json.loads(line) for line in ssh(h, "cat /opt/triton/history.jsonl").splitlines() if line.strip()]


@pytest.fixture
def changed_repo(tmp_path):
    """The default repository with one config change (max_queue_delay 2000 -> 1000)."""
    repo = repository_copy(tmp_path / "changed")
    cfg = repo / "text_classifier_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_queue_delay_microseconds: 2000", "max_queue_delay_microseconds: 1000"))
    return repo


def restore_fleet(testbed):
    """Back to the default repository on every host (a no-op when nothing changed)."""
    res, _ = pyinfra("deploys/models.py")
    assert res.returncode == 0, res.stderr[-3000:]


def test_status_one_row_a_host_and_drift(deployed):
    testbed, _, _ = deployed
    rc, rows = status()
    assert rc == 0, rows
    assert set(rows) == {h.name for h in testbed.hosts}
    for h in testbed.hosts:
        r = rows[h.name]
        assert r["reachable"] and r["drift"] == [], r
        assert r["gpus"] == (["Tesla T4"] if h.gpu_class == "t4" else ["NVIDIA L4"])
        assert r["driver"].startswith("580.") and r["toolkit"] == "1.17.8-1" and r["docker"]
        assert r["image"] == "nvcr.io/nvidia/tritonserver:24.08-py3" and r["unit_state"] == "active"
        assert sorted(r["models_ready"]) == ["resnet50_onnx", "text_classifier_onnx"]
        assert r["release"] == live_release(h).rsplit("/", 1)[-1]
        assert r["last_deploy"]["release"] == r["release"]
        # (earlier tests may have ended on a rollback to the same deployment)
        assert r["last_deploy"]["action"] in ("deploy", "rollback")
    # drift: a stopped Triton and an unreachable host show up, and the exit status says so
    h2, h3 = testbed.hosts[1], testbed.hosts[2]
    ssh(h3, "systemctl stop triton")
    try:
        with ssh_blocked(h2):
            rc, rows = status()
    finally:
        ssh(h3, "systemctl start triton")
    assert rc == 1
    assert rows[h2.name]["reachable"] is False and rows[h2.name]["drift"] == ["unreachable"]
    assert "triton inactive" in rows[h3.name]["drift"], rows[h3.name]
    assert rows[testbed.hosts[0].name]["drift"] == []
    # back to serving (Triton loads its models again), then the table form of one group
    deadline = time.monotonic() + 60
    while status()[0] != 0 and time.monotonic() < deadline:
        time.sleep(1)
    res = tritonfleet("status", INV, "--limit", "t4")
    assert res.returncode == 0, res.stdout + res.stderr
    assert [ln.split()[0] for ln in res.stdout.splitlines()[1:]] == [h.name for h in testbed.hosts if h.gpu_class == "t4"]


def test_status_reports_a_moved_tag(deployed):
    """The Triton tag pulled again after it moved in the registry (here: pointed at another image
    on the host, as `docker pull` of a moved tag does): the container still runs the old image."""
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    tag = "nvcr.io/nvidia/tritonserver:24.08-py3"
    running = ssh(h, f"docker image inspect --format '{{{{.Id}}}}' {tag}").strip()
    other = ssh(h, f"docker images -q --no-trunc | grep -v -x {running} | head -n 1").strip()
    assert other.startswith("sha256:") and other != running
    ssh(h, f"docker tag {other} {tag}")
    try:
        rc, rows = status()
    finally:
        ssh(h, f"docker tag {running} {tag}")
    assert rc == 1
    (d,) = rows[h.name]["drift"]
    assert f"image {tag} moved: it names {other[7:19]} on the host, the container runs {running[7:19]}" in d
    assert rows[h.name]["image_id"] == running and rows[h.name]["wanted_image_id"] == other
    rc, rows = status()
    assert rc == 0 and rows[h.name]["drift"] == [], rows[h.name]


def test_rollout_canary_then_batches_in_inventory_order(deployed, changed_repo):
    testbed, _, _ = deployed
    before = {h.name: live_release(h) for h in testbed.hosts}
    res, report = rollout("deploys/models.py", "--canary", "1", "--batch", "1",
                          "--data", f"model_repository={changed_repo}")
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert report["ok"] and not report["halted"]
    order = [n for batch in report["batches"] for n in batch]
    assert order == [h["host"] for h in report["hosts"]]  # inventory order: t4 group, then l4
    assert report["batches"][0] == [order[0]] and len(report["batches"]) == len(testbed.hosts)
    rows = by_host(report)
    for h in testbed.hosts:
        assert rows[h.name]["result"] == "updated", rows[h.name]
        assert served_delay(h) == 1000
        new = live_release(h).rsplit("/", 1)[-1]
        assert new != before[h.name].rsplit("/", 1)[-1]
        assert rows[h.name]["after"].startswith(new)
    # progress per batch went to the terminal
    assert res.stderr.count("done in") == len(testbed.hosts)
    # the deploy history on each host names the new release; the old one is kept for rollback
    h = testbed.hosts[0]
    assert history(h)[-1]["release"] == live_release(h).rsplit("/", 1)[-1]
    assert ssh(h, f"test -d /opt/triton/{before[h.name]} && echo kept").strip() == "kept"

    # a manual rollback (deploys/rollback.py) puts the earlier release back, with no local state
    res2, data2 = pyinfra("deploys/rollback.py", "--limit", h.name)
    assert res2.returncode == 0, res2.stderr[-3000:]
    assert live_release(h) == before[h.name] and served_delay(h) == 2000
    assert history(h)[-1]["action"] == "rollback"
    assert infer_resnet(h.address).shape == (1, 1000)
    restore_fleet(testbed)
    assert all(served_delay(x) == 2000 for x in testbed.hosts)


def test_rollout_halts_on_an_unhealthy_canary_and_rolls_it_back(deployed, tmp_path):
    testbed, _, _ = deployed
    bad = break_model_at_load(repository_copy(tmp_path / "bad"))
    canary, rest = testbed.hosts[0], testbed.hosts[1:]
    before = {h.name: (live_release(h), container_started(h), len(history(h))) for h in testbed.hosts}
    # the gate stops as soon as Triton failed twice, long before health_timeout (18 s here on a quiet
    # machine); 600 s, not the default 180 s: a CI run with five parts side by side on 2 CPUs
    # (load average 16) waited out 180 s before the second failed start, and reported the timeout
    res, report = rollout("deploys/models.py", "--canary", "1", "--batch", "50%",
                          "--data", f"model_repository={bad}", "--data", "health_timeout=600")
    assert res.returncode == 1, res.stdout + res.stderr[-3000:]
    assert "canary" in report["halted"] or "halted after" in report["halted"], report["halted"]
    rows = by_host(report)
    assert rows[canary.name]["result"] == "rolled back", rows[canary.name]
    # the table cell: the step and Triton's own error, once (no repeated host name)
    detail = rows[canary.name]["detail"]
    assert detail.startswith("health gate: failed to load 'text_classifier_onnx'"), detail
    assert f"{canary.name}:" not in detail
    # the full report: in --json, and in the progress output
    full = rows[canary.name]["failure"]["text"]
    assert full.startswith(f"tritonfleet: {canary.name} failed at health gate") and full in res.stderr
    assert "stopped with the same error on two consecutive starts" in full
    assert "the rollout rolls this host back" in full and "Traceback" not in res.stderr
    print(f"\nfailed canary: deploy and gate {rows[canary.name]['seconds']:.0f}s, rollout to halted (rolled back) {report['seconds']:.0f}s")
    # the canary serves what it served before, again
    assert live_release(canary) == before[canary.name][0]
    assert infer_resnet(canary.address).shape == (1, 1000)
    assert history(canary)[-1]["release"] == before[canary.name][0].rsplit("/", 1)[-1]
    # the other hosts were never touched: same release, same container, same history
    for h in rest:
        assert rows[h.name]["result"] == "not touched"
        assert (live_release(h), container_started(h), len(history(h))) == before[h.name]
    assert "HALTED" in res.stderr


def test_rollout_refuses_to_start_when_a_host_is_unreachable(deployed, changed_repo):
    testbed, _, _ = deployed
    down = testbed.hosts[1]
    before = {h.name: live_release(h) for h in testbed.hosts}
    with ssh_blocked(down):
        res, report = rollout("deploys/models.py", "--data", f"model_repository={changed_repo}")
    assert res.returncode == 1
    rows = by_host(report)
    assert rows[down.name]["result"] == "unreachable"
    assert "unreachable before the start" in report["halted"]
    assert all(rows[h.name]["result"] == "not touched" for h in testbed.hosts if h is not down)
    assert {h.name: live_release(h) for h in testbed.hosts} == before


def test_rollout_stops_at_planning_when_the_repository_is_invalid(deployed, tmp_path):
    testbed, _, _ = deployed
    repo = repository_copy(tmp_path / "invalid")
    cfg = repo / "resnet50_onnx" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size", "max_batch_sise"))
    before = {h.name: live_release(h) for h in testbed.hosts}
    res, report = rollout("deploys/models.py", "--data", f"model_repository={repo}")
    assert res.returncode == 1
    assert "planning failed before any host was changed" in report["halted"]
    assert "max_batch_sise" in report["halted"]
    assert all(h["result"] == "not touched" for h in report["hosts"])
    assert {h.name: live_release(h) for h in testbed.hosts} == before


def test_explicit_mode_updates_models_with_zero_failed_requests(deployed, changed_repo, tmp_path):
    """Explicit model-control mode: updates load without a restart and no request fails. And
    Triton's secure-deployment defaults there: an unauthenticated (or wrong-key) load or unload
    from the control machine is refused and the model stays ready; the deploy's own updates load
    through the same API with the host's key; the key is 0600 root on the host and in no unit,
    docker inspect, pyinfra output or journal; the server runs as the image's triton-server user."""
    testbed, _, _ = deployed
    h = testbed.hosts[-1]
    explicit = ("--data", "triton_model_control_mode=explicit", "--limit", h.name)
    res, data = pyinfra("deploys/models.py", *explicit)  # unit changes: one restart, now
    assert res.returncode == 0, res.stderr[-3000:]
    key = api_headers(h)["tritonfleet-api-key"]
    assert len(key) == 64 and ssh(h, "stat -c '%a %U' /etc/tritonfleet/triton-api-key").strip() == "600 root"
    url = f"http://{h.address}:8000/v2/repository/models/text_classifier_onnx"
    for verb in ("unload", "load"):
        for headers in ({}, {"tritonfleet-api-key": "0" * 64}):
            r = requests.post(f"{url}/{verb}", headers=headers, timeout=10)
            assert r.status_code == 403 and "restricted" in r.text, (verb, r.status_code, r.text)
    ready = requests.get(f"http://{h.address}:8000/v2/models/text_classifier_onnx/ready", timeout=10)
    assert ready.status_code == 200
    assert requests.post(f"http://{h.address}:8000/v2/repository/index", timeout=10).status_code == 403
    body = {"inputs": [{"name": n, "shape": [1, 128], "datatype": "INT64", "data": [1] * 128}
                       for n in ("input_ids", "attention_mask")]}
    stop, sent, failures = threading.Event(), [0], []

    def client():
        with requests.Session() as s:
            while not stop.is_set():
                try:
                    r = s.post(f"http://{h.address}:8000/v2/models/text_classifier_onnx/infer", json=body, timeout=10)
                    if r.status_code != 200:
                        failures.append(r.text[:200])
                except requests.RequestException as e:
                    failures.append(str(e)[:200])
                sent[0] += 1

    started = container_started(h)
    loop = threading.Thread(target=client)
    loop.start()
    try:
        time.sleep(1)
        res1, data1 = pyinfra("deploys/models.py", *explicit, "--data", f"model_repository={changed_repo}")
        delay1 = served_delay(h)
        # and back again, to the older release (Triton must still reload it)
        res2, data2 = pyinfra("deploys/models.py", *explicit)
        delay2 = served_delay(h)
        # an update whose model fails to load: refused, the loaded model keeps serving
        bad = break_model_at_load(repository_copy(tmp_path / "bad"))
        res3, _ = pyinfra("deploys/models.py", *explicit, "--data", f"model_repository={bad}")
        time.sleep(1)
    finally:
        stop.set()
        loop.join()
    assert res1.returncode == 0 and res2.returncode == 0, (res1.stderr + res2.stderr)[-3000:]
    assert delay1 == 1000 and delay2 == 2000
    assert any("load changed models without a restart (text_classifier_onnx)" in n for n in changed_ops(data1))
    assert not any("restart" in n.lower() and "without" not in n for n in changed_ops(data1) + changed_ops(data2))
    assert res3.returncode != 0 and "load of text_classifier_onnx failed" in res3.stderr
    assert container_started(h) == started  # never restarted
    assert sent[0] > 50 and failures == [], (sent[0], failures[:3])
    # the failed update is rolled back without a restart either
    res4, data4 = pyinfra("deploys/rollback.py", *explicit)
    assert res4.returncode == 0, res4.stderr[-3000:]
    assert any("without a restart" in n for n in changed_ops(data4)) and container_started(h) == started
    # the key is nowhere but in its file (and tritonserver's own argv inside the container)
    inspect = ssh(h, "docker inspect triton-server")
    journal = ssh(h, "journalctl -u triton --no-pager -n 2000")
    unit = ssh(h, "cat /etc/systemd/system/triton.service")
    outputs = "".join(r.stdout + r.stderr for r in (res, res1, res2, res3, res4))
    for where, text in (("docker inspect", inspect), ("journal", journal), ("unit", unit),
                        ("pyinfra output", outputs)):
        assert key not in text, where
    assert ssh(h, "docker exec triton-server id -un").strip() == "triton-server"
    assert ssh(h, "ps -o user= -C tritonserver").split() == ["1000"]
    # back to mode none (one restart) for the other tests
    res5, _ = pyinfra("deploys/models.py", "--limit", h.name)
    assert res5.returncode == 0, res5.stderr[-3000:]
    assert served_delay(h) == 2000


def test_rebuild_a_destroyed_host_from_bare_with_one_command(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[-1]
    hosts.destroy_host(h.name)
    from tritonfleet_testbed.standin_repo import gpu_profile

    hosts.up(len(testbed.hosts), gpu_env_for=gpu_profile)  # the same host, bare (a new disk)
    assert ssh(h, "test -e /opt/triton || echo bare").strip() == "bare"
    t0 = time.monotonic()
    res, report = rollout("deploys/triton.py", "--limit", h.name)
    took = time.monotonic() - t0
    print(f"\nrebuild of {h.name} from bare to serving: {took:.0f}s")
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert by_host(report)[h.name]["result"] == "updated"
    assert infer_resnet(h.address).shape == (1, 1000)
    rc, rows = status("--limit", h.name)
    assert rc == 0 and rows[h.name]["drift"] == [], rows
