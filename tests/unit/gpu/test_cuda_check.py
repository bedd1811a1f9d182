"""The CUDA validation's text (tritonfleet.gpu.cuda_check): the program survives the shell as sent,
and any output parses to a result that passes only on the program's own PASSED lines."""

from __future__ import annotations

import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet.core.shell import q
from tritonfleet.gpu import cuda_check

GPU = "GPU 0 (NVIDIA L4): vectorAdd of 50000 elements with 196 blocks of 256 threads: PASSED"


def test_the_program_reaches_the_container_byte_for_byte():
    """What `printf '%s' <program>` gives docker's standard input is the program (quotes, percent
    signs and backslashes of the PTX and the Python intact)."""
    out = subprocess.run(["sh", "-c", f"printf '%s' {q(cuda_check.PROGRAM)}"], capture_output=True, text=True,
                         check=True).stdout
    assert out == cuda_check.PROGRAM
    compile(out, "<cuda_check>", "exec")  # valid Python for the container's python3
    assert repr(cuda_check.PTX) in out and f"N = {cuda_check.ELEMENTS}" in out


def test_the_programs_own_answers_parse():
    ok = cuda_check.parse(f"{GPU}\nCUDA driver API 12.8, 1 device(s)\nTest PASSED\n")
    assert ok.passed and ok.gpus == 1 and ok.reason == ""
    bad = cuda_check.parse("GPU 0 (NVIDIA L4): vectorAdd of 50000 elements: FAILED: cuLaunchKernel: "
                           "CUDA_ERROR_LAUNCH_FAILED (719)\nTest FAILED: GPU 0 (NVIDIA L4)\n")
    assert not bad.passed and "CUDA_ERROR_LAUNCH_FAILED" in bad.reason
    docker = cuda_check.parse("docker: Error response from daemon: could not select device driver \"\" with "
                              "capabilities: [[gpu]].\n")
    assert not docker.passed and docker.reason.startswith("the program did not finish: docker: Error")
    assert cuda_check.parse("").reason.startswith("no output")
    # a PASSED with no GPU line (or a FAILED before it) is not a pass
    assert not cuda_check.parse("Test PASSED\n").passed
    assert not cuda_check.parse(f"{GPU}\nTest FAILED: GPU 1\nTest PASSED\n").passed


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.one_of(st.text(max_size=80), st.sampled_from([GPU, "Test PASSED", "Test FAILED: x"])),
                      max_size=8))
def test_any_output_parses_and_passes_only_on_its_last_line(lines):
    res = cuda_check.parse("\n".join(lines))
    clean = [ln.rstrip() for ln in "\n".join(lines).splitlines() if ln.strip()]
    if res.passed:
        assert clean[-1] == "Test PASSED" and res.gpus >= 1 and not any(ln.startswith("Test FAILED") for ln in clean)
    else:
        assert res.reason and len(res.reason) <= 600
