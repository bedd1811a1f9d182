"""A multi-GPU host on the testbed: one of the session's deployed T4 hosts is given four stand-in
GPUs (bus ids of a real 4x T4 capture), then comes back from a reboot with one of them gone;
everything is put back at the end (the GPU file, the host's GPU record, a healthy verification).

* the GPU verification counts 4 and records them; `tritonfleet status` shows 4/4, no drift;
* the deploy renders the article's configs (the testbed's CPU overrides left out) spread over
  GPUs 0-3 for this host: a dry run names the release of the spread repository, and pre-flight
  validated that copy against 4 GPUs;
* back from a reboot with 3 GPUs: the verification fails naming the missing GPU by index, bus id
  and UUID; status shows 3/4 and the same GPU as drift.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

from tests.support.testbed import (
    INVENTORY,
    ROOT,
    boot_id,
    pyinfra,
    pyinfra_raw,
    ssh,
    status_of,
    tritonfleet,
    write_inventory,
)
from tritonfleet.gpu import placement as gpucount
from tritonfleet.model_repo import render as models
from tritonfleet_testbed import hosts
from tritonfleet_testbed.standin_repo import MULTI_GPU_BUS_IDS, gpu_profile, multi_gpu_uuid

GPU_ENV = "/etc/nvidia-standin/gpu.env"


def put(h, path: str, text: str) -> None:
    text = text if text.endswith("\n") else text + "\n"
    ssh(h, f"cat > {path} <<'EOF_TF'\n{text}EOF_TF")


def reboot(h) -> None:
    before = boot_id(h)
    ssh(h, "systemctl reboot", check=False)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        time.sleep(2)
        try:
            hosts.wait_ssh(h, timeout=60)
            if boot_id(h) != before:
                return
        except (hosts.TestbedError, AssertionError, subprocess.TimeoutExpired):  # going down, or not up yet
            continue
    raise AssertionError(f"{h.name} did not come back from the reboot")


def ready(address: str, port: int, path: str = "/v2/health/ready") -> int:
    import requests

    try:
        return requests.get(f"http://{address}:{port}{path}", timeout=5).status_code
    except requests.RequestException:
        return 0


def deploy_models(h, inventory: str) -> str:
    """deploys/models.py on ``h`` alone; its output (the run must pass)."""
    res = pyinfra_raw("-y", "--limit", h.name, inventory, "deploys/models.py")
    out = res.stdout.decode() + res.stderr.decode()
    assert res.returncode == 0, out[-4000:]
    return out


def triton_units(h) -> list[str]:
    return ssh(h, "ls /etc/systemd/system | grep -E '^triton(-gpu[0-9]+)?[.]service$'").split()


def one_triton_per_gpu(h, directory, models_ready: list[str]) -> None:
    """triton_per_gpu on the 4-GPU host: four units, four containers (--gpus device=N), four port
    sets each ready with every model; status shows 4/4 without drift; then the single unit again."""
    assert models_ready
    inv = write_inventory(directory, {"t4": [h.name]}, triton_per_gpu=True)
    try:
        out = deploy_models(h, inv)
        assert "4 Triton instances, one per GPU" in out, out[-4000:]
        units = triton_units(h)
        assert units == [f"triton-gpu{i}.service" for i in range(4)], units
        for i in range(4):
            port = 8000 + 10 * i
            assert ready(h.address, port) == 200, f"GPU {i}: {port}"
            for m in models_ready:
                assert ready(h.address, port, f"/v2/models/{m}/ready") == 200, (i, m)
            assert ready(h.address, 8002 + 10 * i, "/metrics") == 200
            # what the container gets from Docker: the one GPU it asked for (the stand-in driver
            # shows every GPU inside any GPU container: the isolation itself needs a real GPU)
            got = ssh(h, f"docker inspect --format '{{{{json .HostConfig.DeviceRequests}}}}' triton-server-gpu{i}")
            assert json.loads(got)[0]["DeviceIDs"] == [str(i)], got
            # and dockerd hands the NVIDIA runtime hook that GPU (moby's daemon/nvidia_linux.go)
            env_lines = ssh(h, f"docker exec triton-server-gpu{i} sh -c 'tr \"\\\\0\" \"\\\\n\" < /proc/1/environ'")
            assert f"NVIDIA_VISIBLE_DEVICES={i}" in env_lines.split(), env_lines
        res = tritonfleet("status", inv, "--json", "--limit", h.name)
        row = {r["host"]: r for r in json.loads(res.stdout)}[h.name]
        assert (res.returncode, row["drift"], row["instances_expected"]) == (0, [], 4), json.dumps(row)[:3000]
        assert sorted((i["index"], i["state"], i["ready"]) for i in row["instances"]) == \
            [(i, "active", True) for i in range(4)]
        assert "active 4/4" in tritonfleet("status", inv, "--limit", h.name).stdout
    finally:
        # the single unit again: per-GPU units stopped and removed, triton.service serving
        out = deploy_models(h, INVENTORY)
    assert "triton_per_gpu is off" in out, out[-4000:]
    units = triton_units(h)
    assert units == ["triton.service"], units
    assert ready(h.address, 8000) == 200 and ready(h.address, 8010) == 0
    rc, row = status_of(h.name)
    assert (rc, row["drift"]) == (0, []), row["drift"]


def test_four_gpu_host(deployed, tmp_path):
    testbed, _, _ = deployed
    h = [x for x in testbed.hosts if x.gpu_class == "t4"][-1]
    env_before = ssh(h, f"cat {GPU_ENV}")
    record_before = ssh(h, f"cat {gpucount.RECORD}")
    assert len(gpucount.parse_record(record_before.splitlines())) == 1  # the shared deploy recorded 1
    buses = MULTI_GPU_BUS_IDS["T4"]
    uuids = [multi_gpu_uuid("T4", b) for b in buses]
    try:
        put(h, GPU_ENV, gpu_profile("t4", 4))
        res, _ = pyinfra("deploys/verify.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-4000:]
        for where in ("host", "container"):
            assert re.search(rf"GPU check  {h.name} +{where} +4x Tesla T4 .*GPUs 4/4", res.stderr), res.stderr[-3000:]
        recorded = gpucount.parse_record(ssh(h, f"cat {gpucount.RECORD}").splitlines())
        assert [(g["index"], g["pci_bus_id"], g["uuid"]) for g in recorded] == list(zip(range(4), buses, uuids, strict=True))
        rc, row = status_of(h.name)
        assert (len(row["gpus"]), row["gpu_expected"], rc, row["drift"]) == (4, 4, 0, [])
        table = tritonfleet("status", INVENTORY, "--limit", h.name).stdout
        assert "4/4x Tesla T4" in table, table

        one_triton_per_gpu(h, tmp_path / "per-gpu", row["models_ready"])

        # the article's configs on this host: spread over GPUs 0-3 (the testbed serves on CPU, so
        # this is a dry run: the release it plans is the spread one, validated against 4 GPUs)
        inv = write_inventory(tmp_path / "inv", {"t4": [h.name]}, drop=("model_overrides",))
        data = {"model_repository": str(ROOT / "files/model_repository"), "model_overrides": {}}
        local4, _, spread = models.host_repository(data, gpus=4)
        _, _, as_written = models.host_repository(data, gpus=1)
        for model in ("resnet50_onnx", "text_classifier_onnx"):
            text = (local4 / model / "config.pbtxt").read_text()
            assert [int(x) for x in re.findall(r"gpus: (\d+)", text)] == [0, 1, 2, 3], text
        dry = pyinfra_raw("--dry", "--limit", h.name, inv, "deploys/models.py")
        out = dry.stdout.decode() + dry.stderr.decode()
        assert dry.returncode == 0, out[-4000:]
        assert f"model release {spread}" in out and as_written not in out, out[-4000:]

        # back from a reboot with the GPU at 00:1D.0 gone
        put(h, GPU_ENV, gpu_profile("t4", 4, missing=(2,)))
        reboot(h)
        assert len(ssh(h, "nvidia-smi -L").splitlines()) == 3
        res, _ = pyinfra("deploys/verify.py", "--limit", h.name)
        assert res.returncode != 0
        missing = f"missing: GPU 2 ({buses[2]}, {uuids[2]}, Tesla T4)"
        text = res.stdout + res.stderr
        assert f"reports 3 GPU(s), expected 4 (recorded in {gpucount.RECORD}); {missing}" in text, text[-4000:]
        rc, row = status_of(h.name)
        assert (len(row["gpus"]), row["gpu_expected"], rc) == (3, 4, 1)
        assert any(missing in d for d in row["drift"]), row["drift"]
        assert "3/4x Tesla T4" in tritonfleet("status", INVENTORY, "--limit", h.name).stdout
        # the record is kept: the next run still expects 4
        assert len(gpucount.parse_record(ssh(h, f"cat {gpucount.RECORD}").splitlines())) == 4
    finally:
        put(h, GPU_ENV, env_before)
        put(h, gpucount.RECORD, record_before)
        res, _ = pyinfra("deploys/verify.py", "--limit", h.name)
        assert res.returncode == 0, res.stderr[-4000:]
        rc, row = status_of(h.name)
        assert (rc, len(row["gpus"]), row["gpu_expected"]) == (0, 1, 1), json.dumps(row)[:2000]
