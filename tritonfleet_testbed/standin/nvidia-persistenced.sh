#!/bin/sh
# Stand-in nvidia-persistenced of the testbed's driver packages: forks a daemon that holds the
# (stand-in) driver open, as the real one keeps the GPU initialized. Fails, like the real one,
# when the driver cannot be reached (no GPU: no /etc/nvidia-standin/gpu.env).
DRIVER_VERSION='@DRIVER_VERSION@'
ROOT="${NVIDIA_STANDIN_ROOT:-}"
GPU_ENV="$ROOT/etc/nvidia-standin/gpu.env"
MODULE_FILE="$ROOT/run/nvidia-standin/module-version"
RUN_DIR="$ROOT/var/run/nvidia-persistenced"
user='' persistence=Enabled
while [ $# -gt 0 ]; do
    case "$1" in
        -u|--user) user=$2; shift ;;
        --user=*) user=${1#--user=} ;;
        --persistence-mode) persistence=Enabled ;;
        --no-persistence-mode) persistence=Disabled ;;
        -v|--version) echo "nvidia-persistenced:  version $DRIVER_VERSION"; exit 0 ;;
    esac
    shift
done
fail() {
    logger -t nvidia-persistenced "$1" 2>/dev/null || echo "nvidia-persistenced: $1" >&2
    echo "nvidia-persistenced failed to initialize. Check syslog for more details." >&2
    exit 1
}
[ -r "$GPU_ENV" ] || fail "Failed to query NVIDIA devices. Please ensure that the NVIDIA device files exist and have proper permissions."
NOUVEAU=0
# shellcheck disable=SC1090
. "$GPU_ENV"
loaded=''
[ -r "$MODULE_FILE" ] && read -r loaded < "$MODULE_FILE"
if [ -z "$loaded" ] && [ "$NOUVEAU" = 1 ] && ! "${NVIDIA_SMI:-nvidia-smi}" -L >/dev/null 2>&1; then
    fail "Failed to query NVIDIA devices. Please ensure that the NVIDIA device files exist and have proper permissions."
fi
[ -r "$MODULE_FILE" ] && read -r loaded < "$MODULE_FILE"
if [ -z "$loaded" ]; then
    { mkdir -p "${MODULE_FILE%/*}" && echo "$DRIVER_VERSION" > "$MODULE_FILE"; } 2>/dev/null
    [ -x "$ROOT/usr/lib/nvidia-standin/load-module" ] && "$ROOT/usr/lib/nvidia-standin/load-module" >/dev/null 2>&1
elif [ "$loaded" != "$DRIVER_VERSION" ]; then
    fail "Failed to initialize NVML: Driver/library version mismatch"
fi
mkdir -p "$RUN_DIR" || fail "Failed to create $RUN_DIR"
PERSISTENCE_FILE="$ROOT/run/nvidia-standin/persistence-mode"
mkdir -p "${PERSISTENCE_FILE%/*}" && echo "$persistence" > "$PERSISTENCE_FILE"
[ -n "$user" ] && chown "$user" "$RUN_DIR" 2>/dev/null
(
    # its sleep goes with it (outside systemd's cgroup, e.g. in the fast tests, it was left behind);
    # KILL, not TERM: a TERM reaching the sleep between dash's fork and its exec is lost (dash's
    # own handler is still installed there), which left 1 sleep in 300 on a loaded machine
    trap 'kill -KILL $! 2>/dev/null; rm -f "$RUN_DIR/nvidia-persistenced.pid" "$PERSISTENCE_FILE"; exit 0' TERM INT
    while :; do sleep 3600 & wait $!; done
) </dev/null >/dev/null 2>&1 &
echo $! > "$RUN_DIR/nvidia-persistenced.pid"
echo "Started ($!)"
exit 0
