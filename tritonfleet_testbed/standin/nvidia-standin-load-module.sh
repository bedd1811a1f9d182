#!/bin/sh
# Stand-in of loading the NVIDIA kernel module (run by the stand-in nvidia-smi and
# nvidia-persistenced when they are the first to use the driver after boot): the loaded module
# shows itself in /proc/driver/nvidia/version, whose first line names its flavour (open: "NVRM
# version: NVIDIA UNIX Open Kernel Module for x86_64  <version>  Release Build  (<builder>)  <date>";
# proprietary: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  <version>  <date>", as captured from
# real hosts in public reports). The test hosts are containers and cannot add files to procfs: a
# small tmpfs is mounted over their empty /proc/driver for it (gone at the next boot, as the loaded
# module is). The module loaded is the one installed for the running kernel (its licence says
# which flavour it is: nvidia-standin-dkms.sh).
ROOT="${NVIDIA_STANDIN_ROOT:-}"
mod="$ROOT/lib/modules/$(uname -r)/updates/dkms/nvidia.ko"
[ -r "$mod" ] || exit 0
version=$(sed -n 's/^version: *//p' "$mod")
license=$(sed -n 's/^license: *//p' "$mod")
if [ -z "$ROOT" ] && ! grep -qs ' /proc/driver tmpfs ' /proc/mounts; then
    mount -t tmpfs -o size=64k,mode=0555 nvidia-standin /proc/driver 2>/dev/null || exit 0
fi
mkdir -p "$ROOT/proc/driver/nvidia" || exit 0
when=$(date -u '+%a %b %e %H:%M:%S UTC %Y')
case "$license" in
    *MIT*|*GPL*) line="NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  $version  Release Build  (testbed@tritonfleet)  $when" ;;
    *) line="NVRM version: NVIDIA UNIX x86_64 Kernel Module  $version  $when" ;;
esac
printf '%s\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n' "$line" > "$ROOT/proc/driver/nvidia/version"
exit 0
