#!/bin/sh
# Stand-in of DKMS for the stand-in driver's module: "builds" the NVIDIA module for a kernel whose
# headers are installed (/lib/modules/<kernel>/build), as `dkms autoinstall` does for a registered
# module: the module lands in /lib/modules/<kernel>/updates/dkms/ (DKMS's install location on
# Debian and Ubuntu). Called as Debian's dkms hooks are: with the kernel version as first argument
# from /etc/kernel/header_postinst.d (headers installed) and /etc/kernel/postinst.d (kernel
# installed); with no argument (the driver package's postinst) for every kernel with headers.
# The version built is the driver's, baked in when the package is made, and so is the flavour
# (nvidia-kernel-dkms / nvidia-dkms-<branch>: proprietary; nvidia-kernel-open-dkms /
# nvidia-dkms-<branch>-open: open). The placeholder module holds modinfo's fields for it: the
# licence the real module declares (open: "Dual MIT/GPL", NVIDIA's open-gpu-kernel-modules;
# proprietary: "NVIDIA"), read by the stand-in modinfo (nvidia-standin-modinfo.sh).
VERSION='@DRIVER_VERSION@'
LICENSE='@LICENSE@'
DESCRIPTION='@DESCRIPTION@'
ROOT="${NVIDIA_STANDIN_ROOT:-}"
build() {
    k=$1
    if [ ! -e "$ROOT/lib/modules/$k/build" ]; then
        echo "nvidia-standin-dkms: no headers for kernel $k (/lib/modules/$k/build): nvidia $VERSION not built" >&2
        return 0
    fi
    mkdir -p "$ROOT/lib/modules/$k/updates/dkms"
    printf 'stand-in nvidia kernel module %s for %s\nversion:        %s\nlicense:        %s\ndescription:    %s\n' \
        "$VERSION" "$k" "$VERSION" "$LICENSE" "$DESCRIPTION" > "$ROOT/lib/modules/$k/updates/dkms/nvidia.ko"
    echo "nvidia-standin-dkms: nvidia $VERSION built and installed for kernel $k"
}
if [ "${1:-}" = remove ]; then
    # the package's prerm: DKMS removes the module it installed (dkms remove)
    rm -f "$ROOT"/lib/modules/*/updates/dkms/nvidia.ko
elif [ -n "${1:-}" ]; then
    build "$1"
else
    for d in "$ROOT"/lib/modules/*/build; do
        [ -e "$d" ] || continue
        k=${d%/build}
        build "${k##*/}"
    done
fi
exit 0
