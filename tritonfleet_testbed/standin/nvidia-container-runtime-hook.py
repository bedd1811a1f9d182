#!/usr/bin/python3
"""Stand-in nvidia-container-runtime-hook of the testbed's NVIDIA Container Toolkit packages.

dockerd adds it as an OCI prestart hook (args ``nvidia-container-runtime-hook prestart``) to
containers run with ``--gpus``, with NVIDIA_VISIBLE_DEVICES in the container's environment.
The real hook has nvidia-container-cli mount the host's driver files into the container; on
the testbed the "driver" is the stand-in nvidia-smi and the "GPU" the host's
/etc/nvidia-standin/gpu.env, so both (and the loaded-module state) are copied into the
container's root filesystem.  It reads the OCI state (JSON, with "bundle") on stdin and
<bundle>/config.json (root.path, process.env).

A host whose installed driver cannot answer for the stand-in GPU (Debian's real packages on a
test host: no GPU, no module) can be given the stand-in's answer at
/usr/lib/nvidia-standin/answer/nvidia-smi by a test (standin_repo.ANSWER_PATH, with the deploy's
nvidia_smi_command pointed at it): that file is then the "driver's nvidia-smi" copied into the
container, as the host's own is elsewhere.
"""

import json
import os
import shutil
import sys

ROOT = os.environ.get("NVIDIA_STANDIN_ROOT", "")
HOST_SMI = [ROOT + "/usr/lib/nvidia-standin/answer/nvidia-smi", ROOT + "/usr/bin/nvidia-smi", ROOT + "/bin/nvidia-smi"]
GPU_ENV = "/etc/nvidia-standin/gpu.env"
# the driver's libcuda.so.1 (the stand-in driver packages' build of libcuda-standin.c), mounted where
# the real hook mounts the driver's libraries, and its fault switch. Not into a container that runs
# tritonserver: the stand-in image's tritonserver is a CPU build whose CUDA runtime would take the
# stand-in for a GPU it cannot use (it answers only what tritonfleet.gpu.cuda_check's program calls)
HOST_LIBCUDA = [ROOT + "/usr/lib/nvidia-standin/answer/libcuda.so.1", ROOT + "/usr/lib/nvidia-standin/libcuda.so.1"]
CUDA_FAULT = "/etc/nvidia-standin/cuda-fault"
MODULE_FILE = "/run/nvidia-standin/module-version"
GPU_CONTAINERS = "/run/nvidia-standin/gpu-containers"


def fail(msg: str) -> int:
    sys.stderr.write("Auto-detected mode as 'legacy'\n")
    sys.stderr.write(f"nvidia-container-cli: {msg}\n")
    return 1


def secure_join(root: str, path: str) -> str:
    """``path`` inside ``root``, following symlinks as if ``root`` were '/'."""
    parts = [p for p in path.split("/") if p and p != "."]
    current = root
    depth = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            current = os.path.dirname(current) if current != root else root
            continue
        candidate = os.path.join(current, part)
        if os.path.islink(candidate):
            depth += 1
            if depth > 40:
                raise OSError(f"too many symlinks below {root}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = root
            parts = [p for p in target.split("/") if p and p != "."] + parts
            continue
        current = candidate
    return current


def install(src: str, rootfs: str, dest: str, mode: int) -> None:
    target = secure_join(rootfs, dest)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = target + ".nvidia-tmp"
    shutil.copyfile(src, tmp)
    os.chmod(tmp, mode)
    os.replace(tmp, target)


def prestart() -> int:
    try:
        state = json.load(sys.stdin)
        bundle = state["bundle"]
        with open(os.path.join(bundle, "config.json"), encoding="utf-8") as f:
            spec = json.load(f)
    except (ValueError, KeyError, OSError) as e:
        sys.stderr.write(f"could not load OCI state or bundle config: {e}\n")
        return 1
    env = {}
    for item in (spec.get("process") or {}).get("env") or []:
        key, _, value = item.partition("=")
        env[key] = value
    devices = env.get("NVIDIA_VISIBLE_DEVICES")
    if devices is None:
        devices = "all" if env.get("CUDA_VERSION") or env.get("NVIDIA_REQUIRE_CUDA") else ""
    if devices in ("", "void"):
        return 0
    rootfs = (spec.get("root") or {}).get("path") or "rootfs"
    if not os.path.isabs(rootfs):
        rootfs = os.path.join(bundle, rootfs)
    smi = next((p for p in HOST_SMI if os.path.isfile(p)), None)
    if smi is None:
        return fail("initialization error: load library failed: libnvidia-ml.so.1: cannot open "
                    "shared object file: no such file or directory")
    gpu_env = ROOT + GPU_ENV
    if not os.path.isfile(gpu_env):
        return fail("initialization error: nvml error: driver not loaded")
    install(smi, rootfs, "/usr/bin/nvidia-smi", 0o755)
    install(gpu_env, rootfs, GPU_ENV, 0o644)
    libcuda = next((p for p in HOST_LIBCUDA if os.path.isfile(p)), None)
    args = (spec.get("process") or {}).get("args") or []
    if libcuda and not any(os.path.basename(str(a)) == "tritonserver" for a in args):
        install(libcuda, rootfs, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0o755)
    if os.path.isfile(ROOT + CUDA_FAULT):
        install(ROOT + CUDA_FAULT, rootfs, CUDA_FAULT, 0o644)
    if os.path.isfile(ROOT + MODULE_FILE):
        install(ROOT + MODULE_FILE, rootfs, MODULE_FILE, 0o644)
    # remembered for the stand-in of systemd's device rules (nvidia-standin-device-rules)
    cid = "".join(c for c in str(state.get("id", "")) if c.isalnum() or c in "-_.") or "unknown"
    os.makedirs(ROOT + GPU_CONTAINERS, exist_ok=True)
    with open(os.path.join(ROOT + GPU_CONTAINERS, cid), "w", encoding="utf-8") as f:
        f.write(rootfs + "\n")
    return 0


def main(argv) -> int:
    args = [a for a in argv if not a.startswith("-")]
    if "--version" in argv or "-version" in argv:
        print("NVIDIA Container Runtime Hook version @TOOLKIT_VERSION@")
        return 0
    command = args[0] if args else ""
    if command == "prestart":
        return prestart()
    if command in ("poststart", "poststop"):
        return 0
    sys.stderr.write(f"ERROR: unknown command {command!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
