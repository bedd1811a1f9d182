"""The CUDA validation's program (tritonfleet.gpu.cuda_check) against the testbed's stand-in
libcuda.so.1 (tritonfleet_testbed/standin/libcuda-standin.c, built with the machine's C compiler
as the stand-in driver packages build it), run by python3 as the container runs it; and its PTX
assembled by NVIDIA's own ptxas for the oldest and newest GPU classes we serve."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritonfleet.gpu import cuda_check
from tritonfleet_testbed.standin_repo import STANDIN


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory):
    out = tmp_path_factory.mktemp("libcuda") / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", '-DSTANDIN_DRIVER_VERSION="580.82.07"',
                    "-o", str(out), str(STANDIN / "libcuda-standin.c")], check=True)
    return out


def run(libcuda: Path, root: Path, gpu_env: str | None, fault: str | None = None, loaded: str | None = None):
    (root / "etc/nvidia-standin").mkdir(parents=True, exist_ok=True)
    (root / "run/nvidia-standin").mkdir(parents=True, exist_ok=True)
    for rel, text in (("etc/nvidia-standin/gpu.env", gpu_env), ("etc/nvidia-standin/cuda-fault", fault),
                      ("run/nvidia-standin/module-version", loaded)):
        p = root / rel
        if text is None:
            p.unlink(missing_ok=True)
        else:
            p.write_text(text)
    res = subprocess.run([sys.executable, "-"], input=cuda_check.PROGRAM, capture_output=True, text=True,
                         timeout=120, env={"LD_LIBRARY_PATH": str(libcuda.parent), "NVIDIA_STANDIN_ROOT": str(root),
                                           "PATH": "/usr/bin:/bin"})
    return res.returncode, cuda_check.parse(res.stdout + res.stderr)


def test_every_gpu_passes_and_a_fault_on_the_loaded_branch_fails(libcuda, tmp_path):
    rc, res = run(libcuda, tmp_path, "GPU_NAME='NVIDIA L4'\nGPU_COUNT=4\n")
    assert rc == 0 and res.passed and res.gpus == 4, res.lines
    assert any("196 blocks of 256 threads" in ln for ln in res.lines)  # NVIDIA's vectorAdd sample's launch
    assert "CUDA driver API 13.0, 4 device(s)" in res.lines
    # a kernel that faults under the branch the host loaded: a launch failure on every GPU
    rc, res = run(libcuda, tmp_path, "GPU_NAME='Tesla T4'\n", fault="590\n", loaded="590.44.01\n")
    assert rc == 1 and not res.passed and "CUDA_ERROR_LAUNCH_FAILED (719)" in res.reason
    # the same fault does not touch another branch
    rc, res = run(libcuda, tmp_path, "GPU_NAME='Tesla T4'\n", fault="590\n", loaded="580.82.07\n")
    assert rc == 0 and res.passed
    # wrong sums are caught by the program's own comparison, not only launch errors
    rc, res = run(libcuda, tmp_path, "GPU_NAME='Tesla T4'\n", fault="wrong\n")
    assert not res.passed and "sums wrong" in res.reason
    # no GPU: the driver says so
    rc, res = run(libcuda, tmp_path, None)
    assert not res.passed and "CUDA_ERROR_NO_DEVICE (100)" in res.reason


def test_no_libcuda_in_the_container_is_a_failure_naming_it(tmp_path):
    """A container without the driver's library (the Container Toolkit did not mount it)."""
    res = subprocess.run([sys.executable, "-"], input=cuda_check.PROGRAM, capture_output=True, text=True,
                         env={"LD_LIBRARY_PATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    parsed = cuda_check.parse(res.stdout)
    assert res.returncode == 1 and not parsed.passed and "cannot load libcuda.so.1" in parsed.reason


@pytest.mark.parametrize("arch", ["sm_75", "sm_89", "sm_90"])  # T4, L4, H100/H200
def test_ptxas_assembles_the_kernel(arch, tmp_path):
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    assert Path(ptxas).is_file(), "NVIDIA's ptxas (CUDA toolkit) is needed to check the PTX"
    src = tmp_path / "vectorAdd.ptx"
    src.write_text(cuda_check.PTX)
    res = subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(tmp_path / "out.cubin")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
