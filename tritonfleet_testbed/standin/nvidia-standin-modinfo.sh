#!/bin/sh
# Stand-in modinfo(8) for the stand-in NVIDIA module, installed as /usr/local/sbin/modinfo (before
# kmod's /sbin/modinfo on root's PATH) by the stand-in DKMS packages: `modinfo [-F field] nvidia`
# answers from the placeholder module DKMS "built" for the running kernel
# (/lib/modules/<uname -r>/updates/dkms/nvidia.ko, lines "field:  value" as modinfo prints them);
# anything else goes to the real modinfo. Like the real one: no module -> "modinfo: ERROR: Module
# nvidia not found." on stderr, exit 1; -F prints the field's value alone.
ROOT="${NVIDIA_STANDIN_ROOT:-}"
field=''
module=''
while [ $# -gt 0 ]; do
    case "$1" in
        -F) field=$2; shift ;;
        --field=*) field=${1#--field=} ;;
        -*) ;;
        *) module=$1 ;;
    esac
    shift
done
if [ "$module" != nvidia ]; then
    for m in /usr/sbin/modinfo /sbin/modinfo; do
        [ -x "$m" ] && exec "$m" "$@"
    done
    echo "modinfo: ERROR: Module $module not found." >&2
    exit 1
fi
f="$ROOT/lib/modules/$(uname -r)/updates/dkms/nvidia.ko"
if [ ! -r "$f" ]; then
    echo "modinfo: ERROR: Module nvidia not found." >&2
    exit 1
fi
if [ -n "$field" ]; then
    sed -n "s/^$field: *//p" "$f"
else
    echo "filename:       /lib/modules/$(uname -r)/updates/dkms/nvidia.ko"
    grep -E '^[a-z]+: ' "$f"
fi
exit 0
