"""The NVIDIA kernel module's flavour: "open" (NVIDIA's open GPU kernel modules) or "proprietary".

Since R515 NVIDIA ships two flavours of the same modules (nvidia.ko, nvidia-uvm.ko, ...); the open
ones support Turing and newer only (T4: Turing, L4: Ada), the proprietary ones also older GPUs.
"Starting in the 560 driver release series, the open kernel module flavor is the default and
suggested installation" (NVIDIA's driver installation guide, "Kernel Modules":
https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/kernel-modules.html).

How a host tells which one it has (both read in one command, :data:`COMMAND`):

* installed: ``modinfo -F license nvidia``: the open modules are "dual licensed MIT/GPLv2" (the
  guide above) and report ``Dual MIT/GPL``; the proprietary module reports ``NVIDIA`` (modinfo
  output in public bug reports and guides, e.g. 550.90.07: ``license: NVIDIA``; 570.86.10 open:
  ``license: Dual MIT/GPL``, ``description: NVIDIA Open UNIX Kernel Module``);
* loaded: ``/proc/driver/nvidia/version``: the open module's first line is ``NVRM version: NVIDIA
  UNIX Open Kernel Module for x86_64  <version>  Release Build ...``, the proprietary module's
  ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  <version>  <date>`` (captures in public issue
  threads and test fixtures of tools that parse the file). No file: no module loaded.

Pure: the deploy (driver step, GPU verification) and ``tritonfleet status`` share it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FLAVOURS = ("open", "proprietary")
# the first branch whose default (NVIDIA's packages and installers) is the open flavour
OPEN_DEFAULT_FROM = 560
MARK = "kmod:"
# one read-only command; every line starts with MARK so it can share a command's output
COMMAND = (
    'echo "kmod:license=$(modinfo -F license nvidia 2>/dev/null | head -n 1)"; '
    'echo "kmod:version=$(modinfo -F version nvidia 2>/dev/null | head -n 1)"; '
    'echo "kmod:proc=$(head -n 1 /proc/driver/nvidia/version 2>/dev/null)"'
)

_PROC = re.compile(r"NVRM version:\s*NVIDIA UNIX\s+(?P<open>Open\s+Kernel\s+Module)?", re.IGNORECASE)
_PROC_VERSION = re.compile(r"\s(\d+\.\d+(?:\.\d+)?)\s")


def default_flavour(branch) -> str:
    """NVIDIA's default flavour for a driver branch: open from R560, proprietary before."""
    try:
        return "open" if int(str(branch).split(".")[0]) >= OPEN_DEFAULT_FROM else "proprietary"
    except ValueError:
        return "open"


def from_license(text: str | None) -> str | None:
    """The flavour a module licence (modinfo's ``license`` field) says; None when it says neither."""
    t = " ".join(str(text or "").split()).lower()
    if not t:
        return None
    if "mit" in t or "gpl" in t:
        return "open"
    if t == "nvidia":
        return "proprietary"
    return None


def from_proc(text: str | None) -> str | None:
    """The flavour of the loaded module from /proc/driver/nvidia/version; None: none loaded (or an
    answer that is not that file's)."""
    m = _PROC.search(str(text or ""))
    if not m:
        return None
    return "open" if m.group("open") else "proprietary"


def proc_version(text: str | None) -> str | None:
    """The driver version of the loaded module from /proc/driver/nvidia/version's first line."""
    t = str(text or "")
    if not _PROC.search(t):
        return None
    m = _PROC_VERSION.search(t.split("Module", 1)[-1] + " ")
    return m.group(1) if m else None


@dataclass(frozen=True)
class ModuleState:
    installed: str | None  # flavour of the module modinfo finds (None: none installed, or unknown)
    loaded: str | None  # flavour of the loaded module (None: none loaded)
    license: str = ""  # what modinfo said
    version: str = ""  # the installed module's version (modinfo)
    proc: str = ""  # /proc/driver/nvidia/version's first line

    def summary(self) -> str:
        if not self.installed and not self.loaded:
            return "-"
        if self.loaded and self.installed and self.loaded != self.installed:
            return f"{self.installed} (loaded: {self.loaded})"
        return self.installed or f"{self.loaded} (loaded)"

    def problem(self, wanted: str) -> str | None:
        """What differs from ``wanted`` (None: nothing)."""
        found = []
        if self.installed and self.installed != wanted:
            found.append(f"installed module is {self.installed} (modinfo nvidia: license {self.license!r})")
        if self.loaded and self.loaded != wanted:
            found.append(f"loaded module is {self.loaded} (/proc/driver/nvidia/version: {self.proc!r})")
        if not self.installed and self.license:
            found.append(f"modinfo nvidia reports licence {self.license!r}, neither flavour's")
        return "; ".join(found) or None


def parse(lines) -> ModuleState:
    """:data:`COMMAND`'s output (other lines are ignored); never raises."""
    got = {"license": "", "version": "", "proc": ""}
    for line in lines or []:
        s = str(line).strip()
        if not s.startswith(MARK):
            continue
        key, _, val = s[len(MARK) :].partition("=")
        if key in got:
            got[key] = val.strip()
    return ModuleState(
        from_license(got["license"]), from_proc(got["proc"]), got["license"], got["version"], got["proc"]
    )


def split(lines) -> tuple[list[str], list[str]]:
    """(other lines, :data:`COMMAND`'s lines) of an output that holds both."""
    other, mine = [], []
    for line in lines or []:
        (mine if str(line).strip().startswith(MARK) else other).append(line)
    return other, mine
