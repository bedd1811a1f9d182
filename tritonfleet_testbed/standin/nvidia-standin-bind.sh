#!/bin/sh
# Stand-in of the kernel's "driver bound" uevent and udev at boot: when the NVIDIA driver binds to
# the GPU, the kernel sends ACTION=add for DEVPATH=/bus/pci/drivers/nvidia and udev runs the RUN+=
# commands of the rules that match it (udev(7)); the test hosts (containers) run no udevd. Here:
# the RUN+= commands of every rule line matching both, from /etc/udev/rules.d, /lib/udev/rules.d
# and /usr/lib/udev/rules.d, once per boot, when a GPU is there and nouveau does not hold it.
ROOT="${NVIDIA_STANDIN_ROOT:-}"
[ -r "$ROOT/etc/nvidia-standin/gpu.env" ] || exit 0
if grep -qs '^NOUVEAU="*1' "$ROOT/etc/nvidia-standin/gpu.env" && \
   ! grep -ls '^blacklist nouveau' "$ROOT"/etc/modprobe.d/*.conf >/dev/null 2>&1; then
    exit 0
fi
for f in "$ROOT"/etc/udev/rules.d/*.rules "$ROOT"/lib/udev/rules.d/*.rules "$ROOT"/usr/lib/udev/rules.d/*.rules; do
    [ -f "$f" ] || continue
    grep -E 'ACTION=="add"' "$f" | grep -F 'DEVPATH=="/bus/pci/drivers/nvidia"' | \
        sed -n 's/.*RUN+="\([^"]*\)".*/\1/p'
done | sort -u | while read -r cmd; do
    sh -c "$cmd" || echo "nvidia-standin-bind: '$cmd' failed" >&2
done
exit 0
