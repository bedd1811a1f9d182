"""Kernel safety: does the kernel that will boot have the NVIDIA module?

A kernel upgrade (unattended-upgrades, or one installed by hand) that boots without the NVIDIA
module brings the host back with no GPU (NVIDIA/nvidia-docker#804,
NVIDIA/ansible-role-nvidia-driver#18 and #21, NVIDIA/gpu-operator#583). The kernel that boots next
is taken as the newest one installed (``/boot/vmlinuz-*``, version order: GRUB's default on Debian
and Ubuntu; a ``GRUB_DEFAULT`` pinned to another entry is not read), or the running one when
``/boot`` holds none (hosts booted from outside, such as containers). Its module is there when
``/lib/modules/<kernel>`` holds an ``nvidia.ko*`` (DKMS installs it below ``updates/dkms``, the
precompiled packages below ``kernel/``), or Debian's own build of it, ``nvidia-current.ko*``:
Debian 12's ``nvidia-kernel-dkms`` 535.309.01-0+deb12u1 renames the modules it builds
(``/usr/src/nvidia-current-535.309.01/dkms.conf``: ``PACKAGE_NAME="nvidia-current"``,
``BUILT_MODULE_NAME[0]="nvidia"``, ``DEST_MODULE_NAME[0]="$PACKAGE_NAME"``,
``DEST_MODULE_LOCATION[0]="/updates/dkms"``), and its ``nvidia-kernel-support`` loads it for
``modprobe nvidia`` (``/etc/nvidia/current/nvidia-modprobe.conf``: ``install nvidia modprobe -i
nvidia-current``): read from the packages in Debian's archive.

Read side (``tritonfleet status``): :func:`status_command` / :func:`parse`, read-only. Deploy side
(before a reboot, ``tritonfleet.host.ops.reboot``): :func:`ensure_command` also builds the module when
it can: the kernel's headers are installed (DKMS builds every registered module when headers are
installed: Debian's dkms hooks ``/etc/kernel/header_postinst.d``), then ``dkms autoinstall -k``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.shell import q

REBOOT_REQUIRED = "/var/run/reboot-required"

# the NVIDIA module's file names: NVIDIA's, and Debian's renamed build of it
MODULE_FILES = ("nvidia.ko*", "nvidia-current.ko*")
_BOOT = (
    "r=$(uname -r); k=$(ls -1 /boot/vmlinuz-* 2>/dev/null | sed 's|^/boot/vmlinuz-||' | sort -V | tail -n 1); "
    '[ -n "$k" ] || k=$r; '
    'has() { [ -n "$(find "/lib/modules/$1" \\( '
    + " -o ".join(f"-name '{m}'" for m in MODULE_FILES)
    + ' \\) 2>/dev/null | head -n 1)" ]; }; '
)


def status_command() -> str:
    """One read-only command: running and boot kernel, the module for the boot kernel, a pending
    reboot and the packages that asked for it, DKMS's view of the nvidia module."""
    return (
        _BOOT + 'echo "running=$r"; echo "boot=$k"; '
        'if has "$k"; then echo module=yes; else echo module=no; fi; '
        f"if [ -e {REBOOT_REQUIRED} ]; then echo reboot=yes; else echo reboot=no; fi; "
        f"echo \"pkgs=$(cat {REBOOT_REQUIRED}.pkgs 2>/dev/null | sort -u | tr '\\n' ' ')\"; "
        "echo \"dkms=$(dkms status -m nvidia 2>/dev/null | tr '\\n' ';')\""
    )


def ensure_command(header_packages: list[str], install_template: str) -> str:
    """Like :func:`status_command`, and when the boot kernel has no module: install its headers
    (``header_packages``: templates with ``{kernel}``; ``install_template``: the apt-get install
    command, ``@WORDS@`` for the packages, e.g. in the deploy's apt-lock wait), then ``dkms
    autoinstall -k``; ``module=built`` when that made it. Never fails by itself: the caller reads
    ``module=``."""
    pkgs = " ".join(p.replace("{kernel}", "$k") for p in header_packages)
    install = install_template.replace("@WORDS@", pkgs) if pkgs else "true"
    return (
        _BOOT + 'echo "running=$r"; echo "boot=$k"; '
        'if has "$k"; then echo module=yes; exit 0; fi; '
        'if [ ! -e "/lib/modules/$k/build" ]; then '
        f"echo \"step=install {pkgs}\"; ( {install} ) 2>&1 | tail -n 6 | sed 's/^/out=/'; fi; "
        'if ! has "$k" && command -v dkms >/dev/null 2>&1 && [ -e "/lib/modules/$k/build" ]; then '
        'echo "step=dkms autoinstall -k $k"; dkms autoinstall -k "$k" 2>&1 | tail -n 6 | sed \'s/^/out=/\'; fi; '
        'if has "$k"; then echo module=built; else echo module=no; '
        "echo \"dkms=$(dkms status -m nvidia 2>/dev/null | tr '\\n' ';')\"; "
        '[ -e "/lib/modules/$k/build" ] && echo headers=yes || echo headers=no; fi'
    )


@dataclass
class KernelState:
    running: str = ""
    boot: str = ""
    module: str = ""  # "yes", "built" (by this run), "no", "" (unknown)
    reboot_required: bool = False
    reboot_packages: list[str] = field(default_factory=list)
    dkms: str = ""
    headers: str = ""
    steps: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)

    @property
    def has_module(self) -> bool:
        return self.module in ("yes", "built")

    def summary(self) -> str:
        """For a status cell: nothing pending, or the pending reboot and its kernel's module."""
        if not self.reboot_required and (self.boot == self.running or not self.boot):
            return "-"
        what = "pending" if self.reboot_required else f"next boot {self.boot}"
        if self.reboot_required and self.boot != self.running:
            what += f" into {self.boot}"
        return what + (", with the NVIDIA module" if self.has_module else ", WITHOUT the NVIDIA module")


def parse(lines) -> KernelState:
    st = KernelState()
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if not sep:
            continue
        if key == "running":
            st.running = value
        elif key == "boot":
            st.boot = value
        elif key == "module":
            st.module = value
        elif key == "reboot":
            st.reboot_required = value == "yes"
        elif key == "pkgs":
            st.reboot_packages = value.split()
        elif key == "dkms":
            st.dkms = value.strip(";").replace(";", "; ")
        elif key == "headers":
            st.headers = value
        elif key == "step":
            st.steps.append(value)
        elif key == "out":
            st.output.append(value)
    return st


def refusal(st: KernelState, header_packages: list[str]) -> tuple[str, str, str]:
    """(found, what the host runs now, fix) for a reboot refused for want of a module."""
    pkgs = " ".join(p.replace("{kernel}", st.boot) for p in header_packages) or f"linux-headers-{st.boot}"
    found = (
        f"the kernel that will boot, {st.boot} (newest in /boot; running: {st.running}), has no NVIDIA module"
        + (f" (DKMS: {st.dkms})" if st.dkms else " (DKMS knows no nvidia module)")
        + ("" if st.headers == "yes" else f"; its headers could not be installed ({pkgs})")
    )
    now = (
        f"not rebooted: it runs kernel {st.running} with the NVIDIA module it had; the driver installed by this "
        "run loads at the next boot"
    )
    fix = (
        f"give {st.boot} the module: install its headers ({q(pkgs)}) and run `dkms autoinstall -k {st.boot}`; or "
        f"remove that kernel (apt-get remove linux-image-{st.boot}) or make GRUB boot {st.running}; then run the "
        "deploy again"
    )
    return found, now, fix
