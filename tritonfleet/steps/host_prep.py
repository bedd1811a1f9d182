"""Host preparation: NVIDIA driver, Docker Engine, NVIDIA Container Toolkit.

Each step checks before it changes (facts), so a re-run on a converged host is a no-op.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.server import Arch, Command, KernelVersion, LinuxDistribution
from pyinfra.operations import files, server, systemd

from .. import config
from ..facts import memo
from ..facts.host import (
    DockerDaemonJson,
    DpkgState,
    FileState,
    KeyringFingerprints,
    SecureBoot,
    UnitState,
)
from ..failure import fail
from ..ops import aptlock, fast
from ..ops.apt_repo import signed_key, source_file, source_path
from ..ops.check import check, will_change
from ..ops.reboot import reboot

CUDA_KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
DOCKER_KEYRING = "/etc/apt/keyrings/docker.gpg"
TOOLKIT_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
# Packages that must move together with the kernel module: held, and kept out of
# unattended-upgrades, so a silent upgrade cannot cause "Driver/library version mismatch".
DRIVER_HOLD_PATTERN = r"^(cuda-drivers|nvidia-|libnvidia-|xserver-xorg-video-nvidia)"
# ... except the Container Toolkit, which is pinned by version instead (preferences.d)
TOOLKIT_PATTERN = r"^(nvidia-container|libnvidia-container)"
DRIVER_PIN_FILE = "/etc/apt/preferences.d/tritonfleet-nvidia-driver"
TOOLKIT_PIN_FILE = "/etc/apt/preferences.d/nvidia-container-toolkit"
UNATTENDED_FILE = "/etc/apt/apt.conf.d/51tritonfleet-nvidia"
UNATTENDED_TEXT = (
    "// Managed by tritonfleet: driver and toolkit packages change only through the deploy.\n"
    'Unattended-Upgrade::Package-Blacklist {\n    "cuda-drivers";\n    "nvidia-";\n'
    '    "libnvidia-";\n};\n'
)
NOUVEAU_FILE = "/etc/modprobe.d/blacklist-nouveau.conf"
NOUVEAU_TEXT = "# Managed by tritonfleet\nblacklist nouveau\noptions nouveau modeset=0\n"


def cuda_distro() -> str:
    wanted = config.get("cuda_distro")
    if wanted:
        return wanted
    d = memo.fact(LinuxDistribution)
    name = (d.get("name") or "").lower()
    major, minor = d.get("major"), d.get("minor")
    if name == "ubuntu":
        return f"ubuntu{major}{minor or 0:02d}" if isinstance(minor, int) else f"ubuntu{major}04"
    if name == "debian":
        return f"debian{major}"
    raise config.ConfigError(
        f"{host.name}: unsupported OS {d.get('name')} {d.get('major')}; "
        "supported: Ubuntu 22.04/24.04, Debian 12 (or set cuda_distro)"
    )


def cuda_arch() -> str:
    arch = memo.fact(Arch)
    return {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}.get(arch, arch)


def deb_arch() -> str:
    arch = memo.fact(Arch)
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(arch, arch)


def driver_packages() -> list[str]:
    branch = str(config.get("nvidia_driver_branch"))
    version = config.get("nvidia_driver_version")
    pkgs = [p.format(branch=branch) for p in config.get("nvidia_driver_packages")]
    if version:
        pkgs = [f"{p}={version}" for p in pkgs]
    return pkgs


def _hold_missing(installed: dict) -> list[str]:
    import re

    held = set(memo.fact(DpkgState)["held"])
    return [p for p in installed
            if re.match(DRIVER_HOLD_PATTERN, p) and not re.match(TOOLKIT_PATTERN, p) and p not in held]


def _hold_command() -> str:
    return (
        "dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' | awk '$1==\"ii\" || $1==\"hi\" {print $2}' "
        f"| grep -E '{DRIVER_HOLD_PATTERN}' | grep -v -E '{TOOLKIT_PATTERN}' | xargs -r apt-mark hold"
    )


def driver_pin_text() -> str:
    """apt preferences that keep every driver package on the configured branch. NVIDIA's Debian
    repositories ship all branches under one set of names (nvidia-driver, nvidia-smi, ...): without
    a pin apt picks the newest branch and `cuda-drivers-<branch>` ends in "held broken packages"."""
    branch = str(config.get("nvidia_driver_branch"))
    version = config.get("nvidia_driver_version")
    pin = version if version else f"{branch}.*"
    return (
        "# Managed by tritonfleet: driver packages stay on the configured branch.\n"
        "Package: cuda-drivers* nvidia-* libnvidia-* libcuda1 libnvcuvid1 libnvidia-ml1 xserver-xorg-video-nvidia\n"
        f"Pin: version {pin}\nPin-Priority: 1001\n"
    )


DRIVER_VERSION_COMMAND = "nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 || true"


def _reboot_needed() -> bool:
    """At execution time: the loaded driver does not match the installed one (read again when
    an operation before changed the host)."""
    if not config.get("nvidia_reboot_if_needed"):
        return False
    text = memo.fact(Command, command=DRIVER_VERSION_COMMAND) or ""
    if "version mismatch" in text.lower():
        logger.warning(f"{host.name}: loaded NVIDIA module does not match the installed driver; rebooting")
        return True
    return False


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


def secure_boot_problem() -> str | None:
    """The message that stops the driver step, from the SecureBoot fact and the two opt-ins."""
    state = memo.fact(SecureBoot)
    if state is True and not config.get("nvidia_secure_boot_ok"):
        return SECURE_BOOT_HELP.format(host=host.name)
    if state is None and not (config.get("nvidia_secure_boot_unknown_ok") or config.get("nvidia_secure_boot_ok")):
        return SECURE_BOOT_UNKNOWN_HELP.format(host=host.name)
    return None


def driver_facts() -> list[tuple]:
    """What the driver step reads on a converged host: one remote command (memo.prefetch)."""
    return [(SecureBoot, {}), (LinuxDistribution, {}), (Arch, {}), (KernelVersion, {}), (DpkgState, {}),
            (KeyringFingerprints, {"path": CUDA_KEYRING}), (FileState, {"path": source_path("cuda")}),
            (FileState, {"path": NOUVEAU_FILE}), (FileState, {"path": DRIVER_PIN_FILE}),
            (FileState, {"path": UNATTENDED_FILE}), (UnitState, {"unit": "nvidia-persistenced.service"}),
            (Command, {"command": DRIVER_VERSION_COMMAND})]


@deploy("NVIDIA driver")
def nvidia_driver():
    memo.prefetch(*driver_facts())
    problem = secure_boot_problem()
    if problem:
        # (pre-flight refuses this before any host is touched; this guards direct use of the step)
        check(name="check: Secure Boot is enabled or unknown: stop before installing an unloadable driver",
              function=_fail, message=problem,
              expected="Secure Boot off, or nvidia_secure_boot_ok for a host whose module will load")
        return
    aptlock.repair_interrupted(name="finish an interrupted dpkg run (dpkg --configure -a)")
    repo = config.get("cuda_repo_url").rstrip("/")
    base = f"{repo}/{cuda_distro()}/{cuda_arch()}"
    key = signed_key(
        name="CUDA repository signing key (fingerprint checked)",
        url=f"{base}/{config.get('cuda_repo_key_name')}",
        fingerprint=config.get("cuda_repo_key_fingerprint"),
        keyring=CUDA_KEYRING,
    )
    src = source_file("cuda", f"deb [signed-by={CUDA_KEYRING}] {base}/ /")
    if will_change(key, src):
        aptlock.update(name="apt update (CUDA repository changed)")

    kernel = memo.fact(KernelVersion)
    kernel_pkgs = [p.format(kernel=kernel) for p in config.get("nvidia_kernel_packages")]
    if kernel_pkgs:
        fast.packages(name=f"kernel headers and DKMS for {kernel}", packages=kernel_pkgs)

    nouveau = fast.put(name="blacklist nouveau", src=StringIO(NOUVEAU_TEXT), dest=NOUVEAU_FILE, mode="644")
    if will_change(nouveau):
        server.shell(
            name="rebuild initramfs (nouveau blacklist changed)",
            commands=["if command -v update-initramfs >/dev/null; then update-initramfs -u; "
                      "else echo 'no initramfs-tools: nothing to rebuild'; fi"],
        )

    fast.put(name=f"pin driver packages to branch {config.get('nvidia_driver_branch')}",
              src=StringIO(driver_pin_text()), dest=DRIVER_PIN_FILE, mode="644")
    pkgs = driver_packages()
    installed = memo.fact(DpkgState)["installed"]
    # Changing branch: the old branch's held packages would block apt ("held broken packages").
    other = [p for p in installed if p.startswith("cuda-drivers-") and p not in {x.split("=")[0] for x in pkgs}]
    if other:
        # Held packages are never moved as dependencies: release them for this switch only
        # (they are held again below, at the new branch).
        server.shell(name=f"release driver holds to switch from {', '.join(other)}",
                     commands=aptlock.wrapped([_hold_command().replace("apt-mark hold", "apt-mark unhold")]))
        fast.packages(name=f"remove the other branch's metapackage {', '.join(other)}", packages=other,
                     present=False)
    driver = fast.packages(
        name=f"NVIDIA driver {', '.join(pkgs)}",
        packages=pkgs,
        extra_install_args="--allow-downgrades" if other else None,
    )
    driver_changes = bool(other) or will_change(driver)
    if config.get("nvidia_hold_packages"):
        if _hold_missing(installed) or driver_changes:
            server.shell(name="hold driver packages (apt-mark hold)", commands=aptlock.wrapped([_hold_command()]))
        fast.put(name="keep driver packages out of unattended-upgrades",
                  src=StringIO(UNATTENDED_TEXT), dest=UNATTENDED_FILE, mode="644")

    if config.get("nvidia_persistenced"):
        fast.service(name="nvidia-persistenced running and enabled",
                        service="nvidia-persistenced", running=True, enabled=True)

    # A reboot can only be needed when the driver changes now, or the loaded module already
    # differs from the installed driver; whether it is, is decided on the host after the install.
    loaded = memo.fact(Command, command=DRIVER_VERSION_COMMAND) or ""
    if driver_changes or "version mismatch" in loaded.lower():
        reboot(
            name="reboot if the loaded driver does not match the installed one",
            reboot_timeout=config.get("nvidia_reboot_timeout"),
            _if=_reboot_needed,
        )


def docker_facts() -> list[tuple]:
    """What the Docker step reads on a converged host."""
    return [(DpkgState, {}), (UnitState, {"unit": "docker.service"}), (LinuxDistribution, {}), (Arch, {}),
            *([(KeyringFingerprints, {"path": DOCKER_KEYRING}), (FileState, {"path": source_path("docker")}),
               (FileState, {"path": DOCKER_PIN_FILE})] if config.get("docker_source") == "docker" else [])]


def toolkit_facts() -> list[tuple]:
    """What the Container Toolkit step reads on a converged host."""
    return [(Arch, {}), (DpkgState, {}), (KeyringFingerprints, {"path": TOOLKIT_KEYRING}),
            (FileState, {"path": source_path("nvidia-container-toolkit")}),
            (FileState, {"path": TOOLKIT_PIN_FILE}), (DockerDaemonJson, {}),
            (Command, {"command": HOOK_COMMAND})]


def host_layer_facts() -> list[tuple]:
    """Everything the host layer reads on a converged host: pre-flight reads it in one remote
    command (memo.prefetch), and the steps find it there."""
    return [*driver_facts(), *docker_facts(), *toolkit_facts()]


@deploy("Docker Engine")
def docker_engine():
    source = config.get("docker_source")
    memo.prefetch(*docker_facts())
    aptlock.repair_interrupted(name="finish an interrupted dpkg run (dpkg --configure -a)")
    if source == "distro":
        # apparmor: without it docker.io cannot start containers on AppArmor kernels
        engine = fast.packages(name="Docker Engine (distro docker.io)",
                              packages=["docker.io", "apparmor"], update=False)
    elif source == "docker":
        distro, codename = docker_distro()
        repo = config.get("docker_repo_url").rstrip("/")
        key = signed_key(name="Docker repository signing key (fingerprint checked)",
                         url=docker_key_url(), fingerprint=config.get("docker_repo_key_fingerprint"),
                         keyring=DOCKER_KEYRING)
        src = source_file("docker", f"deb [arch={deb_arch()} signed-by={DOCKER_KEYRING}] {repo}/{distro} {codename} stable")
        if will_change(key, src):
            aptlock.update(name="apt update (Docker repository changed)")
        version = config.get("docker_version")
        if version:
            pin = fast.put(name=f"pin Docker Engine to {version}", src=StringIO(docker_pin_text(version)),
                            dest=DOCKER_PIN_FILE, mode="644")
        else:
            pin = files.file(name="Docker Engine not pinned", path=DOCKER_PIN_FILE, present=False)
        engine = fast.packages(
            name="Docker Engine (docker-ce)",
            packages=["docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin",
                      "docker-compose-plugin"],
        )
        # installed at another version (docker_version changed, or upgraded by hand): apt moves it
        # to the pinned one (packages already present are not touched by apt.packages)
        have = memo.fact(DpkgState)["installed"].get("docker-ce")
        if have and (will_change(pin) or (version and not any(
                fnmatchcase(v, docker_version_pattern(version)) for v in have))):
            server.shell(name="move Docker Engine to the pinned version",
                         commands=aptlock.wrapped(["DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                                                   "--allow-downgrades docker-ce docker-ce-cli"]))
        if version:
            check(name=f"check: docker-ce is {version}", function=_check_docker_version,
                  pattern=docker_version_pattern(version))
    else:
        raise config.ConfigError(f"{host.name}: docker_source must be 'docker' or 'distro', not {source!r} "
                                 "(group data, inventories/group_data/all.py)")
    fast.service(name="docker running and enabled", service="docker", running=True, enabled=True)
    return engine


DOCKER_PIN_FILE = "/etc/apt/preferences.d/tritonfleet-docker"


def docker_version_pattern(version: str) -> str:
    """apt's version pattern for docker_version: exact, or 5:<upstream>-* for an upstream version."""
    version = str(version)
    return version if (":" in version or "-" in version) else f"5:{version}-*"


def docker_pin_text(version: str) -> str:
    return ("# Managed by tritonfleet: Docker Engine stays at docker_version.\n"
            "Package: docker-ce docker-ce-cli docker-ce-rootless-extras\n"
            f"Pin: version {docker_version_pattern(version)}\nPin-Priority: 1001\n")


def _check_docker_version(pattern: str):
    _, out = host.run_shell_command("dpkg-query -W -f '${Version}' docker-ce 2>&1")
    found = "".join(out.stdout_lines).strip()
    if not fnmatchcase(found, pattern):
        fail(f"docker-ce at docker_version ({pattern})", f"docker-ce is {found or 'not installed'}: no such "
             "version in Docker's repository for this distro?",
             fix="`apt-cache madison docker-ce` lists the versions; set docker_version in group data, then run "
                 "the deploy again")


def docker_distro() -> tuple[str, str]:
    """(ubuntu|debian, codename) for Docker's repository path."""
    d = memo.fact(LinuxDistribution)
    distro = (d.get("name") or "").lower()
    codename = (d.get("release_meta") or {}).get("VERSION_CODENAME") or ""
    if distro not in ("ubuntu", "debian") or not codename:
        raise config.ConfigError(
            f"{host.name}: Docker's repository needs Ubuntu or Debian with a VERSION_CODENAME in "
            f"/etc/os-release (found {d.get('name')!r} {codename!r}); or set docker_source = \"distro\"")
    return distro, codename


def docker_key_url() -> str:
    distro, _ = docker_distro()
    return f"{config.get('docker_repo_url').rstrip('/')}/{distro}/gpg"


def cuda_key_url() -> str:
    repo = config.get("cuda_repo_url").rstrip("/")
    return f"{repo}/{cuda_distro()}/{cuda_arch()}/{config.get('cuda_repo_key_name')}"


def vendor_keys() -> list[tuple[str, str, str, str, str]]:
    """(what, key URL, pinned fingerprint, tunable, keyring) of every signing key the deploy trusts."""
    keys = [("CUDA repository", cuda_key_url(), config.get("cuda_repo_key_fingerprint"),
             "cuda_repo_key_fingerprint", CUDA_KEYRING)]
    if config.get("docker_source") == "docker":
        keys.append(("Docker repository", docker_key_url(), config.get("docker_repo_key_fingerprint"),
                     "docker_repo_key_fingerprint", DOCKER_KEYRING))
    keys.append(("Container Toolkit repository", config.get("container_toolkit_key_url"),
                 config.get("container_toolkit_key_fingerprint"), "container_toolkit_key_fingerprint",
                 TOOLKIT_KEYRING))
    return keys


@deploy("NVIDIA Container Toolkit")
def container_toolkit():
    memo.prefetch(*toolkit_facts())
    aptlock.repair_interrupted(name="finish an interrupted dpkg run (dpkg --configure -a)")
    url = config.get("container_toolkit_repo_url").rstrip("/")
    key = signed_key(name="Container Toolkit signing key (fingerprint checked)",
                     url=config.get("container_toolkit_key_url"),
                     fingerprint=config.get("container_toolkit_key_fingerprint"),
                     keyring=TOOLKIT_KEYRING)
    src = source_file("nvidia-container-toolkit", f"deb [signed-by={TOOLKIT_KEYRING}] {url}/{deb_arch()} /")
    if will_change(key, src):
        aptlock.update(name="apt update (Container Toolkit repository changed)")
    version = config.get("container_toolkit_version")
    pin_text = "".join(
        f"Package: {p}\nPin: version {version}\nPin-Priority: 1001\n\n" for p in TOOLKIT_PACKAGES
    )
    fast.put(name=f"pin Container Toolkit packages to {version}",
              src=StringIO(pin_text), dest=TOOLKIT_PIN_FILE, mode="644")
    fast.packages(name=f"Container Toolkit {version}",
                 packages=[f"{p}={version}" for p in TOOLKIT_PACKAGES], allow_downgrades=True)

    daemon = memo.fact(DockerDaemonJson)
    if daemon is None:
        # (pre-flight refuses this before any host is touched; this guards direct use of the step)
        check(name="check: daemon.json is not valid JSON", function=_fail,
              message=DAEMON_JSON_HELP.format(host=host.name), expected="/etc/docker/daemon.json is JSON")
        return
    # Both decided from what the host shows now: the nvidia runtime is registered once (nvidia-ctk
    # edits daemon.json in place, keeping the operator's keys), and Docker is restarted only then
    # or when the toolkit's hook is new (dockerd finds it on its PATH only at start).
    configured = "nvidia" in (daemon.get("runtimes") or {})
    if not configured:
        server.shell(name="register the nvidia runtime with Docker (nvidia-ctk, keeps other daemon.json keys)",
                     commands=["nvidia-ctk runtime configure --runtime=docker"])
    hook_missing = not memo.fact(Command, command=HOOK_COMMAND)
    if not configured or hook_missing:
        systemd.service(name="restart Docker (runtime registered or toolkit installed)", service="docker",
                        running=True, restarted=True)


HOOK_COMMAND = "command -v nvidia-container-runtime-hook || true"

DAEMON_JSON_HELP = (
    "{host}: /etc/docker/daemon.json is not valid JSON; fix the file on the host by hand "
    "(`python3 -m json.tool /etc/docker/daemon.json` shows where), then run the deploy again "
    "(tritonfleet never overwrites the operator's daemon.json)"
)


def _fail(message: str, expected: str = "a host this step can change safely"):
    fail(expected, message)
