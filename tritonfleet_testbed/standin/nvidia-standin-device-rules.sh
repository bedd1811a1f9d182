#!/bin/sh
# Stand-in of what systemd does to running GPU containers at `systemctl daemon-reload` (a
# systemd generator: generators run at every daemon-reload and at boot). NVIDIA's notice
# (NVIDIA/nvidia-docker#1730): with the systemd cgroup driver, a daemon-reload re-applies each
# container's device rules, and runc needs a /dev/char/<major>:<minor> symlink for a device node to
# keep it; NVIDIA's device nodes have none unless `nvidia-ctk system create-dev-char-symlinks` made
# them, and the container's nvidia-smi then fails with "Failed to initialize NVML: Unknown Error"
# until the container is re-created. Here: without the nvidiactl link (/dev/char/195:255), every
# container the stand-in hook gave GPUs (/run/nvidia-standin/gpu-containers/<id>: its root
# filesystem) gets /run/nvidia-standin/devices-lost, which the stand-in nvidia-smi reports.
ROOT="${NVIDIA_STANDIN_ROOT:-}"
REC="$ROOT/run/nvidia-standin/gpu-containers"
[ -d "$REC" ] || exit 0
for f in "$REC"/*; do
    [ -f "$f" ] || continue
    read -r rootfs < "$f" || true
    if [ -z "$rootfs" ] || [ ! -d "$rootfs/usr" ]; then
        rm -f "$f"   # that container is gone
        continue
    fi
    if [ ! -L "$ROOT/dev/char/195:255" ]; then
        mkdir -p "$rootfs/run/nvidia-standin" 2>/dev/null && : > "$rootfs/run/nvidia-standin/devices-lost"
    fi
done
exit 0
