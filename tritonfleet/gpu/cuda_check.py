"""A real CUDA kernel on every GPU of a host, in a container: the validation after a driver or
Container Toolkit change (`nvidia-smi` answering is not enough: the GPU Operator's validator runs
CUDA's vectorAdd sample for the same reason).

The program is Python's standard library only (``ctypes`` over the driver API in
``libcuda.so.1``, which the Container Toolkit mounts into any ``--gpus`` container) and a
vectorAdd kernel in PTX that the driver compiles for the GPU it finds, so it runs in the Triton
image the host already has: no compiler, no CUDA runtime, no extra image. It prints one line a
GPU and, last, ``Test PASSED`` or ``Test FAILED: <why>`` as NVIDIA's sample does.

Pure text and parsing; the rollout (tritonfleet.fleet.rollout.driver) sends it and decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.shell import q

#: elements added on each GPU (NVIDIA's vectorAdd sample adds 50,000)
ELEMENTS = 50000

#: vectorAdd (c[i] = a[i] + b[i]) in PTX ISA 6.4 for sm_75 (T4, the oldest class we know) and
#: newer: every driver from R440 JIT-compiles it for the GPU it runs on (ptxas 13.0 assembles
#: it for sm_75 and sm_89: tests/integration/gpu/test_cuda_check.py)
PTX = r"""
.version 6.4
.target sm_75
.address_size 64

.visible .entry vectorAdd(
    .param .u64 vectorAdd_a,
    .param .u64 vectorAdd_b,
    .param .u64 vectorAdd_c,
    .param .u32 vectorAdd_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [vectorAdd_a];
    ld.param.u64 %rd2, [vectorAdd_b];
    ld.param.u64 %rd3, [vectorAdd_c];
    ld.param.u32 %r2, [vectorAdd_n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.u32 %rd7, %r1, 4;
    add.s64 %rd8, %rd4, %rd7;
    add.s64 %rd9, %rd5, %rd7;
    add.s64 %rd10, %rd6, %rd7;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd9];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}
"""

#: the program run inside the container (python3, standard library only)
PROGRAM = r"""
import ctypes, sys

PTX = @PTX@
N = @N@
c_u64, c_int, c_uint = ctypes.c_uint64, ctypes.c_int, ctypes.c_uint


def main():
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print("Test FAILED: cannot load libcuda.so.1 (%s): the driver's library is not in the container" % e)
        return 1

    def name(rc):
        s = ctypes.c_char_p()
        cu.cuGetErrorName(rc, ctypes.byref(s))
        return "%s (%d)" % ((s.value or b"CUDA_ERROR_UNKNOWN").decode(), rc)

    def call(fn, *args):
        rc = getattr(cu, fn)(*args)
        if rc:
            raise RuntimeError("%s: %s" % (fn, name(rc)))

    try:
        call("cuInit", 0)
        version, count = c_int(), c_int()
        call("cuDriverGetVersion", ctypes.byref(version))
        call("cuDeviceGetCount", ctypes.byref(count))
    except RuntimeError as e:
        print("Test FAILED: %s" % e)
        return 1
    if count.value < 1:
        print("Test FAILED: no CUDA device")
        return 1
    size = N * 4
    a = (ctypes.c_float * N)(*[i * 0.5 for i in range(N)])
    b = (ctypes.c_float * N)(*[(N - i) * 0.25 for i in range(N)])
    failed = []
    for index in range(count.value):
        dev, ctx, mod, fn = c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        label = "GPU %d" % index
        try:
            call("cuDeviceGet", ctypes.byref(dev), index)
            raw = ctypes.create_string_buffer(256)
            call("cuDeviceGetName", raw, 256, dev)
            label = "GPU %d (%s)" % (index, raw.value.decode(errors="replace"))
            call("cuCtxCreate_v2", ctypes.byref(ctx), 0, dev)
            try:
                call("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(PTX.encode()))
                call("cuModuleGetFunction", ctypes.byref(fn), mod, b"vectorAdd")
                da, db, dc = c_u64(), c_u64(), c_u64()
                for d in (da, db, dc):
                    call("cuMemAlloc_v2", ctypes.byref(d), ctypes.c_size_t(size))
                call("cuMemcpyHtoD_v2", da, a, ctypes.c_size_t(size))
                call("cuMemcpyHtoD_v2", db, b, ctypes.c_size_t(size))
                n = c_uint(N)
                params = (ctypes.c_void_p * 4)(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in (da, db, dc, n)])
                threads = 256
                blocks = (N + threads - 1) // threads
                call("cuLaunchKernel", fn, c_uint(blocks), c_uint(1), c_uint(1), c_uint(threads), c_uint(1), c_uint(1),
                     c_uint(0), ctypes.c_void_p(), params, ctypes.c_void_p())
                call("cuCtxSynchronize")
                c = (ctypes.c_float * N)()
                call("cuMemcpyDtoH_v2", c, dc, ctypes.c_size_t(size))
                wrong = [i for i in range(N) if abs(c[i] - (a[i] + b[i])) > 1e-3]
                if wrong:
                    raise RuntimeError("%d of %d sums wrong (first at %d: %r, not %r)"
                                       % (len(wrong), N, wrong[0], c[wrong[0]], a[wrong[0]] + b[wrong[0]]))
            finally:
                cu.cuCtxDestroy_v2(ctx)
        except RuntimeError as e:
            failed.append(label)
            print("%s: vectorAdd of %d elements: FAILED: %s" % (label, N, e))
            continue
        print("%s: vectorAdd of %d elements with %d blocks of %d threads: PASSED" % (label, N, blocks, threads))
    print("CUDA driver API %d.%d, %d device(s)" % (version.value // 1000, version.value % 1000 // 10, count.value))
    if failed:
        print("Test FAILED: %s" % ", ".join(failed))
        return 1
    print("Test PASSED")
    return 0


sys.exit(main())
""".replace("@PTX@", repr(PTX)).replace("@N@", str(ELEMENTS))

#: how long the container may take (image start, PTX compile, one kernel per GPU)
TIMEOUT = 120


def command(image: str) -> str:
    """Shell running PROGRAM on every GPU inside ``image`` (its ``python3``), through the
    Container Toolkit like Triton's own container: ``--gpus all``, no network, the program on
    standard input (nothing written on the host)."""
    return (
        f"printf '%s' {q(PROGRAM)} | timeout {TIMEOUT} docker run --rm -i --gpus all --network none "
        f"--entrypoint python3 {q(image)} - 2>&1"
    )


@dataclass(frozen=True)
class CudaResult:
    """What the program said: passed, the GPUs it ran on, and the reason when it did not pass."""

    passed: bool
    gpus: int
    reason: str
    lines: tuple[str, ...]


_GPU_LINE = re.compile(r"^GPU \d+\b.*: vectorAdd of \d+ elements")


def parse(text: str) -> CudaResult:
    """The result from the program's output (or whatever docker printed instead)."""
    lines = tuple(ln.rstrip() for ln in text.splitlines() if ln.strip())
    gpus = sum(1 for ln in lines if _GPU_LINE.match(ln))
    last = lines[-1] if lines else ""
    if last == "Test PASSED" and gpus and not any(ln.startswith("Test FAILED") for ln in lines):
        return CudaResult(True, gpus, "", lines)
    failed = [ln for ln in lines if ": FAILED: " in ln or ln.startswith("Test FAILED")]
    if failed:
        reason = "; ".join(failed)
    elif lines:
        reason = "the program did not finish: " + " | ".join(lines[-3:])
    else:
        reason = "no output (docker or the image could not run the program)"
    return CudaResult(False, gpus, reason[:600], lines)
