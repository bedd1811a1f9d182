"""What to do about a quarantined host's GPU, decided without touching anything: reset the GPU
(for a fault whose recommended action is ``RESET_GPU``), reboot the host when a reset did not
clear it (or the action is a reboot), or hold the host for an operator, its evidence collected,
when it faults again within ``quarantine_refault_window`` seconds of coming back. And the exact
commands of each step on the host, one quoting rule (tritonfleet.core.shell).

The ``action`` of an alert is its ``action`` label (the Xid catalog's recommended action, NVIDIA's
"Resolution Bucket (Immediate Action)" names) or, without one, ``ACTIONS`` below by the alert's
``xid`` label."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.shell import q
from .planning import FiringAlert

RESET_GPU = "RESET_GPU"
RESTART_BM = "RESTART_BM"  # reboot the (bare-metal) host

#: Xid -> recommended action, for alerts that carry no ``action`` label (a few entries, each with
#: its source; the whole catalog is NVIDIA's "Resolution Bucket (Immediate Action)" column,
#: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
ACTIONS = {
    # "GPU stopped processing": drain, reset_gpu (NVIDIA Health Validation's Xid checks,
    # https://docs.nvidia.com/health-validation/reference/checks/xid.md, gpu_xid_46)
    46: RESET_GPU,
    # "Row Remapper: New row marked for remapping, reset gpu to activate" (the driver's own words,
    # quoted in stas00/ml-engineering compute/accelerator/nvidia/debug.md)
    63: RESET_GPU,
    # "GPU has fallen off the bus": the bus the reset would go through lost the GPU; a reboot
    # (NVIDIA/open-gpu-kernel-modules discussion 1327 asks for a reset path; none is released)
    79: RESTART_BM,
}


def action_of(alerts: list[FiringAlert]) -> str:
    """The strongest recommended action among a host's alerts: a reboot over a reset over none.
    The catalog's label first; where it names no remediation (an Xid an operator quarantines by
    ``quarantine_xids`` that the catalog says to ignore, 63 among them), ``ACTIONS`` by number."""
    found = set()
    for a in alerts:
        act = (a.labels or {}).get("action", "")
        if act not in (RESET_GPU, RESTART_BM) and str((a.labels or {}).get("xid", "")).isdigit():
            act = ACTIONS.get(int(a.labels["xid"]), act)
        found.add(act)
    return RESTART_BM if RESTART_BM in found else RESET_GPU if RESET_GPU in found else ""


@dataclass
class History:
    """A host's remediation record (epoch seconds): resets and reboots done for the fault it is
    out for now, and when it last came back into service (whatever cleared its fault: a
    remediation, its alerts resolving, an operator's release)."""

    resets: list[float] = field(default_factory=list)
    reboots: list[float] = field(default_factory=list)
    back_at: float = 0.0


@dataclass(frozen=True)
class Decision:
    step: str  # "reset", "reboot", "hold" or "" (nothing: it stays out until its alerts resolve)
    why: str


def decide(action: str, history: History, fault_at: float, window: float) -> Decision:
    """The next step for a host out for a fault seen at ``fault_at`` whose recommended action is
    ``action``. A host that came back into service less than ``window`` seconds before this
    fault is held (a fix that does not last is not tried again and again); a reset that did not
    clear the fault is followed by one reboot; after a reboot nothing more is tried."""
    if history.back_at and 0 <= fault_at - history.back_at <= window:
        return Decision(
            "hold",
            f"it faulted again {fault_at - history.back_at:.0f} s after it came back into service "
            f"(within {window:.0f} s): held for an operator, evidence collected",
        )
    if history.reboots:
        return Decision("", "a reboot did not clear it: it stays out for an operator")
    if action == RESTART_BM:
        return Decision("reboot", "its fault's recommended action is a reboot (RESTART_BM)")
    if action == RESET_GPU:
        if history.resets:
            return Decision("reboot", "the GPU reset did not clear it: a reboot")
        return Decision("reset", "its fault's recommended action is a GPU reset (RESET_GPU)")
    return Decision("", "no remediation for its fault: it stays out until its alerts resolve")


def reset_script(service: str, pcis: list[str]) -> str:
    """The host's commands of a GPU reset: stop Triton's unit (nothing may hold the GPU), for each
    GPU turn persistence mode off if it was on, ``nvidia-smi -r``, restore persistence mode,
    check the GPU answers (``nvidia-smi -q``), start the unit again whatever happened; exit
    status that of the first failure. Persistence mode as NVIDIA's own reset workflow handles
    it (NVIDIA/NVSentinel gpu-reset/gpu_reset.sh)."""
    lines = ["rc=0", 'first() { s=$?; [ "$rc" != 0 ] || rc=$s; }', f"systemctl stop {q(service)} || first"]
    for pci in pcis:
        p = q(pci)
        lines += [
            f"pm=$(nvidia-smi -i {p} --query-gpu=persistence_mode --format=csv,noheader | tr -d ' ')",
            f'[ "$pm" != Enabled ] || nvidia-smi -i {p} -pm 0 || first',
            f'[ "$rc" != 0 ] || nvidia-smi -r -i {p} || first',
            f'[ "$pm" != Enabled ] || nvidia-smi -i {p} -pm 1 || first',
            f'[ "$rc" != 0 ] || nvidia-smi -q -i {p} >/dev/null || first',
        ]
    lines += [f"systemctl start {q(service)} || first", 'exit "$rc"']
    return "\n".join(lines) + "\n"


#: what is collected from a held host: the driver's bug report when it is installed (``--safe-mode
#: --output-file X.log`` writes X.log.gz, as NVIDIA/NVSentinel gpu-reset/gpu_reset.sh collects it),
#: else the kernel log of this boot; to stdout, saved on the control machine
EVIDENCE_SCRIPT = (
    "if command -v nvidia-bug-report.sh >/dev/null; then\n"
    '  d=$(mktemp -d) && nvidia-bug-report.sh --safe-mode --output-file "$d/nvidia-bug-report.log" >/dev/null 2>&1 '
    '&& gzip -dc "$d/nvidia-bug-report.log.gz"; rc=$?; rm -rf "$d"; [ "$rc" = 0 ] && exit 0\n'
    "fi\n"
    "journalctl -k -b --no-pager\n"
)
