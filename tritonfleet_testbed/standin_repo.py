"""The testbed's stand-in NVIDIA vendor repositories: signed flat apt repos, served locally.

Layout below ``dest`` (the URL paths the deploy uses for NVIDIA's real repositories):

* ``cuda/<distro>/x86_64/``: CUDA driver repository (flat, ``deb [...] <url>/ /``), signed, with
  its key as ``<key_name>`` (ASCII-armored, like NVIDIA's ``3bf863cc.pub``), one per distro
  (debian12, ubuntu2204, ubuntu2404, ubuntu2604), each generated from that distro's facts
  (tritonfleet/data/nvidia_repos/<distro>.toml): the branches and real releases the facts name,
  the real package set and names (Debian: ``nvidia-driver``, ``nvidia-smi``, ``libcuda1``,
  ``firmware-nvidia-gsp``, ... for every branch; Ubuntu: ``nvidia-driver-<branch>``,
  ``nvidia-utils-<branch>``, ...), the distro's version shapes (Debian ``<v>-1``, Ubuntu
  ``<v>-0ubuntu1``; metapackages ``<v>-1``), ``cuda-drivers-<branch>`` with a lower bound only
  (``nvidia-driver (>= <v>)``: unpinned, apt takes the newest branch), NVIDIA's pinning package
  ``nvidia-driver-pinning-<branch>`` where the facts say the branch has one (apt preferences for
  the set), ``libnvidia-egl-wayland1`` (epoch, not the driver's), and
  ``linux-headers-<kernel_release>`` (the test hosts run this machine's kernel, which Debian has
  no headers for).  The stand-in nvidia-smi (driver/CUDA version baked in) is in ``nvidia-smi`` /
  ``nvidia-utils-<branch>``, the daemon and its packaged unit (``--no-persistence-mode``) in
  ``nvidia-persistenced`` / ``nvidia-compute-utils-<branch>``.
* ``libnvidia-container/stable/deb/amd64/``: NVIDIA Container Toolkit repository (flat),
  ``nvidia-container-toolkit``, ``nvidia-container-toolkit-base``, ``libnvidia-container-tools``,
  ``libnvidia-container1`` at 1.17.8-1 (stand-in nvidia-ctk, nvidia-container-runtime,
  nvidia-container-runtime-hook), key at ``libnvidia-container/gpgkey``.

* ``docker/debian/``: Docker's apt repository, laid out like ``download.docker.com/linux/debian``:
  the key at ``docker/debian/gpg``, ``dists/<suite>/{InRelease,Release,Release.gpg}`` for bookworm
  and trixie (``DOCKER_SUITES``), component ``stable`` (``dists/<suite>/stable/binary-amd64/Packages``),
  pool ``dists/<suite>/pool/stable/amd64/``; ``docker-ce`` and ``docker-ce-cli`` in two versions
  (``DOCKER_CE_VERSIONS``, so a pin can be told from "newest"), ``containerd.io``,
  ``docker-buildx-plugin``, ``docker-compose-plugin`` with Docker's package names and version
  scheme.  The engine inside is Debian's own docker.io, repacked (its package conflicts with
  docker-ce, so it cannot simply be a dependency): dockerd, docker-proxy and the systemd units in
  docker-ce, the CLI in docker-ce-cli; containerd.io depends on Debian's containerd and runc;
  the two CLI plugins are stand-ins that answer ``docker compose version`` /
  ``docker buildx version``.  Built only when a docker.io package is given
  (``debian_package("docker.io")`` fetches it with apt into the testbed cache).

All repositories are signed (InRelease, Release.gpg) by one throwaway key kept in ``gnupg_home``
(default ``dest/.gnupg``), so rebuilding keeps the fingerprint: an ed25519 primary key that
certifies and a signing subkey that signs, like Docker's key (a key's fingerprint is its primary's).

A host's GPU is the file ``/etc/nvidia-standin/gpu.env`` (see ``gpu_profile``): shell
KEY=VALUE lines read by the stand-in nvidia-smi: GPU_NAME, GPU_UUID, PCI_BUS_ID, MEMORY_MIB,
COMPUTE_CAP, and for the table PERSISTENCE_MODE, DISPLAY_ACTIVE, ECC_ERRORS, FAN,
TEMPERATURE_C, PERF_STATE, POWER_DRAW_W, POWER_LIMIT_W, MEMORY_USED_MIB, UTILIZATION_GPU,
COMPUTE_MODE, MIG_MODE.  No file: no GPU (nvidia-smi cannot communicate with the driver).
The loaded kernel module is emulated by ``/run/nvidia-standin/module-version`` (written by the
first nvidia-smi/nvidia-persistenced after boot): installing another driver without a reboot
gives "Driver/library version mismatch", as on a real host.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tritonfleet.host import nvidia_repos as vendorfacts

STANDIN = Path(__file__).with_name("standin")
RECIPE_VERSION = "1"
MAINTAINER = "tritonfleet testbed <testbed@tritonfleet.invalid>"
KEY_UID = "tritonfleet testbed vendor repository <testbed@tritonfleet.invalid>"

# The CUDA version each branch's nvidia-smi reports (NVIDIA's CUDA toolkit release notes, table
# "CUDA Toolkit and Corresponding Driver Versions"; 535/570/580 also in tests/fixtures/nvidia).
CUDA_OF_BRANCH = {"515": "11.7", "520": "11.8", "525": "12.0", "530": "12.1", "535": "12.2", "545": "12.3",
                  "550": "12.4", "555": "12.5", "560": "12.6", "565": "12.7", "570": "12.8", "575": "12.9",
                  "580": "13.0", "595": "13.2"}  # 595: nvidia-smi 595.71.05 reports CUDA 13.2 (docs/driver-sources.md)
STANDIN_DISTROS = ("debian12", "ubuntu2204", "ubuntu2404", "ubuntu2604")
TOOLKIT_VERSION = "1.17.8"
DEB_REVISION = "1"
CUDA_REPO_LABEL = "NVIDIA CUDA"
# Docker's repository (Debian 12 and 13): versions as Docker numbers its packages. Docker lists
# Debian 13 among its releases (docker/docs#22635, "Debian Trixie 13"); its trixie suffix is taken
# from the bookworm one's scheme (not read from Docker's repository).
DOCKER_SUITE = "bookworm"
DOCKER_DEB_SUFFIX = "-1~debian.12~bookworm"
DOCKER_SUITES = {DOCKER_SUITE: DOCKER_DEB_SUFFIX, "trixie": "-1~debian.13~trixie"}
DOCKER_CE_VERSIONS = ("27.3.1", "27.4.0")  # docker-ce, docker-ce-cli (epoch 5)
CONTAINERD_IO_VERSION = "1.7.22-1"
DOCKER_PLUGINS = {  # package: (plugin, command, version, description, `version` output)
    "docker-buildx-plugin": ("docker-buildx", "buildx", "0.17.1", "Docker Buildx",
                             "github.com/docker/buildx v0.17.1 257815a"),
    "docker-compose-plugin": ("docker-compose", "compose", "2.29.7", "Docker Compose",
                              "Docker Compose version v2.29.7"),
}

# The "hardware" of each GPU class, values from real captures (tests/fixtures/nvidia/SOURCES.md):
# T4: AWS g4dn (bus 00:1E.0, UUID from its nvidia-smi -q, 18 W / 70 W, 27 C, P0);
# L4: Docker's GPU documentation (bus 31:00.0, UUID from its nvidia-smi -L, 27 W / 72 W, 40 C, 4 %).
GPU_PROFILES = {
    "T4": {
        "GPU_NAME": "Tesla T4",
        "GPU_UUID": "GPU-84b0bf9a-67bf-493c-9214-4fad8b125a6d",
        "PCI_BUS_ID": "00000000:00:1E.0",
        "MEMORY_MIB": "15360",
        "COMPUTE_CAP": "7.5",
        "PERSISTENCE_MODE": "Off",
        "DISPLAY_ACTIVE": "Off",
        "ECC_ERRORS": "0",
        "FAN": "N/A",
        "TEMPERATURE_C": "27",
        "PERF_STATE": "P0",
        "POWER_DRAW_W": "18",
        "POWER_LIMIT_W": "70",
        "MEMORY_USED_MIB": "0",
        "UTILIZATION_GPU": "0",
        "COMPUTE_MODE": "Default",
        "MIG_MODE": "N/A",
        # health fields (telemetry): T4's highest SM clock from its supported clocks (nvidia-smi -q
        # -d SUPPORTED_CLOCKS of a g4dn, mlcommons/inference_results_v0.5#20), PCIe 3.0 x16
        "SM_CLOCK_MAX_MHZ": "1590",
        "PCIE_GEN": "3",
        "PCIE_GEN_MAX": "3",
    },
    "L4": {
        "GPU_NAME": "NVIDIA L4",
        "GPU_UUID": "GPU-3a23c669-1f69-c64e-cf85-44e9b07e7a2a",
        "PCI_BUS_ID": "00000000:31:00.0",
        "MEMORY_MIB": "23034",
        "COMPUTE_CAP": "8.9",
        "PERSISTENCE_MODE": "Off",
        "DISPLAY_ACTIVE": "Off",
        "ECC_ERRORS": "0",
        "FAN": "N/A",
        "TEMPERATURE_C": "40",
        "PERF_STATE": "P0",
        "POWER_DRAW_W": "27",
        "POWER_LIMIT_W": "72",
        "MEMORY_USED_MIB": "0",
        "UTILIZATION_GPU": "4",
        "COMPUTE_MODE": "Default",
        "MIG_MODE": "N/A",
        # health fields: PCIe 4.0 x16 and a 2040 MHz highest SM clock (NVIDIA's L4 product figures;
        # not confirmed from a captured nvidia-smi answer)
        "SM_CLOCK_MAX_MHZ": "2040",
        "PCIE_GEN": "4",
        "PCIE_GEN_MAX": "4",
    },
}



_SMI_LIST_ROW = re.compile(r"^GPU\s+(?P<index>\d+):\s+(?P<name>.+?)\s+\(UUID:\s*(?P<uuid>[^)\s]+)\)")


def parse_smi_list(lines) -> list[dict]:
    """``nvidia-smi -L``: [{"index", "name", "uuid"}] (how the stand-in's answer is checked
    against the real one)."""
    out = []
    for line in lines or []:
        m = _SMI_LIST_ROW.match(line.strip())
        if m:
            out.append({"index": int(m.group("index")), "name": m.group("name"), "uuid": m.group("uuid")})
    return out

# Bus ids of multi-GPU hosts, in bus order, from real captures (tests/fixtures/nvidia/SOURCES.md):
# 4x Tesla T4 (smi_t4x4_535.183.01.txt: 00:1B.0 through 00:1E.0, an AWS g4dn.12xlarge's layout);
# NVIDIA L4 (smi_l4x3_580.159.04_excerpt.txt: 00:03.0, 00:04.0, 00:05.0; the excerpt is cut
# after GPU 2, so 00:06.0 for a fourth GPU follows the pattern and is not confirmed).
MULTI_GPU_BUS_IDS = {
    "T4": ["00000000:00:1B.0", "00000000:00:1C.0", "00000000:00:1D.0", "00000000:00:1E.0"],
    "L4": ["00000000:00:03.0", "00000000:00:04.0", "00000000:00:05.0", "00000000:00:06.0"],
}


def multi_gpu_uuid(gpu_class: str, bus_id: str) -> str:
    """A stable UUID for a stand-in GPU (derived: the table captures do not show UUIDs), in
    nvidia-smi's GPU-8-4-4-4-12 form."""
    import uuid

    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"tritonfleet-testbed/{gpu_class}/{bus_id}"))


def gpu_profile(gpu_class: str | None, gpus: int = 1, missing: tuple[int, ...] = ()) -> str:
    """The gpu.env text for a host of ``gpu_class`` ("T4", "L4"; "none"/"" -> "", no GPU) with
    ``gpus`` GPUs (more than one: bus ids of real multi-GPU hosts, MULTI_GPU_BUS_IDS); ``missing``:
    positions (0-based, bus order) of GPUs that fell off the bus."""
    key = str(gpu_class or "").strip().upper()
    if key in ("", "NONE"):
        return ""
    if key not in GPU_PROFILES:
        raise ValueError(f"no stand-in GPU for class {gpu_class!r}; known: {', '.join(GPU_PROFILES)}, none")
    lines = [f'{k}="{v}"' for k, v in GPU_PROFILES[key].items()]
    if gpus > 1:
        buses = MULTI_GPU_BUS_IDS[key]
        if gpus > len(buses):
            raise ValueError(f"the stand-in driver presents at most {len(buses)} {key} GPUs")
        buses = buses[:gpus]
        lines += [f'GPU_COUNT="{gpus}"', f'GPU_BUS_IDS="{" ".join(buses)}"',
                  f'GPU_UUIDS="{" ".join(multi_gpu_uuid(key, b) for b in buses)}"',
                  f'GPU_MISSING="{" ".join(str(i) for i in missing)}"']
    return "# The testbed host's GPU, read by the stand-in NVIDIA driver\n" + "\n".join(lines) + "\n"


@dataclass
class VendorRepo:
    root: Path
    fingerprint: str
    cuda_key_name: str
    cuda_key: Path
    toolkit_key: Path
    keyring: Path  # the key dearmored (for gpgv / signed-by)
    gnupg_home: Path
    cuda_dirs: dict[str, Path] = field(default_factory=dict)
    toolkit_dir: Path | None = None
    kernel_release: str = ""
    packages: dict[str, list[dict]] = field(default_factory=dict)
    docker_dir: Path | None = None  # <url>/docker/debian: Docker's repository for Debian
    docker_key: Path | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        for k, v in list(d.items()):
            if isinstance(v, Path):
                d[k] = str(v)
        d["cuda_dirs"] = {k: str(v) for k, v in self.cuda_dirs.items()}
        for k in ("docker_dir", "docker_key", "toolkit_dir"):
            d[k] = str(d[k]) if d[k] else None
        return d

    @classmethod
    def from_json(cls, d: dict) -> VendorRepo:
        return cls(
            root=Path(d["root"]), fingerprint=d["fingerprint"], cuda_key_name=d["cuda_key_name"],
            cuda_key=Path(d["cuda_key"]), toolkit_key=Path(d["toolkit_key"]),
            keyring=Path(d["keyring"]), gnupg_home=Path(d["gnupg_home"]),
            cuda_dirs={k: Path(v) for k, v in d["cuda_dirs"].items()},
            toolkit_dir=Path(d["toolkit_dir"]) if d.get("toolkit_dir") else None,
            kernel_release=d.get("kernel_release", ""), packages=d.get("packages", {}),
            docker_dir=Path(d["docker_dir"]) if d.get("docker_dir") else None,
            docker_key=Path(d["docker_key"]) if d.get("docker_key") else None,
        )


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr.strip()}")
    return p


# Where a test puts the stand-in's answer for a host whose installed driver cannot answer for the
# stand-in GPU (Debian's real nvidia-smi on a test host: no GPU, no module); the deploy is pointed
# at it with nvidia_smi_command (test-only data), and the stand-in Container Toolkit's hook copies it
# into `docker run --gpus` containers in place of the host's nvidia-smi.
ANSWER_PATH = "/usr/lib/nvidia-standin/answer/nvidia-smi"


def smi_answer(driver_version: str) -> str:
    """The stand-in nvidia-smi answering for driver ``driver_version`` (its branch's CUDA version),
    to be put at ANSWER_PATH."""
    return _template("nvidia-smi.sh", DRIVER_VERSION=driver_version,
                     CUDA_VERSION=CUDA_OF_BRANCH[driver_version.split(".", 1)[0]])


def _template(name: str, **values: str) -> str:
    text = (STANDIN / name).read_text()
    for k, v in values.items():
        text = text.replace(f"@{k}@", v)
    left = re.findall(r"@[A-Z_]+@", text)
    if left:
        raise ValueError(f"{name}: unreplaced {left}")
    return text


def _inputs_digest(kernel_release: str, distros, key_name: str | None, docker_io: Path | None) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([RECIPE_VERSION, kernel_release, list(distros), key_name, CUDA_OF_BRANCH,
                         TOOLKIT_VERSION, GPU_PROFILES, DOCKER_CE_VERSIONS, CONTAINERD_IO_VERSION,
                         DOCKER_PLUGINS, docker_io.name if docker_io else None]).encode())
    for p in sorted(STANDIN.iterdir()):
        if p.is_file() and not p.name.endswith(".pyc"):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    h.update(Path(__file__).read_bytes())
    for p in sorted(vendorfacts.DATA.glob("*.toml")):
        h.update(p.read_bytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- keys

def _ensure_key(gnupg_home: Path) -> str:
    gnupg_home.mkdir(parents=True, exist_ok=True)
    os.chmod(gnupg_home, 0o700)
    env = dict(os.environ, GNUPGHOME=str(gnupg_home))
    listing = _run(["gpg", "--batch", "--with-colons", "--list-secret-keys"], env=env).stdout
    fprs = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    if not fprs:
        _run(["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
              "--quick-generate-key", KEY_UID, "ed25519", "cert", "never"], env=env)
        listing = _run(["gpg", "--batch", "--with-colons", "--list-secret-keys"], env=env).stdout
        fprs = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    if not any(line.startswith("ssb:") for line in listing.splitlines()):
        # signatures come from a subkey, as with Docker's key (keys made before had none)
        _run(["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
              "--quick-add-key", fprs[0], "ed25519", "sign", "never"], env=env)
    return fprs[0].upper()


def _gpg(gnupg_home: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GNUPGHOME=str(gnupg_home))
    return _run(["gpg", "--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", "", *args], env=env)


# --------------------------------------------------------------------------- packages

def _deb(out_dir: Path, name: str, version: str, *, arch: str = "amd64", depends: str = "",
         recommends: str = "", section: str = "utils", description: str, files=(),
         symlinks=(), postinst: str | None = None, prerm: str | None = None,
         extra_control: dict | None = None) -> dict:
    """Build one .deb with dpkg-deb. ``files``: (path, text or Path, mode); ``symlinks``: (path, target)."""
    with tempfile.TemporaryDirectory(prefix=f"deb-{name}-") as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        for path, content, mode in files:  # content: text, or a file (Path) to copy
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, target)
            else:
                target.write_text(content)
            os.chmod(target, mode)
        for path, link in symlinks:
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(link, target)
        doc = root / "usr/share/doc" / name / "README"
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(f"{name} {version}: {description.splitlines()[0]}\n")
        size_kib = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()) // 1024 + 1
        control = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}",
                   f"Maintainer: {MAINTAINER}", f"Installed-Size: {size_kib}", f"Section: {section}",
                   "Priority: optional"]
        if depends:
            control.append(f"Depends: {depends}")
        if recommends:
            control.append(f"Recommends: {recommends}")
        for key, value in (extra_control or {}).items():
            control.append(f"{key}: {value}")
        first, *rest = description.splitlines()
        control.append(f"Description: {first}")
        control += [f" {line}" if line.strip() else " ." for line in rest]
        (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
        for script, body in (("postinst", postinst), ("prerm", prerm)):
            if body:
                p = root / "DEBIAN" / script
                p.write_text("#!/bin/sh\nset -e\n" + body.strip() + "\nexit 0\n")
                os.chmod(p, 0o755)
        for d in root.rglob("*"):
            if d.is_dir():
                os.chmod(d, 0o755)
        filename = f"{name}_{version.split(':')[-1]}_{arch}.deb"
        _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root),
              str(out_dir / filename)])
    return {"package": name, "version": version, "architecture": arch, "filename": filename,
            "depends": depends}


def _standin_branches(distro: str) -> dict[str, tuple[str, str]]:
    """branch -> (driver version, CUDA version) the stand-in builds for ``distro``: the real
    releases its facts name (tritonfleet/data/nvidia_repos/<distro>.toml, key releases)."""
    out = {}
    for branch in vendorfacts.branches(distro):
        version = vendorfacts.release(distro, branch)
        if version:
            out[branch] = (version, CUDA_OF_BRANCH[branch])
    return out


def _file_roles(distro: str, branch: str) -> dict[str, str]:
    """Which package of the set carries the stand-in's nvidia-smi, daemon, module and NVML."""
    if vendorfacts.family(distro) == "ubuntu":
        suffix = "" if int(branch) >= 590 else f"-{branch}"
        return {"smi": f"nvidia-utils{suffix}", "persistenced": f"nvidia-compute-utils{suffix}",
                "dkms": f"nvidia-dkms{suffix}", "nvml": f"libnvidia-compute{suffix}",
                "driver": f"nvidia-driver{suffix}"}
    return {"smi": "nvidia-smi", "persistenced": "nvidia-persistenced", "dkms": "nvidia-kernel-dkms",
            "nvml": "libnvidia-ml1", "driver": "nvidia-driver"}


def _for_flavour(name: str, flavour: str, flavour_of: dict, twin: dict) -> str:
    """``name`` (a package of the proprietary set), or its twin when ``flavour`` has its own."""
    if name not in flavour_of or flavour_of[name] == flavour:
        return name
    return twin[name]


def _package_version(distro: str, upstream: str) -> str:
    """The driver packages' version in ``distro``'s shape: the revision of the facts' example
    (Debian <v>-1, Ubuntu 22.04/24.04 <v>-0ubuntu1, Ubuntu 26.04 <v>-1ubuntu1)."""
    revision = vendorfacts.version_shape(distro)["example"].split("-", 1)[1]
    v = f"{upstream}-{revision}"
    if not vendorfacts.version_matches(distro, v, "driver"):
        raise ValueError(f"{distro}: {v} does not have the repository's version shape")
    return v


def _libcuda(driver_version: str) -> Path:
    """The stand-in libcuda.so.1 of driver ``driver_version`` (standin/libcuda-standin.c, built with the
    control machine's C compiler): what tritonfleet.gpu.cuda_check's program calls in a container."""
    build = Path(tempfile.mkdtemp(prefix=f"libcuda-{driver_version}-"))
    atexit.register(shutil.rmtree, build, ignore_errors=True)
    out = build / "libcuda.so.1"
    _run(["gcc", "-shared", "-fPIC", "-O2", f'-DSTANDIN_DRIVER_VERSION="{driver_version}"',
          "-o", str(out), str(STANDIN / "libcuda-standin.c")])
    return out


def _cuda_packages(out_dir: Path, kernel_release: str, distro: str = "debian12") -> list[dict]:
    """NVIDIA's driver package graph for ``distro``, from its facts: the real package names and
    set, the distro's version shapes, metapackages with lower bounds only (apt takes the newest
    branch unless something pins it), NVIDIA's pinning package where the repository has one."""
    built = []
    persistenced_unit = (STANDIN / "nvidia-persistenced.service").read_text()
    if vendorfacts.value(distro, "persistenced_unit") == "no-persistence-mode":
        persistenced_unit = persistenced_unit.replace("--verbose", "--no-persistence-mode --verbose")
    wayland = False
    for branch, (upstream, cuda) in _standin_branches(distro).items():
        v = _package_version(distro, upstream)
        meta_v = f"{upstream}-1"
        roles = _file_roles(distro, branch)
        # both kernel module flavours: the packages they share, and each one's own (metapackage
        # first), each own package conflicting with its twin of the other flavour (same module)
        prop = vendorfacts.driver_packages(distro, branch, "proprietary")
        opn = vendorfacts.driver_packages(distro, branch, "open")
        twin = {**dict(zip(prop, opn, strict=True)), **dict(zip(opn, prop, strict=True))}
        own = {f: vendorfacts.flavour_packages(distro, branch, f) for f in ("proprietary", "open")}
        flavour_of = {p: f for f, ps in own.items() for p in ps}
        shared = [p for p in prop[1:] if p not in flavour_of]
        members = list(dict.fromkeys([*prop[1:], *opn[1:]]))
        # the packages with the driver's and the module's roles, per flavour (one driver package
        # for both where the flavours share it)
        drivers = {f: _for_flavour(roles["driver"], f, flavour_of, twin) for f in ("proprietary", "open")}
        dkms_pkgs = {f: _for_flavour(roles["dkms"], f, flavour_of, twin) for f in ("proprietary", "open")}
        smi = _template("nvidia-smi.sh", DRIVER_VERSION=upstream, CUDA_VERSION=cuda)
        libcuda = _libcuda(upstream)
        persistenced = _template("nvidia-persistenced.sh", DRIVER_VERSION=upstream)
        for name in members:
            kw: dict = {"description": f"NVIDIA driver {upstream}: {name}\nTestbed stand-in (package set of "
                                       f"NVIDIA's {distro} repository)."}
            flavour = flavour_of.get(name)
            if flavour:
                kw["extra_control"] = {"Conflicts": twin[name]}
            if name == roles["smi"]:
                # with the driver's boot-time binding: udev's rules for it run at every boot
                kw.update(depends=f"{roles['nvml']} (= {v})", files=[
                    ("/usr/bin/nvidia-smi", smi, 0o755),
                    ("/usr/lib/nvidia-standin/libcuda.so.1", libcuda, 0o755),
                    ("/usr/lib/nvidia-standin/bind", (STANDIN / "nvidia-standin-bind.sh").read_text(), 0o755),
                    ("/usr/lib/nvidia-standin/load-module", (STANDIN / "nvidia-standin-load-module.sh").read_text(),
                     0o755),
                    ("/lib/systemd/system/nvidia-standin-bind.service",
                     (STANDIN / "nvidia-standin-bind.service").read_text(), 0o644)],
                          symlinks=[("/etc/systemd/system/multi-user.target.wants/nvidia-standin-bind.service",
                                     "/lib/systemd/system/nvidia-standin-bind.service")],
                          description=f"NVIDIA System Management Interface {upstream}\nTestbed stand-in nvidia-smi "
                                      f"(driver {upstream}, CUDA {cuda}); the GPU it\nreports is "
                                      "/etc/nvidia-standin/gpu.env.")
            elif name in dkms_pkgs.values():
                # DKMS's behaviour for this module: built for every kernel with headers at install,
                # and for each kernel (or its headers) installed later (Debian's dkms hooks); the
                # module's licence says its flavour (modinfo: the stand-in in /usr/local/sbin)
                is_open = flavour == "open"
                dkms = _template("nvidia-standin-dkms.sh", DRIVER_VERSION=upstream,
                                 LICENSE="Dual MIT/GPL" if is_open else "NVIDIA",
                                 DESCRIPTION="NVIDIA Open UNIX Kernel Module" if is_open else "NVIDIA UNIX Kernel Module")
                kw["files"] = [(f"/usr/src/nvidia-{upstream}/dkms.conf.testbed",
                                f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{upstream}"\n', 0o644),
                               ("/usr/lib/nvidia-standin/dkms", dkms, 0o755),
                               ("/usr/local/sbin/modinfo", (STANDIN / "nvidia-standin-modinfo.sh").read_text(), 0o755),
                               ("/etc/kernel/header_postinst.d/nvidia-standin-dkms",
                                "#!/bin/sh\nexec /usr/lib/nvidia-standin/dkms \"$1\"\n", 0o755),
                               ("/etc/kernel/postinst.d/nvidia-standin-dkms",
                                "#!/bin/sh\nexec /usr/lib/nvidia-standin/dkms \"$1\"\n", 0o755)]
                kw["postinst"] = "/usr/lib/nvidia-standin/dkms"
                kw["prerm"] = "if [ \"$1\" = remove ]; then /usr/lib/nvidia-standin/dkms remove; fi"
            elif name == roles["persistenced"]:
                kw.update(files=[("/usr/bin/nvidia-persistenced", persistenced, 0o755),
                                 ("/lib/systemd/system/nvidia-persistenced.service", persistenced_unit, 0o644)],
                          postinst=("if ! getent passwd nvidia-persistenced >/dev/null; then\n"
                                    "  useradd --system --no-create-home --home-dir /var/run/nvidia-persistenced "
                                    "--shell /usr/sbin/nologin nvidia-persistenced\nfi\n"
                                    "if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi"),
                          prerm=("if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then\n"
                                 "  systemctl stop nvidia-persistenced.service 2>/dev/null || true\nfi"))
            elif name in drivers.values():
                # the driver's own packages move together (same version), the egl-wayland library
                # (not the driver's: an epoch, its own versions) comes along as on real hosts. A
                # driver package both flavours share (Debian's nvidia-driver) takes either
                # flavour's module (NVIDIA's guide installs nvidia-kernel-open-dkms with it).
                deps = [f"{m} (= {v})" for m in (shared if not flavour else [*shared, *own[flavour][1:]])
                        if m != name and m not in dkms_pkgs.values()]
                mods = [dkms_pkgs[flavour]] if flavour else [dkms_pkgs["proprietary"], dkms_pkgs["open"]]
                deps.append(" | ".join(f"{m} (= {v})" for m in mods))
                if flavour:
                    deps += [f"{m} (= {v})" for m in own[flavour][1:] if m not in (name, dkms_pkgs[flavour])
                             and f"{m} (= {v})" not in deps]
                kw["depends"] = ", ".join([*deps, "libnvidia-egl-wayland1"])
                wayland = True
            built.append(_deb(out_dir, name, v, section="non-free/libs", **kw))
        # metapackages: lower bounds only, as NVIDIA's. cuda-drivers-<branch>: the driver with either
        # flavour (Ubuntu's lists the -open driver as an alternative); nvidia-open-<branch>: the
        # driver with the open modules
        prop_meta, open_meta = own["proprietary"][0], own["open"][0]
        alternatives = list(dict.fromkeys([drivers["proprietary"], drivers["open"]]))
        built.append(_deb(out_dir, prop_meta, meta_v, section="multiverse/metapackages",
                          depends=" | ".join(f"{d} (>= {upstream})" for d in alternatives),
                          description=f"CUDA Driver meta-package, branch-specific (R{branch})\n"
                                      f"Installs the R{branch} driver ({upstream}) or newer."))
        built.append(_deb(out_dir, open_meta, meta_v, section="multiverse/metapackages",
                          depends=", ".join(f"{d} (>= {upstream})"
                                            for d in dict.fromkeys([drivers["open"], dkms_pkgs["open"]])),
                          description=f"NVIDIA Driver meta-package, Open GPU kernel modules (R{branch})\n"
                                      f"Installs the R{branch} driver ({upstream}) or newer with the open modules."))
        pin = vendorfacts.pinning_package(distro, branch)
        if pin:
            prefs = (f"# {pin}: keeps the driver on branch {branch}\n"
                     f"Package: {' '.join(vendorfacts.all_driver_packages(distro))}\n"
                     f"Pin: version {branch}.*\nPin-Priority: 1000\n")
            pin_v = f"{branch}-1" if vendorfacts.family(distro) == "debian" else f"{branch}-2ubuntu1"
            built.append(_deb(out_dir, pin, pin_v, arch="all", section="multiverse/metapackages",
                              description=f"NVIDIA driver pinning package for branch {branch}\n"
                                          "Testbed stand-in: apt preferences for the driver's packages.",
                              files=[(f"/etc/apt/preferences.d/{pin}", prefs, 0o644)]))
    if wayland:
        built.append(_deb(out_dir, "libnvidia-egl-wayland1", "1:1.1.13-1", section="libs",
                          description="NVIDIA EGL Wayland library\nTestbed stand-in (not part of the driver's "
                                      "set: its own version, with an epoch)."))
    kver = kernel_release if re.match(r"^[0-9][A-Za-z0-9.+~-]*$", kernel_release) else "1"
    built.append(_deb(out_dir, f"linux-headers-{kernel_release}", kver, section="kernel",
                      description=f"Header files for Linux {kernel_release}\n"
                                  "Testbed stand-in: the test hosts run the test machine's kernel.",
                      files=[(f"/usr/src/linux-headers-{kernel_release}/Makefile",
                              f"# Linux {kernel_release} (testbed stand-in headers)\n", 0o644)],
                      symlinks=[(f"/lib/modules/{kernel_release}/build",
                                 f"/usr/src/linux-headers-{kernel_release}")]))
    built += _newer_kernel_packages(out_dir, kernel_release)
    return built


def newer_kernels(kernel_release: str) -> tuple[str, str]:
    """Two kernel releases newer than the test machine's (version order, as GRUB and `sort -V` see
    them): the first with a headers package in the stand-in repository, the second without."""
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(.*)$", kernel_release)
    if not m:
        return f"{kernel_release}.1", f"{kernel_release}.2"
    a, b, c, rest = m.group(1), m.group(2), int(m.group(3)), m.group(4)
    return f"{a}.{b}.{c + 1}{rest}", f"{a}.{b}.{c + 2}{rest}"


def _newer_kernel_packages(out_dir: Path, kernel_release: str) -> list[dict]:
    """A kernel upgrade as the distro ships it: linux-image-<k> puts the kernel in /boot, runs the
    /etc/kernel/postinst.d hooks (DKMS builds there when the headers are already installed) and asks
    for a reboot (/var/run/reboot-required, the package in reboot-required.pkgs: Ubuntu's
    update-notifier does this for kernel packages); linux-headers-<k> runs the
    /etc/kernel/header_postinst.d hooks (DKMS builds there). The second kernel has no headers
    package: DKMS cannot build for it."""
    with_headers, without = newer_kernels(kernel_release)
    built = []
    for k in (with_headers, without):
        kver = re.sub(r"[^A-Za-z0-9.+~-]", "", k) or "1"
        built.append(_deb(out_dir, f"linux-image-{k}", kver if kver[0].isdigit() else "1", section="kernel",
                          description=f"Linux {k} for 64-bit PCs\nTestbed stand-in: a kernel upgrade (a file in "
                                      "/boot, a modules directory).",
                          files=[(f"/boot/vmlinuz-{k}", f"stand-in kernel image {k}\n", 0o644),
                                 (f"/lib/modules/{k}/modules.order", "", 0o644)],
                          postinst=(f"run-parts --report --arg={k} --arg=/boot/vmlinuz-{k} /etc/kernel/postinst.d "
                                    "|| true\n"
                                    "echo '*** System restart required ***' > /var/run/reboot-required\n"
                                    f"echo linux-image-{k} >> /var/run/reboot-required.pkgs")))
    built.append(_deb(out_dir, f"linux-headers-{with_headers}", re.sub(r"[^A-Za-z0-9.+~-]", "", with_headers),
                      section="kernel",
                      description=f"Header files for Linux {with_headers}\nTestbed stand-in.",
                      files=[(f"/usr/src/linux-headers-{with_headers}/Makefile",
                              f"# Linux {with_headers} (testbed stand-in headers)\n", 0o644)],
                      symlinks=[(f"/lib/modules/{with_headers}/build", f"/usr/src/linux-headers-{with_headers}")],
                      postinst=f"run-parts --report --arg={with_headers} /etc/kernel/header_postinst.d || true"))
    return built


def _toolkit_packages(out_dir: Path) -> list[dict]:
    v = f"{TOOLKIT_VERSION}-{DEB_REVISION}"
    commit = hashlib.sha1(f"tritonfleet-testbed-{v}".encode()).hexdigest()
    ctk = _template("nvidia-ctk.py", TOOLKIT_VERSION=TOOLKIT_VERSION, COMMIT=commit)
    hook = _template("nvidia-container-runtime-hook.py", TOOLKIT_VERSION=TOOLKIT_VERSION)
    runtime = _template("nvidia-container-runtime.sh", TOOLKIT_VERSION=TOOLKIT_VERSION)
    cli = _template("nvidia-container-cli.sh", TOOLKIT_VERSION_SHORT=TOOLKIT_VERSION)
    return [
        _deb(out_dir, "libnvidia-container1", v, section="libs",
             description="NVIDIA container runtime library\nTestbed stand-in."),
        _deb(out_dir, "libnvidia-container-tools", v, section="utils",
             depends=f"libnvidia-container1 (= {v})",
             description="NVIDIA container runtime library (command-line tools)\nTestbed stand-in nvidia-container-cli.",
             files=[("/usr/bin/nvidia-container-cli", cli, 0o755)]),
        _deb(out_dir, "nvidia-container-toolkit-base", v, section="utils", depends="python3",
             description="NVIDIA Container Toolkit Base\nTestbed stand-in nvidia-ctk and nvidia-container-runtime.",
             files=[("/usr/bin/nvidia-ctk", ctk, 0o755),
                    ("/usr/bin/nvidia-container-runtime", runtime, 0o755),
                    ("/etc/nvidia-container-runtime/config.toml",
                     '#accept-nvidia-visible-devices-as-volume-mounts = false\n'
                     '[nvidia-container-runtime]\nmode = "auto"\n'
                     '[nvidia-container-runtime-hook]\npath = "nvidia-container-runtime-hook"\n', 0o644)]),
        _deb(out_dir, "nvidia-container-toolkit", v, section="utils",
             depends=(f"nvidia-container-toolkit-base (= {v}), libnvidia-container-tools (>= {v}), "
                      "libnvidia-container-tools (<< 2.0.0), python3"),
             description="NVIDIA Container toolkit\nTestbed stand-in nvidia-container-runtime-hook (OCI prestart hook).",
             files=[("/usr/bin/nvidia-container-runtime-hook", hook, 0o755),
                    # stand-in of systemd re-applying device rules at daemon-reload (GPU loss)
                    ("/usr/lib/systemd/system-generators/nvidia-standin-device-rules",
                     (STANDIN / "nvidia-standin-device-rules.sh").read_text(), 0o755)]),
    ]


def debian_package(name: str, cache: Path | None = None) -> Path:
    """Debian's ``name`` .deb (this machine's architecture), fetched once with ``apt-get download``
    from this machine's own apt sources into the testbed cache."""
    from .rootfs import CACHE

    d = (cache or CACHE) / "debs"
    d.mkdir(parents=True, exist_ok=True)
    found = sorted(d.glob(f"{name}_*.deb"))
    if found:
        return found[-1]
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=d))
    try:
        res = subprocess.run(["apt-get", "download", "-q", name], cwd=tmp, capture_output=True, text=True)
        if res.returncode != 0:  # no package lists on a fresh machine
            _run(["apt-get", "update", "-q"])
            _run(["apt-get", "download", "-q", name], cwd=tmp)
        deb = next(tmp.glob(f"{name}_*.deb"))
        os.chmod(deb, 0o644)
        return deb.rename(d / deb.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _docker_packages(pool: Path, docker_io_deb: Path, suffix: str = DOCKER_DEB_SUFFIX) -> list[dict]:
    """Docker's package set for one suite (``suffix``: its version suffix), the engine repacked
    from Debian's docker.io (see the module doc)."""
    built = []
    with tempfile.TemporaryDirectory(prefix="docker-io-") as tmp:
        src = Path(tmp)
        _run(["dpkg-deb", "-x", str(docker_io_deb), str(src)])
        io_version = _run(["dpkg-deb", "-f", str(docker_io_deb), "Version"]).stdout.strip()
        io_depends = _run(["dpkg-deb", "-f", str(docker_io_deb), "Depends"]).stdout.strip()
        # docker.io's own dependencies, but containerd/runc through containerd.io, no sysvinit
        deps = [d.strip() for d in io_depends.split(",")
                if d.strip().split()[0] not in ("containerd", "runc", "lsb-base")]
        origin = f"Testbed stand-in: the engine is Debian's docker.io {io_version}, repacked."
        containerd = CONTAINERD_IO_VERSION
        built.append(_deb(pool, "containerd.io", containerd, section="devel",
                          depends="containerd (>= 1.6~), runc (>= 1.1~)",
                          description=f"An open and reliable container runtime\n{origin}\n"
                                      "Depends on Debian's containerd and runc."))
        engine = [(f, src / f.lstrip("/"), 0o755) for f in ("/usr/sbin/dockerd", "/usr/sbin/docker-proxy")]
        engine += [(f, src / f.lstrip("/"), 0o644) for f in ("/lib/systemd/system/docker.service",
                                                             "/lib/systemd/system/docker.socket")]
        init = [("/usr/bin/docker-init", "tini-static")] if (src / "usr/bin/docker-init").is_symlink() else []
        cli = [("/usr/bin/docker", src / "usr/bin/docker", 0o755)]
        completion = src / "usr/share/bash-completion/completions/docker"
        if completion.is_file():
            cli.append(("/usr/share/bash-completion/completions/docker", completion, 0o644))
        plugins = ", ".join(DOCKER_PLUGINS)
        for upstream in DOCKER_CE_VERSIONS:
            v = f"5:{upstream}{suffix}"
            built.append(_deb(pool, "docker-ce-cli", v, section="admin",
                              depends=", ".join(d for d in deps if d.split()[0] == "libc6"),
                              recommends=plugins,
                              description=f"Docker CLI: the open-source application container engine\n{origin}",
                              files=cli, extra_control={"Conflicts": "docker (<< 1.5~), docker.io"}))
            built.append(_deb(pool, "docker-ce", v, section="admin",
                              depends=", ".join(["containerd.io (>= 1.6.24)", "docker-ce-cli", *deps]),
                              recommends="apparmor, ca-certificates, git, pigz, procps, xz-utils",
                              description=f"Docker: the open-source application container engine\n{origin}",
                              files=engine, symlinks=init,
                              extra_control={"Conflicts": "docker (<< 1.5~), docker-engine, docker.io"},
                              postinst=("if [ \"$1\" = configure ]; then\n"
                                        "  getent group docker >/dev/null || addgroup --system docker\n"
                                        "  if [ -d /run/systemd/system ]; then\n"
                                        "    systemctl daemon-reload || true\n"
                                        "    systemctl enable docker.service docker.socket >/dev/null 2>&1 || true\n"
                                        "    systemctl start docker.service || true\n"
                                        "  fi\nfi"),
                              prerm=("if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then\n"
                                     "  systemctl stop docker.service docker.socket 2>/dev/null || true\nfi")))
        for package, (plugin, command, upstream, title, line) in DOCKER_PLUGINS.items():
            script = _template("docker-cli-plugin.sh", PLUGIN=plugin, PACKAGE=package, VERSION=upstream,
                               COMMAND=command, DESCRIPTION=title, VERSION_LINE=line)
            built.append(_deb(pool, package, f"{upstream}{suffix}", section="admin",
                              description=f"{title} CLI plugin\nTestbed stand-in: answers `docker {command} "
                                          "version` only.",
                              files=[(f"/usr/libexec/docker/cli-plugins/{plugin}", script, 0o755)]))
    return built


def _index_and_sign_dists(root: Path, suite: str, component: str, gnupg_home: Path, fingerprint: str,
                          origin: str, label: str, arch: str = "amd64") -> None:
    """A ``dists/`` repository (``deb <root-url> <suite> <component>``) whose debs are already in
    ``root/dists/<suite>/pool/<component>/<arch>``, as Docker lays its repositories out."""
    pool = f"dists/{suite}/pool/{component}/{arch}"
    packages = _run(["apt-ftparchive", "packages", pool], cwd=root).stdout
    bin_dir = root / "dists" / suite / component / f"binary-{arch}"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "Packages").write_text(packages)
    _run(["gzip", "-9nkf", "Packages"], cwd=bin_dir)
    dist = root / "dists" / suite
    for stale in ("Release", "InRelease", "Release.gpg"):
        (dist / stale).unlink(missing_ok=True)
    release = _run(["apt-ftparchive",
                    "-o", f"APT::FTPArchive::Release::Origin={origin}",
                    "-o", f"APT::FTPArchive::Release::Label={label}",
                    "-o", f"APT::FTPArchive::Release::Suite={suite}",
                    "-o", f"APT::FTPArchive::Release::Codename={suite}",
                    "-o", f"APT::FTPArchive::Release::Components={component}",
                    "-o", f"APT::FTPArchive::Release::Architectures={arch}",
                    "release", "."], cwd=dist).stdout
    (dist / "Release").write_text(release)
    _gpg(gnupg_home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--clearsign",
         "-o", str(dist / "InRelease"), str(dist / "Release"))
    _gpg(gnupg_home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--armor",
         "--detach-sign", "-o", str(dist / "Release.gpg"), str(dist / "Release"))


def _index_and_sign(repo_dir: Path, gnupg_home: Path, fingerprint: str, origin: str, label: str) -> None:
    packages = _run(["apt-ftparchive", "packages", "."], cwd=repo_dir).stdout
    (repo_dir / "Packages").write_text(packages)
    _run(["gzip", "-9nkf", "Packages"], cwd=repo_dir)
    release = _run(["apt-ftparchive",
                    "-o", f"APT::FTPArchive::Release::Origin={origin}",
                    "-o", f"APT::FTPArchive::Release::Label={label}",
                    "-o", "APT::FTPArchive::Release::Architectures=amd64",
                    "release", "."], cwd=repo_dir).stdout
    for stale in ("Release", "InRelease", "Release.gpg"):
        (repo_dir / stale).unlink(missing_ok=True)
    (repo_dir / "Release").write_text(release)
    _gpg(gnupg_home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--clearsign",
         "-o", str(repo_dir / "InRelease"), str(repo_dir / "Release"))
    _gpg(gnupg_home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--armor",
         "--detach-sign", "-o", str(repo_dir / "Release.gpg"), str(repo_dir / "Release"))


def build_vendor_repo(dest: Path, kernel_release: str, gnupg_home: Path | None = None,
                      key_name: str | None = None, distros=STANDIN_DISTROS,
                      docker_io_deb: Path | None = None) -> VendorRepo:
    """Build (or reuse, when already built from the same inputs) the stand-in repositories in
    ``dest``.  ``key_name``: the CUDA key's file name (default: last 8 hex digits of the
    fingerprint + ".pub", as NVIDIA names its keys).  ``docker_io_deb``: Debian's docker.io
    package to build Docker's repository from (none: no Docker repository)."""
    dest = Path(dest)
    gnupg_home = Path(gnupg_home) if gnupg_home else dest / ".gnupg"
    distros = tuple(distros)
    docker_io_deb = Path(docker_io_deb) if docker_io_deb else None
    digest = _inputs_digest(kernel_release, distros, key_name, docker_io_deb)
    stamp = dest / ".vendor-repo.json"
    if stamp.is_file():
        try:
            saved = json.loads(stamp.read_text())
            repo = VendorRepo.from_json(saved["repo"])
            if (saved.get("digest") == digest and Path(saved["repo"]["gnupg_home"]) == gnupg_home
                    and all((d / "InRelease").is_file() for d in repo.cuda_dirs.values())
                    and repo.toolkit_dir and (repo.toolkit_dir / "InRelease").is_file()
                    and repo.cuda_key.is_file() and repo.toolkit_key.is_file()
                    and (docker_io_deb is None or all((repo.docker_dir / "dists" / suite / "InRelease").is_file()
                                                      for suite in DOCKER_SUITES))):
                return repo
        except (ValueError, KeyError, TypeError):
            pass
    dest.mkdir(parents=True, exist_ok=True)
    try:
        return _build(dest, gnupg_home, key_name, distros, docker_io_deb, kernel_release, digest, stamp)
    finally:
        # gpg leaves an agent running for the key's home: stop it (it is ours)
        subprocess.run(["gpgconf", "--homedir", str(gnupg_home), "--kill", "all"], capture_output=True, check=False)


def _build(dest: Path, gnupg_home: Path, key_name: str | None, distros: tuple, docker_io_deb: Path | None,
           kernel_release: str, digest: str, stamp: Path) -> VendorRepo:
    fingerprint = _ensure_key(gnupg_home)
    key_name = key_name or f"{fingerprint[-8:].lower()}.pub"
    armored = _gpg(gnupg_home, "--armor", "--export", fingerprint).stdout
    binary_keyring = dest / "vendor-keyring.gpg"
    _gpg(gnupg_home, "--output", str(binary_keyring), "--export", fingerprint)

    for sub in ("cuda", "libnvidia-container", "docker"):
        shutil.rmtree(dest / sub, ignore_errors=True)
    cuda_dirs: dict[str, Path] = {}
    cuda_built: list[dict] = []
    for distro in distros:
        d = dest / "cuda" / distro / "x86_64"
        d.mkdir(parents=True)
        cuda_built += [dict(b, distro=distro) for b in _cuda_packages(d, kernel_release, distro)]
        _index_and_sign(d, gnupg_home, fingerprint, "NVIDIA", CUDA_REPO_LABEL)
        (d / key_name).write_text(armored)
        cuda_dirs[distro] = d
    first = cuda_dirs[distros[0]]

    toolkit_dir = dest / "libnvidia-container/stable/deb/amd64"
    toolkit_dir.mkdir(parents=True)
    toolkit_built = _toolkit_packages(toolkit_dir)
    _index_and_sign(toolkit_dir, gnupg_home, fingerprint, "NVIDIA", "NVIDIA Container Toolkit")
    toolkit_key = dest / "libnvidia-container/gpgkey"
    toolkit_key.write_text(armored)

    packages = {"cuda": cuda_built, "toolkit": toolkit_built}
    docker_dir = docker_key = None
    if docker_io_deb:
        docker_dir = dest / "docker" / "debian"
        packages["docker"] = []
        for suite, suffix in DOCKER_SUITES.items():
            pool = docker_dir / "dists" / suite / "pool" / "stable" / "amd64"
            pool.mkdir(parents=True)
            packages["docker"] += [dict(b, suite=suite) for b in _docker_packages(pool, docker_io_deb, suffix)]
            _index_and_sign_dists(docker_dir, suite, "stable", gnupg_home, fingerprint, "Docker", "Docker CE")
        docker_key = docker_dir / "gpg"
        docker_key.write_text(armored)

    repo = VendorRepo(root=dest, fingerprint=fingerprint, cuda_key_name=key_name,
                      cuda_key=first / key_name, toolkit_key=toolkit_key, keyring=binary_keyring,
                      gnupg_home=gnupg_home, cuda_dirs=cuda_dirs, toolkit_dir=toolkit_dir,
                      kernel_release=kernel_release, packages=packages,
                      docker_dir=docker_dir, docker_key=docker_key)
    stamp.write_text(json.dumps({"digest": digest, "repo": repo.to_json()}, indent=2))
    return repo
