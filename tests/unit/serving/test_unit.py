"""Rendering of the Triton systemd unit: every documented flag, and each one droppable."""

from __future__ import annotations

import pytest

from tritonfleet.serving.drain import stop_timeouts
from tritonfleet.serving.unit import render_unit

BASE = dict(
    image="nvcr.io/nvidia/tritonserver:24.08-py3", container="triton-server", gpus="all",
    shm_size="1g", ulimit_memlock="-1", ulimit_stack="67108864", http_port=8000, grpc_port=8001,
    metrics_port=8002, http_bind="", grpc_bind="", metrics_bind="",
    model_repository="/opt/triton/model_repository", strict_model_config=True,
    model_control_mode="none", extra_args=[], start_timeout=600, base_dir="/opt/triton",
    # the security defaults off (tests/integration/serving/test_hardening.py renders them)
    user="", restricted_apis=[], api_key_file="", key_script="",
    **stop_timeouts(30),
)


def exec_start(unit: str) -> str:
    lines, on = [], False
    for line in unit.splitlines():
        if line.startswith("ExecStart="):
            on = True
        if on:
            lines.append(line.rstrip("\\").strip())
            if not line.endswith("\\"):
                break
    return " ".join(lines).removeprefix("ExecStart=")


def test_runbook_flags():
    cmd = exec_start(render_unit(BASE))
    assert cmd.split() == (
        "/usr/bin/docker run --rm --name triton-server --gpus all --shm-size=1g "
        "--ulimit memlock=-1 --ulimit stack=67108864 -p 8000:8000 -p 8001:8001 -p 8002:8002 "
        "-v /opt/triton/model_repository:/models:ro nvcr.io/nvidia/tritonserver:24.08-py3 "
        "tritonserver --model-repository=/models --strict-model-config=true --exit-timeout-secs=30"
    ).split()


def test_unit_structure():
    unit = render_unit(BASE)
    assert "After=docker.service" in unit and "Requires=docker.service" in unit
    assert "ExecStartPre=-/usr/bin/docker rm -f triton-server" in unit
    assert "Restart=always" in unit and "TimeoutStartSec=600" in unit
    assert " -d " not in exec_start(unit)  # foreground: systemd supervises the container


@pytest.mark.parametrize("key,flag", [
    ("gpus", "--gpus"), ("shm_size", "--shm-size"), ("ulimit_memlock", "memlock="),
    ("ulimit_stack", "stack="),
])
def test_each_flag_can_be_dropped(key, flag):
    assert flag in exec_start(render_unit(BASE))
    assert flag not in exec_start(render_unit({**BASE, key: None}))


def test_binds_ports_mode_and_extra_args():
    cmd = exec_start(render_unit({
        **BASE, "http_bind": "127.0.0.1", "metrics_bind": "10.0.0.5", "grpc_port": 9001,
        "model_control_mode": "explicit", "extra_args": ["--log-verbose=1"],
        "strict_model_config": False,
    }))
    assert "-p 127.0.0.1:8000:8000" in cmd and "-p 10.0.0.5:8002:8002" in cmd
    assert "-p 9001:8001" in cmd
    assert cmd.endswith("--model-control-mode=explicit --load-model=* --exit-timeout-secs=30 --log-verbose=1")
    assert "--strict-model-config" not in cmd


def test_explicit_mode_mounts_the_release_tree_so_a_link_switch_is_seen():
    cmd = exec_start(render_unit({**BASE, "model_control_mode": "explicit"}))
    # the model_repository link resolves inside the container at load time, not at `docker run`
    assert "-v /opt/triton:/opt/triton:ro" in cmd
    assert "--model-repository=/opt/triton/model_repository" in cmd
    assert ":/models" not in cmd
    assert "--model-control-mode=explicit --load-model=*" in cmd
    # the default (none) keeps the runbook's /models mount
    assert "-v /opt/triton/model_repository:/models:ro" in exec_start(render_unit(BASE))


@pytest.mark.parametrize("seconds", [0, 5, 30, 600])
def test_stop_timeouts_come_from_one_tunable_and_nest(seconds):
    """Triton's own wait for requests in flight < Docker's stop timeout < systemd's: neither kills
    Triton while it still finishes requests."""
    unit = render_unit({**BASE, **stop_timeouts(seconds)})
    cmd = exec_start(unit)
    assert f"--exit-timeout-secs={seconds}" in cmd.split()
    docker = int(next(ln for ln in unit.splitlines() if ln.startswith("ExecStop=")).split("-t ")[1].split()[0])
    systemd = int(next(ln for ln in unit.splitlines() if ln.startswith("TimeoutStopSec=")).split("=")[1])
    assert seconds < docker < systemd
    assert docker - seconds >= 10 and systemd - docker >= 10


COMPILED = """
import json, sys
import jinja2
compiled = []
real = jinja2.Environment.compile
jinja2.Environment.compile = lambda self, *a, **k: compiled.append(1) or real(self, *a, **k)
from tritonfleet.serving.unit import render_unit
print(json.dumps([render_unit(json.loads(sys.argv[1])), len(compiled)]))
"""


