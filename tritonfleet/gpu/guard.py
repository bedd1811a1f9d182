"""GPU-loss guard: a running GPU container can lose its GPUs on `systemctl daemon-reload`.

NVIDIA's notice (NVIDIA/nvidia-docker#1730, "Containers losing access to GPUs with error:
'Failed to initialize NVML: Unknown Error'"; NVIDIA/nvidia-container-toolkit#48, #1227 on Ubuntu
22.04): with the systemd cgroup driver, a daemon-reload makes systemd re-apply a container's
device rules, and runc needs a ``/dev/char/<major>:<minor>`` symlink for each device node to keep
access to it; NVIDIA's device nodes have none, so the container's ``nvidia-smi`` then fails with
"Failed to initialize NVML: Unknown Error" until the container is re-created. The workaround
NVIDIA gives: create the symlinks (``nvidia-ctk system create-dev-char-symlinks --create-all``)
and keep them across boots with a udev rule that runs it when the driver binds
(``/lib/udev/rules.d/71-nvidia-dev-char.rules``: :data:`UDEV_RULE`, the notice's rule), or use CDI.

The deploy does both halves: the Container Toolkit step installs the rule and makes the symlinks
(when the rule is new or the symlinks are missing), and after any run that reloads systemd (its
own reloads, or package installs whose maintainer scripts reload) while Triton keeps running,
``docker exec <container> nvidia-smi -L`` is compared with the host's ``nvidia-smi -L``; a
container that lost its GPUs is restarted once (drained first when a load balancer is set), and
the host fails if it still does not see them.
"""

from __future__ import annotations

from ..core.shell import q

UDEV_RULE_PATH = "/lib/udev/rules.d/71-nvidia-dev-char.rules"
# NVIDIA's notice (nvidia-docker#1730), section "Workarounds": the rule as given there
UDEV_RULE = (
    "# Managed by tritonfleet: /dev/char symlinks for NVIDIA device nodes, so that a systemctl\n"
    "# daemon-reload does not cost running containers their GPUs (NVIDIA/nvidia-docker#1730).\n"
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n'
)
CREATE_COMMAND = "nvidia-ctk system create-dev-char-symlinks --create-all"
# nvidiactl is character device 195:255 on every NVIDIA driver (the "nvidia" major, minor 255)
DEVCHAR_COMMAND = "test -L /dev/char/195:255 && echo present || true"

_MARK_HOST, _MARK_CTR, _MARK_END = "@@host", "@@container", "@@end"


def compare_command(container: str, smi: str = "nvidia-smi") -> str:
    """The host's and the container's ``nvidia-smi -L``, in marked sections (one command); ``smi``:
    the command that asks the driver on the host (nvidia_smi_command)."""
    c = q(container)
    return (
        f'echo {_MARK_HOST}; {smi} -L 2>&1; echo "rc=$?"; echo {_MARK_CTR}; '
        f"if [ \"$(docker inspect --format '{{{{.State.Running}}}}' {c} 2>/dev/null)\" = true ]; then "
        f'docker exec {c} nvidia-smi -L 2>&1; echo "rc=$?"; else echo not-running; fi; echo {_MARK_END}'
    )


def parse(text: str) -> dict:
    """{"host": [lines], "host_rc": int, "container": [lines] or None (not running), "container_rc"}."""
    out: dict = {"host": [], "host_rc": None, "container": [], "container_rc": None}
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s in (_MARK_HOST, _MARK_CTR, _MARK_END):
            section = {"@@host": "host", "@@container": "container"}.get(s)
            continue
        if section is None or not s:
            continue
        if s.startswith("rc=") and s[3:].lstrip("-").isdigit():
            out[f"{section}_rc"] = int(s[3:])
        elif section == "container" and s == "not-running":
            out["container"] = None
        else:
            out[section].append(s)
    return out


def verdict(state: dict) -> tuple[str, str]:
    """("ok" | "not-running" | "host-failed" | "lost", what to say)."""
    if state["host_rc"] not in (0, None) or not state["host"]:
        return "host-failed", "nvidia-smi -L fails on the host itself: " + " / ".join(state["host"][:3])
    if state["container"] is None:
        return "not-running", "Triton's container is not running (nothing to guard)"
    if state["container_rc"] == 0 and sorted(state["container"]) == sorted(state["host"]):
        return "ok", f"the container sees the host's {len(state['host'])} GPU(s)"
    seen = " / ".join(state["container"][:3]) or "nothing"
    return "lost", f"the container sees {seen}; the host has " + " / ".join(state["host"][:3])
