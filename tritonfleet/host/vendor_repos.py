"""The vendor apt repositories the host layer trusts, in one table.

NVIDIA's CUDA repository (the driver), Docker's (with ``docker_source = "docker"``) and NVIDIA's
Container Toolkit repository. For each: what it is called in messages and operation names, its
apt source file and line, the keyring its signing key is installed as (``signed-by``), where the
key is fetched from, the pinned fingerprint and the tunable that pins it. The URLs follow the
host's distro and architecture the way each vendor names them (CUDA: ``ubuntu2204``, ``sbsa``;
apt and the others: ``arm64``).

Read by pre-flight (the host fetches every key not installed yet and its fingerprint is compared
with the pinned one) and by the host-layer steps (key, source and apt update:
``tritonfleet.host.ops.apt_repo.vendor_source``). Reads host facts and tunables; runs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host
from pyinfra.facts.server import Arch, LinuxDistribution

from ..pyinfra_ext import memo
from ..settings.access import ConfigError, Settings

CUDA_KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
DOCKER_KEYRING = "/etc/apt/keyrings/docker.gpg"


def source_path(name: str) -> str:
    """The apt source file ``name`` (/etc/apt/sources.list.d/<name>.list)."""
    return f"/etc/apt/sources.list.d/{name}.list"


@dataclass(frozen=True)
class VendorRepo:
    """One vendor repository as a host trusts it."""

    what: str  # "CUDA repository": in messages and in the apt update's name
    key_name: str  # the name of the operation that installs its key
    source: str  # its apt source file: source_path(source)
    line: str  # the apt source line (deb [signed-by=keyring] ...)
    keyring: str  # where the pinned key is installed
    key_url: str  # where the host fetches the key
    fingerprint: str  # the pinned fingerprint
    fingerprint_tunable: str  # the tunable that pins it

    @property
    def source_path(self) -> str:
        return source_path(self.source)

    @property
    def url(self) -> str:
        """The repository's URL in its source line (named when apt cannot read it)."""
        return next(w for w in self.line.split() if "://" in w)


def cuda_distro(settings: Settings) -> str:
    wanted = settings.get("cuda_distro")
    if wanted:
        return wanted
    d = memo.fact(LinuxDistribution)
    name = (d.get("name") or "").lower()
    major, minor = d.get("major"), d.get("minor")
    if name == "ubuntu":
        return f"ubuntu{major}{minor or 0:02d}" if isinstance(minor, int) else f"ubuntu{major}04"
    if name == "debian":
        return f"debian{major}"
    raise ConfigError(
        f"{host.name}: unsupported OS {d.get('name')} {d.get('major')}; "
        "supported: Ubuntu 22.04/24.04/26.04, Debian 12 (or set cuda_distro)"
    )


def cuda_arch() -> str:
    arch = memo.fact(Arch)
    return {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}.get(arch, arch)


def deb_arch() -> str:
    arch = memo.fact(Arch)
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(arch, arch)


def docker_distro() -> tuple[str, str]:
    """(ubuntu|debian, codename) for Docker's repository path."""
    d = memo.fact(LinuxDistribution)
    distro = (d.get("name") or "").lower()
    codename = (d.get("release_meta") or {}).get("VERSION_CODENAME") or ""
    if distro not in ("ubuntu", "debian") or not codename:
        raise ConfigError(
            f"{host.name}: Docker's repository needs Ubuntu or Debian with a VERSION_CODENAME in "
            f'/etc/os-release (found {d.get("name")!r} {codename!r}); or set docker_source = "distro"'
        )
    return distro, codename


def cuda_base_url(settings: Settings) -> str:
    """The CUDA repository for this host's distro and architecture."""
    return f"{settings.get('cuda_repo_url').rstrip('/')}/{cuda_distro(settings)}/{cuda_arch()}"


def cuda_key_url(settings: Settings) -> str:
    return f"{cuda_base_url(settings)}/{settings.get('cuda_repo_key_name')}"


def docker_key_url(settings: Settings) -> str:
    distro, _ = docker_distro()
    return f"{settings.get('docker_repo_url').rstrip('/')}/{distro}/gpg"


def cuda(settings: Settings) -> VendorRepo:
    return VendorRepo(
        "CUDA repository",
        "CUDA repository signing key (fingerprint checked)",
        "cuda",
        f"deb [signed-by={CUDA_KEYRING}] {cuda_base_url(settings)}/ /",
        CUDA_KEYRING,
        cuda_key_url(settings),
        settings.get("cuda_repo_key_fingerprint"),
        "cuda_repo_key_fingerprint",
    )


def docker(settings: Settings) -> VendorRepo:
    distro, codename = docker_distro()
    url = settings.get("docker_repo_url").rstrip("/")
    return VendorRepo(
        "Docker repository",
        "Docker repository signing key (fingerprint checked)",
        "docker",
        f"deb [arch={deb_arch()} signed-by={DOCKER_KEYRING}] {url}/{distro} {codename} stable",
        DOCKER_KEYRING,
        docker_key_url(settings),
        settings.get("docker_repo_key_fingerprint"),
        "docker_repo_key_fingerprint",
    )


def container_toolkit(settings: Settings) -> VendorRepo:
    url = settings.get("container_toolkit_repo_url").rstrip("/")
    return VendorRepo(
        "Container Toolkit repository",
        "Container Toolkit signing key (fingerprint checked)",
        "nvidia-container-toolkit",
        f"deb [signed-by={TOOLKIT_KEYRING}] {url}/{deb_arch()} /",
        TOOLKIT_KEYRING,
        settings.get("container_toolkit_key_url"),
        settings.get("container_toolkit_key_fingerprint"),
        "container_toolkit_key_fingerprint",
    )


def repos(settings: Settings) -> list[VendorRepo]:
    """Every vendor repository this host trusts, in the order the deploy installs them."""
    driver = [] if settings.get("nvidia_driver_source") == "debian" else [cuda(settings)]  # Debian's own keyring
    return [
        *driver,
        *([docker(settings)] if settings.get("docker_source") == "docker" else []),
        container_toolkit(settings),
    ]
