"""What pre-flight shares with the host-layer steps (driver, Docker, Container Toolkit): the files
those steps manage on a host and the commands they read it with (and so the facts a converged
host is read with, in one remote command), the driver branch a host gets, and the problems that
stop the driver and toolkit steps (Secure Boot, daemon.json) with their help texts.

Pre-flight refuses what these find before any host is touched; the steps (steps/host_prep.py)
guard their own direct use with the same words. Reads host facts and tunables; runs nothing.
"""

from __future__ import annotations

import re

from pyinfra import host
from pyinfra.facts.server import Arch, Command, KernelVersion, LinuxDistribution

from ..gpu import facts as gpu_facts
from ..gpu import guard
from ..pyinfra_ext import memo, transfer
from ..settings.access import ConfigError, Settings
from . import driver_source, nvidia_repos
from .facts import (
    AptSources,
    DockerDaemonJson,
    DpkgState,
    DriverFiles,
    FileState,
    KeyringFingerprints,
    SecureBoot,
    UnitState,
)
from .kernel_module import COMMAND as KMOD_COMMAND
from .kernel_module import FLAVOURS, default_flavour
from .vendor_repos import CUDA_KEYRING, DOCKER_KEYRING, TOOLKIT_KEYRING, cuda_distro, source_path

# --------------------------------------------------------------------------- managed files

# The packages that move together with the kernel module (held, kept out of unattended-upgrades,
# so a silent upgrade cannot cause "Driver/library version mismatch") are the driver's set in
# tritonfleet/data/nvidia_repos/<distro>.toml: exactly those, not the Container Toolkit (pinned
# by version instead), egl-wayland or DKMS.
DRIVER_PIN_FILE = "/etc/apt/preferences.d/tritonfleet-nvidia-driver"
# what chooses the driver's packages and versions (named when apt cannot install them)
DRIVER_SETTINGS = "nvidia_driver_branch / nvidia_driver_version / nvidia_kernel_module"
TOOLKIT_PIN_FILE = "/etc/apt/preferences.d/nvidia-container-toolkit"
DOCKER_PIN_FILE = "/etc/apt/preferences.d/tritonfleet-docker"
UNATTENDED_FILE = "/etc/apt/apt.conf.d/51tritonfleet-nvidia"
UNATTENDED_TEXT = (
    "// Managed by tritonfleet: driver and toolkit packages change only through the deploy.\n"
    'Unattended-Upgrade::Package-Blacklist {\n    "cuda-drivers";\n    "nvidia-";\n'
    '    "libnvidia-";\n};\n'
)
NOUVEAU_FILE = "/etc/modprobe.d/blacklist-nouveau.conf"
NOUVEAU_TEXT = "# Managed by tritonfleet\nblacklist nouveau\noptions nouveau modeset=0\n"
NONFREE_FILE = "/etc/apt/sources.list.d/tritonfleet-debian-nonfree.sources"
PERSISTENCE_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/tritonfleet-persistence-mode.conf"
PERSISTENCE_DROPIN_TEXT = (
    "# Managed by tritonfleet: the packaged unit runs --no-persistence-mode; turn persistence on.\n"
    "[Service]\nExecStart=\n"
    "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --persistence-mode --verbose\n"
)

# --------------------------------------------------------------------------- commands that read the host

NO_DRIVER = "couldn't communicate with the nvidia driver"


def smi_command(settings: Settings) -> str:
    """The command the deploy asks a host's driver with (tritonfleet.gpu.facts.smi_command)."""
    return gpu_facts.smi_command(settings)


def driver_version_command(settings: Settings) -> str:
    return gpu_facts.driver_version_command(smi_command(settings))


def persistence_command(settings: Settings) -> str:
    return gpu_facts.persistence_command(smi_command(settings))


_PERSISTENCE_LINE = re.compile(r"^\s*Persistence Mode\s*:\s*(\S+)", re.IGNORECASE | re.MULTILINE)


def persistence_modes(text: str) -> list[str]:
    """The Persistence Mode of each GPU in :func:`persistence_command`'s answer (``nvidia-smi -q``
    lines, e.g. ``    Persistence Mode                                   : Enabled`` from driver 580,
    tests/fixtures/nvidia-real-h200-580/smi-persistence.txt), in GPU order."""
    return _PERSISTENCE_LINE.findall(text or "")


# The SSH login user (the one sudo was run by, when the deploy uses sudo) and whether logind
# keeps its systemd manager between sessions (loginctl(1) enable-linger: a file of that name in
# /var/lib/systemd/linger). One line: "linger <user>", "none <user>", or "no-logind" where no
# logind runs (/run/systemd/users is its directory of logged-in users), so no manager is started
# for a session and there is nothing to keep.
LINGER_COMMAND = (
    'u="${SUDO_USER:-$(id -un)}"; if ! command -v loginctl >/dev/null || [ ! -d /run/systemd/users ]; '
    'then echo no-logind; elif [ -e "/var/lib/systemd/linger/$u" ]; then echo "linger $u"; else echo "none $u"; fi'
)


def linger_state(answer: str | None) -> tuple[str, str]:
    """(state, user) from :data:`LINGER_COMMAND`'s line; state "linger", "none" or "no-logind"
    ("no-logind" too for an answer that is none of these: nothing is changed on a guess)."""
    state, _, user = (answer or "").strip().partition(" ")
    if state in ("linger", "none") and user and " " not in user:
        return state, user
    return "no-logind", ""


HOOK_COMMAND = "command -v nvidia-container-runtime-hook || true"
# the installed module's licence and the loaded module's /proc line (tritonfleet.host.kernel_module)
KERNEL_MODULE_COMMAND = KMOD_COMMAND


def driver_facts(settings: Settings) -> list[tuple]:
    """What the driver step reads on a converged host: one remote command (memo.prefetch)."""
    return [
        (SecureBoot, {}),
        (LinuxDistribution, {}),
        (Arch, {}),
        (KernelVersion, {}),
        (DpkgState, {}),
        (KeyringFingerprints, {"path": CUDA_KEYRING}),
        (FileState, {"path": source_path("cuda")}),
        (FileState, {"path": NOUVEAU_FILE}),
        (FileState, {"path": DRIVER_PIN_FILE}),
        (FileState, {"path": UNATTENDED_FILE}),
        (UnitState, {"unit": "nvidia-persistenced.service"}),
        (FileState, {"path": PERSISTENCE_DROPIN}),
        (AptSources, {}),
        (DriverFiles, {}),
        (FileState, {"path": NONFREE_FILE}),
        (Command, {"command": driver_version_command(settings)}),
        (Command, {"command": persistence_command(settings)}),
        (Command, {"command": KERNEL_MODULE_COMMAND}),
    ]


def docker_facts(settings: Settings) -> list[tuple]:
    """What the Docker step reads on a converged host."""
    return [
        (DpkgState, {}),
        (UnitState, {"unit": "docker.service"}),
        (LinuxDistribution, {}),
        (Arch, {}),
        *(
            [
                (KeyringFingerprints, {"path": DOCKER_KEYRING}),
                (FileState, {"path": source_path("docker")}),
                (FileState, {"path": DOCKER_PIN_FILE}),
            ]
            if settings.get("docker_source") == "docker"
            else []
        ),
    ]


def toolkit_facts() -> list[tuple]:
    """What the Container Toolkit step reads on a converged host."""
    return [
        (Arch, {}),
        (DpkgState, {}),
        (KeyringFingerprints, {"path": TOOLKIT_KEYRING}),
        (FileState, {"path": source_path("nvidia-container-toolkit")}),
        (FileState, {"path": TOOLKIT_PIN_FILE}),
        (DockerDaemonJson, {}),
        (Command, {"command": HOOK_COMMAND}),
        (FileState, {"path": guard.UDEV_RULE_PATH}),
        (Command, {"command": guard.DEVCHAR_COMMAND}),
    ]


def keeps_sessions(settings: Settings) -> bool:
    """Whether the SSH sessions step acts on the current host: ``ssh_user_linger``, and the deploy
    reaches the host over a connection with a login (not pyinfra's @local connector, which pull
    mode's runs on the host itself use: no session, nothing to keep)."""
    return bool(settings.get("ssh_user_linger")) and not transfer.is_local_host(host)


def session_facts(settings: Settings) -> list[tuple]:
    """What the SSH sessions step reads on a converged host."""
    return [(Command, {"command": LINGER_COMMAND})] if keeps_sessions(settings) else []


def host_layer_facts(settings: Settings) -> list[tuple]:
    """Everything the host layer reads on a converged host: pre-flight reads it in one remote
    command (memo.prefetch), and the steps find it there."""
    return [*session_facts(settings), *driver_facts(settings), *docker_facts(settings), *toolkit_facts()]


# --------------------------------------------------------------------------- driver source


def existing_driver() -> driver_source.Found:
    """The driver the host has now and where it came from (read before any operation ran)."""
    dpkg = memo.fact(DpkgState)
    return driver_source.detect(dpkg["installed"], dpkg["held"], memo.fact(DriverFiles))


def wanted_source(settings: Settings) -> str:
    """nvidia_driver_source, checked."""
    source = settings.get("nvidia_driver_source")
    if source not in driver_source.SUPPORTED:
        raise ConfigError(
            f'{host.name}: nvidia_driver_source must be "cuda" (NVIDIA\'s CUDA repository) or "debian" '
            f"(Debian's own packages), not {source!r} (inventory or inventories/group_data/)"
        )
    return source


def driver_repo(settings: Settings) -> str:
    """The facts (tritonfleet/host/nvidia_repos.py) of where the driver comes from: NVIDIA's CUDA
    repository for the host's distro, or the distro's own archive (nvidia_driver_source = "debian":
    tritonfleet/data/distro_archives/<distro>-archive.toml, Debian 12 and 13)."""
    distro = cuda_distro(settings)
    if wanted_source(settings) == "debian":
        archive = nvidia_repos.archive_of(distro)
        if archive is None or nvidia_repos.family(archive) != "debian":
            known = ", ".join(a.removesuffix("-archive") for a in nvidia_repos.archives())
            raise ConfigError(
                f'{host.name}: nvidia_driver_source = "debian" installs Debian\'s own nvidia-driver ({known}), '
                f'but this host is {distro}: set nvidia_driver_source = "cuda" for it (inventory or '
                "inventories/group_data/)"
            )
        return archive
    if distro not in nvidia_repos.DISTROS:
        own = nvidia_repos.archive_of(distro)
        raise ConfigError(
            f"{host.name}: tritonfleet has no facts of NVIDIA's CUDA repository for {distro} (known: "
            f"{', '.join(nvidia_repos.DISTROS)}; docs/driver-sources.md says what is known of it)"
            + (
                f': set nvidia_driver_source = "debian" for this host (its distro\'s own driver, '
                f"{nvidia_repos.release(own, nvidia_repos.branches(own)[-1])}) in the inventory or "
                "inventories/group_data/"
                if own
                else ""
            )
        )
    return distro


# the distro's Docker Engine (docker_source = "distro") where its archive's facts name no other
# packages (tritonfleet/data/distro_archives/<distro>-archive.toml: docker_packages); apparmor:
# without it docker.io cannot start containers on AppArmor kernels
DOCKER_DISTRO_PACKAGES = ("docker.io", "apparmor")


def docker_distro_packages(settings: Settings) -> list[str]:
    """The packages of the distro's own Docker Engine on this host (Debian 13 splits the client
    out of docker.io: docker-cli)."""
    archive = nvidia_repos.archive_of(cuda_distro(settings))
    facts = nvidia_repos.load(archive)["facts"] if archive else {}
    return list(facts["docker_packages"]["value"] if "docker_packages" in facts else DOCKER_DISTRO_PACKAGES)


def driver_source_problem(settings: Settings) -> str | None:
    """Why the driver step must not run on this host (another source, no migration), or None."""
    source = wanted_source(settings)
    found = existing_driver()
    if driver_source.conflict(found, source) and not settings.get("nvidia_driver_migrate"):
        return driver_source.migration_help(host.name, found, source, driver_branch(settings))
    return None


# --------------------------------------------------------------------------- driver branch


def driver_branch(settings: Settings) -> str:
    """The driver branch for this host: nvidia_driver_branch, else the distro's default."""
    branch = settings.get("nvidia_driver_branch")
    if branch:
        return str(branch)
    distro = driver_repo(settings)
    defaults = settings.get("nvidia_driver_branch_default") or {}
    if distro not in defaults:
        raise ConfigError(
            f"{host.name}: no driver branch for {distro}: set nvidia_driver_branch (inventory or "
            f"inventories/group_data/<class>.py), or add {distro} to nvidia_driver_branch_default "
            "(inventories/group_data/all.py)"
        )
    return str(defaults[distro])


def kernel_module(settings: Settings) -> str:
    """The kernel module flavour for this host: nvidia_kernel_module, else NVIDIA's default for the
    driver branch (open from R560)."""
    flavour = settings.get("nvidia_kernel_module")
    if flavour:
        if flavour not in FLAVOURS:
            raise ConfigError(
                f"{host.name}: nvidia_kernel_module must be one of {', '.join(FLAVOURS)} "
                f"or None, not {flavour!r} (inventories/group_data/<class>.py)"
            )
        return str(flavour)
    return default_flavour(driver_branch(settings))


def driver_upstream_version(settings: Settings) -> str | None:
    """nvidia_driver_version as the upstream release ('580.159.04'), or None (newest of the branch)."""
    version = settings.get("nvidia_driver_version")
    if not version:
        return None
    return str(version).split(":", 1)[-1].split("-", 1)[0]


def driver_version_problem(settings: Settings, distro: str, branch: str) -> str | None:
    """Why nvidia_driver_version cannot pin anything in ``distro``'s repository (None: it can)."""
    version = settings.get("nvidia_driver_version")
    if not version:
        return None
    version = str(version)
    upstream = driver_upstream_version(settings)
    shape = nvidia_repos.version_shape(distro)
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", upstream or ""):
        return f"nvidia_driver_version {version!r} is not a driver version (e.g. {shape['example'].split('-')[0]})"
    if upstream.split(".")[0] != branch:
        return (
            f"nvidia_driver_version {version} is not a release of branch {branch} "
            f'(set nvidia_driver_branch = "{upstream.split(".")[0]}", or a {branch}.x version)'
        )
    if "-" in version and not (
        nvidia_repos.version_matches(distro, version, "metapackage")
        or nvidia_repos.version_matches(distro, version, "driver")
    ):
        return (
            f"nvidia_driver_version {version} does not have the shape of {distro}'s package versions "
            f"(driver packages like {shape['example']}): it would pin nothing there; give the upstream "
            f"release {upstream} and the deploy pins every package of that release"
        )
    return None


# --------------------------------------------------------------------------- what stops a step

SECURE_BOOT_HELP = (
    "{host}: UEFI Secure Boot is enabled: the DKMS-built nvidia module is unsigned and will not "
    "load, leaving a half-installed driver. Do one of: enroll a Machine Owner Key and let DKMS "
    "sign the module (`mokutil --import /var/lib/dkms/mok.pub`, confirm at the next boot), use "
    "the distribution's signed precompiled modules (Ubuntu: linux-modules-nvidia-<branch>-server-"
    "<flavour>, set nvidia_driver_packages), or disable Secure Boot in the firmware. Then set "
    "nvidia_secure_boot_ok = True for this host and run the deploy again."
)

SECURE_BOOT_UNKNOWN_HELP = (
    "{host}: cannot tell whether UEFI Secure Boot is enabled: the host booted with UEFI, mokutil "
    "gave no answer (`mokutil --sb-state`: not installed or failing) and the SecureBoot EFI variable "
    "is not readable. With Secure Boot on, the DKMS-built nvidia module would not load. Install "
    "mokutil on the host (apt-get install mokutil) and run the deploy again; or, once you know Secure "
    "Boot is off or handled (MOK enrolled, signed modules), set nvidia_secure_boot_unknown_ok = True "
    "for this host."
)

DAEMON_JSON_HELP = (
    "{host}: /etc/docker/daemon.json is not valid JSON; fix the file on the host by hand "
    "(`python3 -m json.tool /etc/docker/daemon.json` shows where), then run the deploy again "
    "(tritonfleet never overwrites the operator's daemon.json)"
)


def secure_boot_problem(settings: Settings) -> str | None:
    """The message that stops the driver step, from the SecureBoot fact and the two opt-ins."""
    state = memo.fact(SecureBoot)
    if state is True and not settings.get("nvidia_secure_boot_ok"):
        return SECURE_BOOT_HELP.format(host=host.name)
    if state is None and not (settings.get("nvidia_secure_boot_unknown_ok") or settings.get("nvidia_secure_boot_ok")):
        return SECURE_BOOT_UNKNOWN_HELP.format(host=host.name)
    return None
