#!/bin/sh
# Stand-in nvidia-smi of the testbed's driver packages (POSIX sh: it also runs in busybox-only
# containers). Driver and CUDA version are fixed when the package is built; the "hardware" is
# /etc/nvidia-standin/gpu.env (absent: no GPU, the driver cannot talk to a device).
# Output follows real nvidia-smi captures (see tests/fixtures/nvidia/SOURCES.md).
DRIVER_VERSION='@DRIVER_VERSION@'
CUDA_VERSION='@CUDA_VERSION@'
ROOT="${NVIDIA_STANDIN_ROOT:-}"
GPU_ENV="$ROOT/etc/nvidia-standin/gpu.env"
MODULE_FILE="$ROOT/run/nvidia-standin/module-version"

no_driver() {
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
    echo
    exit 9
}

[ -r "$GPU_ENV" ] || no_driver

# A container whose device access systemd dropped at a daemon-reload (NVIDIA/nvidia-docker#1730;
# the in-container output as in NVIDIA/nvidia-container-toolkit#1227): the stand-in generator of
# the toolkit package leaves this file in such a container's root filesystem. Exit 255: "other
# error" in nvidia-smi's manual page (RETURN VALUE).
if [ -e "$ROOT/run/nvidia-standin/devices-lost" ]; then
    echo "Failed to initialize NVML: Unknown Error"
    exit 255
fi

GPU_NAME='' GPU_UUID='' PCI_BUS_ID='' MEMORY_MIB='' COMPUTE_CAP=''
# Several GPUs of one model (a 4x T4 or 4x L4 host): GPU_COUNT, with their bus ids and UUIDs in
# GPU_BUS_IDS and GPU_UUIDS (space-separated, in bus order); GPU_MISSING lists the positions
# (0-based, in that order) of GPUs that fell off the bus: nvidia-smi numbers the ones left 0..n-1.
GPU_COUNT=1 GPU_BUS_IDS='' GPU_UUIDS='' GPU_MISSING=''
PERSISTENCE_MODE=Off DISPLAY_ACTIVE=Off ECC_ERRORS=0 FAN=N/A TEMPERATURE_C=40 PERF_STATE=P0
POWER_DRAW_W=27 POWER_LIMIT_W=72 MEMORY_USED_MIB=0 UTILIZATION_GPU=0 COMPUTE_MODE=Default MIG_MODE=N/A
# The health fields (`--query-gpu` of the GPU telemetry; their meaning: nvidia-smi --help-query-gpu,
# tests/fixtures/nvidia-real-h200-580-health/help-query-gpu.txt). An idle, healthy GPU unless
# gpu.env says otherwise (the testbed's fault injection writes these): clock event reasons
# Active / Not Active, ECC counts, retired pages and remapped rows ([N/A]: not reported by this GPU).
MEMORY_TEMPERATURE_C='[N/A]' SM_CLOCK_MHZ=300 SM_CLOCK_MAX_MHZ=1590
REASON_GPU_IDLE=Active REASON_SW_POWER_CAP='Not Active' REASON_HW_SLOWDOWN='Not Active'
REASON_SW_THERMAL_SLOWDOWN='Not Active' REASON_HW_THERMAL_SLOWDOWN='Not Active'
REASON_HW_POWER_BRAKE_SLOWDOWN='Not Active'
PCIE_GEN=3 PCIE_GEN_MAX=3 PCIE_WIDTH=16 PCIE_WIDTH_MAX=16
ECC_MODE=Enabled ECC_CORRECTED_VOLATILE=0 ECC_UNCORRECTED_VOLATILE=0 ECC_CORRECTED_AGGREGATE=0
ECC_UNCORRECTED_AGGREGATE=0 RETIRED_SBE=0 RETIRED_DBE=0 RETIRED_PENDING=No
REMAPPED_CORRECTABLE='[N/A]' REMAPPED_UNCORRECTABLE='[N/A]' REMAPPED_PENDING='[N/A]' REMAPPED_FAILURE='[N/A]'
# shellcheck disable=SC1090
. "$GPU_ENV"
# A GPU reset (`nvidia-smi -r`, below) clears the volatile ECC counts and activates a pending
# row remapping (nvidia-smi's manual page, -r; NVIDIA's Xid catalog, Xid 63 "reset gpu to
# activate"): what it cleared is RESET_ENV, read while it is newer than gpu.env (a fault injected
# after the reset counts again).
RESET_ENV="$ROOT/run/nvidia-standin/reset.env"
# shellcheck disable=SC1090
if [ -r "$RESET_ENV" ] && [ "$RESET_ENV" -nt "$GPU_ENV" ]; then . "$RESET_ENV"; fi
# persistence mode: what the running nvidia-persistenced set (it writes the file)
PERSISTENCE_FILE="$ROOT/run/nvidia-standin/persistence-mode"
if [ -r "$PERSISTENCE_FILE" ]; then
    read -r pm < "$PERSISTENCE_FILE"
    if [ "$pm" = Enabled ]; then PERSISTENCE_MODE=On; else PERSISTENCE_MODE=Off; fi
fi

# nouveau claims the GPU at boot (NOUVEAU=1 in gpu.env: a host whose GPU it drives) unless it
# was blacklisted before this boot: then the NVIDIA module cannot load until a reboot, and
# nvidia-smi says it cannot communicate with the driver (not a version mismatch).
nouveau_bound() {
    [ "${NOUVEAU:-0}" = 1 ] || return 1
    f=$(grep -ls '^blacklist nouveau' "$ROOT"/etc/modprobe.d/*.conf 2>/dev/null | head -n 1)
    [ -n "$f" ] || return 0
    boot=${NVIDIA_STANDIN_BOOT_TIME:-$(awk -v t="$(awk '{print $22}' /proc/1/stat)" '/^btime/ {print int($2 + t / 100)}' /proc/stat)}
    [ "$(stat -c %Y "$f")" -ge "$boot" ]
}

# The kernel module: the first user loads the installed version; it stays loaded (a driver
# upgrade without reboot leaves the old one, as on a real host).
loaded=''
[ -r "$MODULE_FILE" ] && read -r loaded < "$MODULE_FILE"
if [ -z "$loaded" ] && nouveau_bound; then
    no_driver
fi
if [ -z "$loaded" ]; then
    { mkdir -p "${MODULE_FILE%/*}" && echo "$DRIVER_VERSION" > "$MODULE_FILE"; } 2>/dev/null
    loaded=$DRIVER_VERSION
    # the module shows itself in /proc/driver/nvidia/version (nvidia-standin-load-module.sh)
    [ -x "$ROOT/usr/lib/nvidia-standin/load-module" ] && "$ROOT/usr/lib/nvidia-standin/load-module" >/dev/null 2>&1
fi
if [ "$loaded" != "$DRIVER_VERSION" ]; then
    echo "Failed to initialize NVML: Driver/library version mismatch"
    echo "NVML library version: ${DRIVER_VERSION%.*}"
    exit 18
fi

# the GPUs present, one "bus uuid" pair a line, in bus order
nth() { n=$1; shift; [ "$n" -le "$#" ] || return 0; eval "printf '%s' \"\${$n}\""; }
present() {
    i=0
    while [ "$i" -lt "$GPU_COUNT" ]; do
        case " $GPU_MISSING " in *" $i "*) i=$((i + 1)); continue ;; esac
        # shellcheck disable=SC2086
        bus=$(nth $((i + 1)) $GPU_BUS_IDS) uuid=$(nth $((i + 1)) $GPU_UUIDS)
        echo "${bus:-$PCI_BUS_ID} ${uuid:-$GPU_UUID}"
        i=$((i + 1))
    done
}
GPUS=$(present)
if [ -z "$GPUS" ]; then
    echo "No devices were found"
    exit 6
fi
N_GPUS=$(printf '%s\n' "$GPUS" | wc -l)
# each_gpu CMD: CMD once a GPU present, with CUR_INDEX, CUR_BUS and CUR_UUID set
each_gpu() {
    CUR_INDEX=0
    while read -r CUR_BUS CUR_UUID; do
        "$@"
        CUR_INDEX=$((CUR_INDEX + 1))
    done <<EOF_GPUS
$GPUS
EOF_GPUS
}

major=${DRIVER_VERSION%%.*}
if [ "$major" -ge 550 ]; then WIDE=1; else WIDE=0; fi
# Layout changes of the wide table, from real captures: 570 (tests/fixtures/nvidia/
# smi_l4_570.133.07.txt) puts the PID column further right and leaves an empty line before the
# process table (550.54.15: a line of spaces); 580 (tests/fixtures/nvidia-real-h200-580/
# smi-plain.txt) draws the line under the version header with "+" at both ends (570: "|").
# Branches between the captures (555-565, 575) are not confirmed: they follow the older one.
if [ "$major" -ge 570 ]; then PROCS570=1; else PROCS570=0; fi
if [ "$major" -ge 580 ]; then CORNER='+'; else CORNER='|'; fi
# `nvidia-smi -q`: the column where values start (525.89.02: 42, tests/fixtures/nvidia/
# smi_q_t4_525.89.02_excerpt.txt; 580.159.04: 55, tests/fixtures/nvidia-real-h200-580/smi-q.txt;
# between them not confirmed: 42 below 580)
if [ "$major" -ge 580 ]; then QW=55; else QW=42; fi

dashes() { n=$1; s=''; while [ "$n" -gt 0 ]; do s="$s$2"; n=$((n - 1)); done; printf '%s' "$s"; }

table_gpu() {
    if [ "$WIDE" = 1 ]; then
        printf '| %3d  %-31s%-3s |   %16s %3s | %20s |\n' "$CUR_INDEX" "$GPU_NAME" "$PERSISTENCE_MODE" "$CUR_BUS" "$DISPLAY_ACTIVE" "$ECC_ERRORS"
        printf '| %3s   %3s    %-2s%16s / %5s |%11s / %9s |%8s%13s |\n' "$FAN" "${TEMPERATURE_C}C" "$PERF_STATE" \
            "${POWER_DRAW_W}W" "${POWER_LIMIT_W}W" "${MEMORY_USED_MIB}MiB" "${MEMORY_MIB}MiB" "${UTILIZATION_GPU}%" "$COMPUTE_MODE"
    else
        printf '| %3d  %-31s%-3s | %16s %3s | %20s |\n' "$CUR_INDEX" "$GPU_NAME" "$PERSISTENCE_MODE" "$CUR_BUS" "$DISPLAY_ACTIVE" "$ECC_ERRORS"
        printf '| %3s   %3s    %-2s%17s / %4s |%10s / %8s |%8s%13s |\n' "$FAN" "${TEMPERATURE_C}C" "$PERF_STATE" \
            "${POWER_DRAW_W}W" "${POWER_LIMIT_W}W" "${MEMORY_USED_MIB}MiB" "${MEMORY_MIB}MiB" "${UTILIZATION_GPU}%" "$COMPUTE_MODE"
    fi
    printf '|%s|%s|%21s |\n' "$(dashes $c1 ' ')" "$(dashes $c2 ' ')" "$MIG_MODE"
    printf '+%s+%s+%s+\n' "$(dashes $c1 -)" "$(dashes $c2 -)" "$(dashes $c3 -)"
}

table() {
    printf '%s       \n' "$(date '+%a %b %e %H:%M:%S %Y')"
    if [ "$WIDE" = 1 ]; then c2=24; all=89; else c2=22; all=87; fi
    c1=41 c3=22
    printf '+%s+\n' "$(dashes $all -)"
    if [ "$WIDE" = 1 ]; then
        printf '| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|\n' "$DRIVER_VERSION" "$DRIVER_VERSION" "$CUDA_VERSION"
    else
        printf '| NVIDIA-SMI %-23sDriver Version: %-13sCUDA Version: %-9s|\n' "$DRIVER_VERSION" "$DRIVER_VERSION" "$CUDA_VERSION"
    fi
    printf '%s%s+%s+%s+\n' "$CORNER" "$(dashes $c1 -)" "$(dashes $c2 -)" "$(dashes $c3 -)"
    if [ "$WIDE" = 1 ]; then
        echo '| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |'
        echo '| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |'
    else
        echo '| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |'
        echo '| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |'
    fi
    printf '|%s|%s|%21s |\n' "$(dashes $c1 ' ')" "$(dashes $c2 ' ')" "MIG M."
    printf '|%s+%s+%s|\n' "$(dashes $c1 =)" "$(dashes $c2 =)" "$(dashes $c3 =)"
    each_gpu table_gpu
    if [ "$WIDE" = 1 ]; then
        if [ "$PROCS570" = 1 ]; then echo; else printf '%s\n' "$(dashes 89 ' ')"; fi
        printf '+%s+\n' "$(dashes 89 -)"
        printf '| %-88s|\n' 'Processes:'
        if [ "$PROCS570" = 1 ]; then
            printf '| %-88s|\n' ' GPU   GI   CI              PID   Type   Process name                        GPU Memory'
        else
            printf '| %-88s|\n' ' GPU   GI   CI        PID   Type   Process name                              GPU Memory'
        fi
        printf '| %-88s|\n' '       ID   ID                                                               Usage'
        printf '|%s|\n' "$(dashes 89 =)"
        printf '| %-88s|\n' ' No running processes found'
        printf '+%s+\n' "$(dashes 89 -)"
    else
        echo
        printf '+%s+\n' "$(dashes 87 -)"
        printf '| %-86s|\n' 'Processes:'
        printf '| %-86s|\n' ' GPU   GI   CI        PID   Type   Process name                            GPU Memory'
        printf '| %-86s|\n' '       ID   ID                                                             Usage'
        printf '|%s|\n' "$(dashes 87 =)"
        printf '| %-86s|\n' ' No running processes found'
        printf '+%s+\n' "$(dashes 87 -)"
    fi
}

# value FIELD UNITS(0/1) -> prints the value; returns 1 for an unknown field
value() {
    case "$1" in
        index) echo "$CUR_INDEX" ;;
        count) echo "$N_GPUS" ;;
        name|gpu_name) echo "$GPU_NAME" ;;
        uuid|gpu_uuid) echo "$CUR_UUID" ;;
        pci.bus_id|gpu_bus_id) echo "$CUR_BUS" ;;
        driver_version) echo "$DRIVER_VERSION" ;;
        compute_cap) echo "$COMPUTE_CAP" ;;
        memory.total) unit "$MEMORY_MIB" " MiB" "$2" ;;
        memory.used) unit "$MEMORY_USED_MIB" " MiB" "$2" ;;
        memory.free) unit "$((MEMORY_MIB - MEMORY_USED_MIB))" " MiB" "$2" ;;
        utilization.gpu) unit "$UTILIZATION_GPU" " %" "$2" ;;
        temperature.gpu) echo "$TEMPERATURE_C" ;;
        power.draw) unit "$POWER_DRAW_W.00" " W" "$2" ;;
        power.limit) unit "$POWER_LIMIT_W.00" " W" "$2" ;;
        pstate) echo "$PERF_STATE" ;;
        compute_mode) echo "$COMPUTE_MODE" ;;
        persistence_mode) if [ "$PERSISTENCE_MODE" = On ]; then echo Enabled; else echo Disabled; fi ;;
        timestamp) date '+%Y/%m/%d %H:%M:%S.000' ;;
        temperature.memory) echo "$MEMORY_TEMPERATURE_C" ;;
        clocks.sm|clocks.current.sm) unit "$SM_CLOCK_MHZ" " MHz" "$2" ;;
        clocks.max.sm|clocks.max.sm_clock) unit "$SM_CLOCK_MAX_MHZ" " MHz" "$2" ;;
        clocks_event_reasons.active|clocks_throttle_reasons.active) reason_mask ;;
        clocks_event_reasons.gpu_idle|clocks_throttle_reasons.gpu_idle) echo "$REASON_GPU_IDLE" ;;
        clocks_event_reasons.sw_power_cap|clocks_throttle_reasons.sw_power_cap) echo "$REASON_SW_POWER_CAP" ;;
        clocks_event_reasons.hw_slowdown|clocks_throttle_reasons.hw_slowdown) echo "$REASON_HW_SLOWDOWN" ;;
        clocks_event_reasons.sw_thermal_slowdown|clocks_throttle_reasons.sw_thermal_slowdown)
            echo "$REASON_SW_THERMAL_SLOWDOWN" ;;
        clocks_event_reasons.hw_thermal_slowdown|clocks_throttle_reasons.hw_thermal_slowdown)
            echo "$REASON_HW_THERMAL_SLOWDOWN" ;;
        clocks_event_reasons.hw_power_brake_slowdown|clocks_throttle_reasons.hw_power_brake_slowdown)
            echo "$REASON_HW_POWER_BRAKE_SLOWDOWN" ;;
        pcie.link.gen.current|pcie.link.gen.gpucurrent) echo "$PCIE_GEN" ;;
        pcie.link.gen.max) echo "$PCIE_GEN_MAX" ;;
        pcie.link.width.current) echo "$PCIE_WIDTH" ;;
        pcie.link.width.max) echo "$PCIE_WIDTH_MAX" ;;
        ecc.mode.current) echo "$ECC_MODE" ;;
        ecc.errors.corrected.volatile.total) echo "$ECC_CORRECTED_VOLATILE" ;;
        ecc.errors.uncorrected.volatile.total) echo "$ECC_UNCORRECTED_VOLATILE" ;;
        ecc.errors.corrected.aggregate.total) echo "$ECC_CORRECTED_AGGREGATE" ;;
        ecc.errors.uncorrected.aggregate.total) echo "$ECC_UNCORRECTED_AGGREGATE" ;;
        retired_pages.single_bit_ecc.count|retired_pages.sbe) echo "$RETIRED_SBE" ;;
        retired_pages.double_bit.count|retired_pages.dbe) echo "$RETIRED_DBE" ;;
        retired_pages.pending) echo "$RETIRED_PENDING" ;;
        remapped_rows.correctable|remapped_rows.sbe) echo "$REMAPPED_CORRECTABLE" ;;
        remapped_rows.uncorrectable|remapped_rows.dbe) echo "$REMAPPED_UNCORRECTABLE" ;;
        remapped_rows.pending) echo "$REMAPPED_PENDING" ;;
        remapped_rows.failure) echo "$REMAPPED_FAILURE" ;;
        *) return 1 ;;
    esac
}
unit() { if [ "$3" = 1 ]; then echo "$1$2"; else echo "$1"; fi; }
# clocks_event_reasons.active: the active reasons' bits (nvml.h, nvmlClocksEventReason*: GPU idle
# 0x1, SW power cap 0x4, HW slowdown 0x8, SW thermal slowdown 0x20, HW thermal slowdown 0x40,
# HW power brake slowdown 0x80), printed as the driver prints it (0x0000000000000001)
reason_mask() {
    m=0
    [ "$REASON_GPU_IDLE" = Active ] && m=$((m | 1))
    [ "$REASON_SW_POWER_CAP" = Active ] && m=$((m | 4))
    [ "$REASON_HW_SLOWDOWN" = Active ] && m=$((m | 8))
    [ "$REASON_SW_THERMAL_SLOWDOWN" = Active ] && m=$((m | 32))
    [ "$REASON_HW_THERMAL_SLOWDOWN" = Active ] && m=$((m | 64))
    [ "$REASON_HW_POWER_BRAKE_SLOWDOWN" = Active ] && m=$((m | 128))
    printf '0x%016x\n' "$m"
}
header_name() {
    case "$1" in
        memory.*) echo "$1 [MiB]" ;;
        utilization.*) echo "$1 [%]" ;;
        power.*) echo "$1 [W]" ;;
        clocks.sm) echo "clocks.current.sm [MHz]" ;;
        clocks.max.sm) echo "clocks.max.sm [MHz]" ;;
        *) echo "$1" ;;
    esac
}

query() {
    fields=$1 format=$2
    header=1 units=1
    case ",$format," in *,noheader,*) header=0 ;; esac
    case ",$format," in *,nounits,*) units=0 ;; esac
    old_ifs=$IFS; IFS=,
    for f in $fields; do
        value "$f" 1 >/dev/null || { IFS=$old_ifs; echo "Field \"$f\" is not a valid field to query."; echo; exit 2; }
    done
    if [ "$header" = 1 ]; then
        line='' sep=''
        for f in $fields; do line="$line$sep$(header_name "$f")"; sep=', '; done
        echo "$line"
    fi
    IFS=$old_ifs
    each_gpu query_line "$fields" "$units"
}
query_line() {
    line='' sep='' old_ifs=$IFS; IFS=,
    for f in $1; do line="$line$sep$(value "$f" "$2")"; sep=', '; done
    IFS=$old_ifs
    echo "$line"
}

list_line() { echo "GPU $CUR_INDEX: $GPU_NAME (UUID: $CUR_UUID)"; }
q_gpu() {
    echo "GPU $CUR_BUS"
    printf "    %-$((QW - 4))s: %s\n" "Product Name" "$GPU_NAME" "Product Brand" NVIDIA "Display Mode" Enabled \
        "Display Active" Disabled "Persistence Mode" "$pm"
    printf "    %-$((QW - 4))s: %s\n" "GPU UUID" "$CUR_UUID"
}

# -r / --gpu-reset and -pm 0|1 (nvidia-smi's manual page: both need root; the reset needs no
# process on the GPU: here, persistence mode off, as NVIDIA's own reset workflow turns it off
# first, NVIDIA/NVSentinel gpu-reset/gpu_reset.sh). Their output, one line a GPU ending with "."
# and then "All done.", is the form that workflow filters (`sed -e '/All done\./d' -e 's/\.$//'`);
# the lines' exact words and the refusals' messages are not confirmed from NVIDIA's own text. Exit
# status: 4 no permission, 15 the GPU fell off the bus, 255 other (RETURN VALUE).
reset_gpus() {
    [ "$(id -u)" = 0 ] || { echo "Unable to reset GPU: Insufficient Permissions"; exit 4; }
    if [ -n "$GPU_MISSING" ]; then echo "Unable to reset GPU: GPU is lost."; exit 15; fi
    # the tests' switch for a reset that does not take (RESET_FAILS=1 in gpu.env): exit status 255,
    # "other error" (RETURN VALUE); the words are the stand-in's own, not NVIDIA's
    if [ "${RESET_FAILS:-0}" = 1 ]; then echo "Unable to reset GPU $PCI_BUS_ID: Unknown Error"; exit 255; fi
    if [ "$PERSISTENCE_MODE" = On ]; then
        echo "Unable to reset this GPU because it's being used by some other process (persistence mode is on)."
        exit 255
    fi
    mkdir -p "${RESET_ENV%/*}"
    {
        echo "ECC_CORRECTED_VOLATILE=0 ECC_UNCORRECTED_VOLATILE=0"
        [ "$REMAPPED_PENDING" = '[N/A]' ] || echo "REMAPPED_PENDING=No"
        [ "$RETIRED_PENDING" = No ] || echo "RETIRED_PENDING=No"
    } > "$RESET_ENV"
    date +%s > "${RESET_ENV%/*}/last-reset"
    each_gpu reset_line
    echo "All done."
}
reset_line() { echo "GPU $CUR_BUS was successfully reset."; }
set_pm() {
    [ "$(id -u)" = 0 ] || { echo "Unable to set persistence mode: Insufficient Permissions"; exit 4; }
    mkdir -p "${PERSISTENCE_FILE%/*}"
    if [ "$1" = 1 ]; then echo Enabled > "$PERSISTENCE_FILE"; w=Enabled; else echo Disabled > "$PERSISTENCE_FILE"; w=Disabled; fi
    each_gpu pm_line
    echo "All done."
}
pm_line() { echo "$w persistence mode for GPU $CUR_BUS."; }

fields='' format='csv' mode=table pm_value='' prev=''
for arg in "$@"; do
    if [ "$prev" = pm ]; then pm_value=$arg; prev=''; continue; fi
    case "$arg" in
        -r|--gpu-reset) mode=reset ;;
        -pm|--persistence-mode) mode=pm; prev=pm ;;
        --persistence-mode=*) mode=pm; pm_value=${arg#--persistence-mode=} ;;
        --query-gpu=*) fields=${arg#--query-gpu=}; mode=query ;;
        --format=*) format=${arg#--format=} ;;
        -L|--list-gpus) mode=list ;;
        --version) mode=version ;;
        -q|--query) mode=q ;;
        -i|--id=*|[0-9]*) ;;
        *) echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."; echo; exit 2 ;;
    esac
done

case "$mode" in
    table) table ;;
    list) each_gpu list_line ;;
    q)  # the head of `nvidia-smi -q` (layout: tests/fixtures/nvidia/smi_q_t4_525.89.02_excerpt.txt)
        if [ "$PERSISTENCE_MODE" = On ]; then pm=Enabled; else pm=Disabled; fi
        printf '\n==============NVSMI LOG==============\n\n'
        printf "%-${QW}s: %s\n" "Timestamp" "$(date '+%a %b %e %H:%M:%S %Y')" "Driver Version" "$DRIVER_VERSION" \
            "CUDA Version" "$CUDA_VERSION"
        printf "\n%-${QW}s: %s\n" "Attached GPUs" "$N_GPUS"
        each_gpu q_gpu ;;
    query) query "$fields" "$format" ;;
    reset) reset_gpus ;;
    pm) case "$pm_value" in 0|1) set_pm "$pm_value" ;; *) echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."; echo; exit 2 ;; esac ;;
    version)
        echo "NVIDIA-SMI version  : $DRIVER_VERSION"
        echo "NVML version        : ${DRIVER_VERSION%.*}"
        echo "DRIVER version      : $DRIVER_VERSION"
        echo "CUDA Version        : $CUDA_VERSION" ;;
esac
exit 0
