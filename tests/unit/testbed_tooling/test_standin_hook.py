"""The stand-in runtime hook (tritonfleet_testbed/standin/nvidia-container-runtime-hook.py) puts
the stand-in driver's libcuda.so.1 and its fault switch into a --gpus container as the real hook
mounts the driver's libraries, except into a container that runs tritonserver (the stand-in image's
CPU build would take it for a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tritonfleet_testbed.standin_repo import STANDIN


def prestart(tmp_path, args: list[str], with_lib: bool = True, fault: str | None = "590\n"):
    host = tmp_path / "host"
    for d in ("etc/nvidia-standin", "usr/lib/nvidia-standin", "usr/bin", "run/nvidia-standin"):
        (host / d).mkdir(parents=True, exist_ok=True)
    (host / "etc/nvidia-standin/gpu.env").write_text("GPU_NAME='NVIDIA L4'\n")
    (host / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
    if with_lib:
        (host / "usr/lib/nvidia-standin/libcuda.so.1").write_bytes(b"\x7fELF stand-in")
    if fault is not None:
        (host / "etc/nvidia-standin/cuda-fault").write_text(fault)
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "process": {
        "args": args, "env": ["NVIDIA_VISIBLE_DEVICES=all"]}}))
    res = subprocess.run([sys.executable, str(STANDIN / "nvidia-container-runtime-hook.py"), "prestart"],
                         input=json.dumps({"id": "c1", "bundle": str(bundle)}), capture_output=True, text=True,
                         env={"NVIDIA_STANDIN_ROOT": str(host), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    return bundle / "rootfs"


@pytest.mark.parametrize("args", [["python3", "-"], ["sh", "-c", "nvidia-smi"]])
def test_a_cuda_program_gets_the_drivers_library_and_its_fault_switch(tmp_path, args):
    root = prestart(tmp_path, args)
    assert (root / "usr/lib/x86_64-linux-gnu/libcuda.so.1").read_bytes() == b"\x7fELF stand-in"
    assert (root / "etc/nvidia-standin/cuda-fault").read_text() == "590\n"
    assert (root / "usr/bin/nvidia-smi").is_file()


def test_tritonserver_gets_no_libcuda(tmp_path):
    root = prestart(tmp_path, ["/opt/nvidia/nvidia_entrypoint.sh", "tritonserver", "--model-repository=/models"])
    assert not (root / "usr/lib/x86_64-linux-gnu/libcuda.so.1").exists()
    assert (root / "usr/bin/nvidia-smi").is_file()  # nvidia-smi as before


def test_a_driver_without_the_library_gives_none(tmp_path):
    root = prestart(tmp_path, ["python3", "-"], with_lib=False, fault=None)
    assert not (root / "usr/lib/x86_64-linux-gnu/libcuda.so.1").exists()
    assert not (root / "etc/nvidia-standin/cuda-fault").exists()
