"""Where the NVIDIA driver a host already has came from, from host facts alone (pure parsing).

Real hosts are rarely bare: a cloud image or an older machine arrives with a driver from NVIDIA's
CUDA repository, the distro's own packages (Debian's ``nvidia-driver`` from non-free, Ubuntu's
``nvidia-driver-<branch>[-server]`` / ``linux-modules-nvidia-*``) or NVIDIA's ``.run`` installer
(files outside any package manager). A second source installed over the first is how hosts end
with a driver/library mismatch or "held broken packages". Pre-flight compares what ``detect``
finds with ``nvidia_driver_source`` and refuses another source, with ``migration_help``, unless
``nvidia_driver_migrate`` is set; the driver step then removes it with ``removal_commands``.
``tritonfleet status`` shows the source (``probe``'s ``driver_source`` section, same parsing).

How a package's source is told (docs/driver-sources.md, with what could not be confirmed):

* Ubuntu's archive: ``linux-modules-nvidia-*`` / ``linux-objects-nvidia-*`` /
  ``linux-signatures-nvidia-*`` (precompiled modules), names ending ``-server``, and versions
  ``<upstream>-0ubuntu0.<release>.<n>`` (stable-release updates); NVIDIA's Ubuntu repository
  builds ``<upstream>-0ubuntu1`` (tritonfleet/data/nvidia_repos/ubuntu2204.toml: version_shape).
* Debian's archive: ``~debNuM`` / ``+debNuM`` in the revision (bookworm's 535 is
  ``535.*-1~deb12u*``); NVIDIA's Debian repository builds ``<upstream>-1`` with the same names
  (debian12.toml: version_shape, package_scheme).
* A plain revision (``-1``, ``-0ubuntu1``): NVIDIA's repository, unless no CUDA metapackage
  (``cuda-drivers*``) or pinning package is installed and the branch is one Debian's own archives
  carry (bookworm's 525 and 535, trixie's 550: ``DEBIAN_ONLY_BRANCHES``): then Debian's own.
* ``.run``: ``/usr/bin/nvidia-uninstall`` (or ``nvidia-installer``) that no package owns, or the
  installer's backup log ``/var/lib/nvidia/log`` (first line: the installed version) - the paths
  of NVIDIA's nvidia-installer (backup.c: BACKUP_DIRECTORY "/var/lib/nvidia").

A driver package is one whose name is NVIDIA's (``nvidia``, ``libcuda``, ``cuda-drivers``) and
whose version is a driver release (``<3 digits>.<n>``): Debian's helper packages
(``nvidia-kernel-common`` 20151021+..., ``glx-alternative-nvidia`` 1.2.x), egl-wayland (1:1.1.x)
and the Container Toolkit (1.17.x) are not the driver and are never touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import nvidia_repos

SOURCES = ("cuda", "debian", "ubuntu")  # detected package sources
SUPPORTED = ("cuda", "debian")  # what nvidia_driver_source can install
RUNFILE = "runfile"
NAMES = {
    "cuda": "NVIDIA's CUDA repository",
    "debian": "Debian's own packages (non-free)",
    "ubuntu": "Ubuntu's own packages",
    RUNFILE: "NVIDIA's .run installer (files outside any package manager)",
}

RUN_UNINSTALLER = "/usr/bin/nvidia-uninstall"
RUN_FILES = (RUN_UNINSTALLER, "/usr/bin/nvidia-installer")
RUN_LOG = "/var/lib/nvidia/log"
# branches Debian's own archives carry (bookworm: 525 at release, 535 from 12.x updates; the rest
# from data/distro_archives/: trixie's 550). NVIDIA's debian12 repository starts at 545 and has 550
# too (debian12.toml: branches): its 550 without a CUDA metapackage or pinning package is taken for
# Debian's (docs/driver-sources.md)
DEBIAN_ONLY_BRANCHES = tuple(sorted({"525", *(b for a in nvidia_repos.archives() for b in nvidia_repos.branches(a))}))
# packages Debian builds from a source of their own with a driver-like version of another branch
# (helper_packages of data/distro_archives/)
HELPERS = frozenset(
    p
    for a in nvidia_repos.archives()
    if "helper_packages" in nvidia_repos.load(a)["facts"]
    for p in nvidia_repos.value(a, "helper_packages")
)

_DRIVER_VERSION = re.compile(r"^(\d+:)?(\d{3})\.\d+(\.\d+)?(-|$)")
_NOT_DRIVER = re.compile(r"^(nvidia-container-|libnvidia-container|libnvidia-egl-)")
_UBUNTU_NAME = re.compile(r"^linux-(modules|objects|signatures)-nvidia-|-server$")

# what the host is read with: its files (DriverFiles fact, probe); dpkg's state is DpkgState
FILES_COMMAND = (
    f'for f in {" ".join(RUN_FILES)}; do [ -e "$f" ] && echo "file=$f owner=$(dpkg -S "$f" 2>/dev/null '
    "| grep -v '^diversion' | head -n 1 | cut -d: -f1)\"; done; "
    f"[ -f {RUN_LOG} ] && echo \"runlog=$(head -n 1 {RUN_LOG} | tr -d '\\t')\"; true"
)


def parse_files(lines: list[str]) -> dict:
    """FILES_COMMAND's output: {"files": {path: owning package or ""}, "runlog": first line or None}."""
    files: dict[str, str] = {}
    runlog = None
    for line in lines:
        line = line.strip()
        if line.startswith("file="):
            path, _, owner = line[len("file=") :].partition(" owner=")
            files[path.strip()] = owner.strip()
        elif line.startswith("runlog="):
            runlog = line[len("runlog=") :].strip()
    return {"files": files, "runlog": runlog}


def is_driver_package(name: str, version: str) -> bool:
    if name.startswith("nvidia-driver-pinning-"):  # NVIDIA's pinning package (version <branch>-1)
        return True
    return (
        ("nvidia" in name or name.startswith(("libcuda", "cuda-drivers")))
        and not _NOT_DRIVER.match(name)
        and _DRIVER_VERSION.match(version) is not None
    )


def upstream(version: str) -> str:
    """'1:535.183.01-1~deb12u1' -> '535.183.01'."""
    return version.split(":", 1)[-1].split("-", 1)[0]


def package_source(name: str, version: str, cuda_meta: bool) -> str:
    """cuda, debian or ubuntu for one installed driver package (``cuda_meta``: a CUDA metapackage
    or pinning package is installed)."""
    if _UBUNTU_NAME.search(name):
        return "ubuntu"
    revision = version.rsplit("-", 1)[1] if "-" in version.split(":", 1)[-1] else ""
    if re.search(r"ubuntu0\.\d", revision):
        return "ubuntu"
    if re.search(r"[~+]deb\d", revision):
        return "debian"
    if name.startswith(("cuda-drivers", "nvidia-driver-pinning")) or cuda_meta:
        return "cuda"
    if upstream(version).split(".")[0] in DEBIAN_ONLY_BRANCHES and "ubuntu" not in revision:
        return "debian"
    return "cuda"


@dataclass(frozen=True)
class Found:
    """What a host has: ``source`` (cuda, debian, ubuntu, runfile) or None (no driver);
    ``others``: further sources found next to it (a mixed host); ``packages``: {source: [names]}."""

    source: str | None = None
    version: str | None = None  # upstream release of the main source, when known
    others: tuple[str, ...] = ()
    packages: dict = field(default_factory=dict)
    held: tuple[str, ...] = ()  # held driver packages (any source)
    run_files: tuple[str, ...] = ()  # .run evidence

    @property
    def sources(self) -> tuple[str, ...]:
        return ((self.source,) if self.source else ()) + self.others

    @property
    def branch(self) -> str | None:
        return self.version.split(".")[0] if self.version else None

    def summary(self) -> str:
        if not self.source:
            return "none"
        text = f"{self.source}" + (f" {self.version}" if self.version else "")
        return text + (f" (+{', '.join(self.others)})" if self.others else "")


def detect(installed: dict[str, list[str]], held=(), files: dict | None = None) -> Found:
    """The host's driver source from dpkg's installed packages ({name: [versions]}), its holds
    and ``parse_files``' answer."""
    files = files or {"files": {}, "runlog": None}
    driver = {n: vs for n, vs in installed.items() if any(is_driver_package(n, v) for v in vs)}
    cuda_meta = any(n.startswith(("cuda-drivers", "nvidia-driver-pinning")) for n in installed)
    # a helper Debian builds from its own source (trixie's nvidia-modprobe 570.133.07-1 next to the
    # 550 driver: data/distro_archives/, helper_packages) is not a driver of its own branch
    branches = [upstream(v).split(".")[0] for n, vs in driver.items() if n not in HELPERS for v in vs]
    if branches:
        lead = max(set(branches), key=branches.count)
        driver = {
            n: vs for n, vs in driver.items() if n not in HELPERS or any(upstream(v).split(".")[0] == lead for v in vs)
        }
    by_source: dict[str, list[str]] = {}
    versions: dict[str, list[str]] = {}
    for name in sorted(driver):
        for v in driver[name]:
            if not is_driver_package(name, v):
                continue
            s = package_source(name, v, cuda_meta)
            if name not in by_source.setdefault(s, []):
                by_source[s].append(name)
            versions.setdefault(s, []).append(upstream(v))
    run_files = tuple(sorted(p for p, owner in files.get("files", {}).items() if not owner))
    runlog = files.get("runlog")
    if runlog is not None:
        run_files += (RUN_LOG,)
    found = [s for s in ("runfile", "cuda", "debian", "ubuntu") if s in by_source or (s == RUNFILE and run_files)]
    if not found:
        return Found()
    # the source with the most packages leads; a .run install leads (its files shadow packages)
    main = RUNFILE if RUNFILE in found else max(found, key=lambda s: (len(by_source[s]), -found.index(s)))
    if main == RUNFILE:
        m = re.match(r"\s*(\d{3}\.\d+(\.\d+)?)", runlog or "")
        version = m.group(1) if m else None
    else:
        version = max(versions[main], key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))
    held_driver = tuple(sorted(p for p in held if p in driver))
    return Found(
        main,
        version,
        tuple(s for s in found if s != main),
        {s: sorted(v) for s, v in by_source.items()},
        held_driver,
        run_files,
    )


def conflict(found: Found, wanted: str) -> list[str]:
    """The sources found that are not ``wanted`` (empty: converge)."""
    return [s for s in found.sources if s != wanted]


def removal_commands(found: Found, wanted: str) -> list[str]:
    """Shell that removes every other source cleanly: holds lifted and packages purged (apt,
    non-interactive), the .run uninstaller run silently. Order: the uninstaller first (it restores
    the files it replaced), then packages."""
    cmds = []
    others = conflict(found, wanted)
    if RUNFILE in others:
        if RUN_UNINSTALLER in found.run_files:
            cmds.append(f"{RUN_UNINSTALLER} --silent")
        else:  # backup log without its uninstaller: nothing safe to run automatically
            cmds.append(
                f"echo 'the .run install has no {RUN_UNINSTALLER}: remove it by hand (see {RUN_LOG})' >&2; exit 1"
            )
    names = sorted({p for s in others if s != RUNFILE for p in found.packages.get(s, [])})
    if names:
        held = [p for p in found.held if p in names]
        if held:
            cmds.append("apt-mark unhold " + " ".join(held))
        cmds.append("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q " + " ".join(names))
    return cmds


def migration_help(host: str, found: Found, wanted: str, branch: str) -> str:
    """Why pre-flight refuses, and the exact ways on."""
    what = "; ".join(
        f"{NAMES[s]}: "
        + (
            ", ".join(found.run_files)
            if s == RUNFILE
            else ", ".join(found.packages.get(s, [])[:6])
            + (f" and {len(found.packages[s]) - 6} more" if len(found.packages.get(s, [])) > 6 else "")
        )
        for s in found.sources
    )
    steps = "; ".join(removal_commands(found, wanted))
    same = f'set nvidia_driver_source = "{found.source}"' if found.source in SUPPORTED and not found.others else None
    return (
        f"{host}: the host already has an NVIDIA driver ({found.summary()}) from {what}, but "
        f"nvidia_driver_source is {wanted!r} (branch {branch}): installing a second source over it ends "
        "in a driver/library mismatch or held broken packages. Either set nvidia_driver_migrate = True for "
        "this host (inventory or inventories/group_data/) and the deploy removes it ("
        f"{steps}), installs {NAMES[wanted]} and reboots once"
        + (f"; or {same} to keep what it has" if same else "")
        + "; or remove it by hand and run again (docs/driver-sources.md)"
    )


# `tritonfleet status` (probe): the driver's packages and the .run files, in one section
PROBE_COMMAND = (
    "dpkg-query -W -f '${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' 2>/dev/null "
    "| grep -E 'nvidia|libcuda|cuda-drivers'; " + FILES_COMMAND
)


def parse_probe(lines: list[str]) -> Found:
    """PROBE_COMMAND's output (dpkg-query's lines, then FILES_COMMAND's) as ``detect`` sees it."""
    installed: dict[str, list[str]] = {}
    held: list[str] = []
    for line in lines:
        parts = line.strip("\n").split("\t")
        if len(parts) != 3:
            continue
        status, name, version = (p.strip() for p in parts)
        if len(status) >= 2 and status[1] == "i" and status[0] in "ih":
            installed.setdefault(name, []).append(version)
            if status[0] == "h":
                held.append(name)
    return detect(installed, held, parse_files([x for x in lines if x.strip().startswith(("file=", "runlog="))]))
