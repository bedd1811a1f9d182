"""Command generation of the deploy steps (pyinfra's @fake connector): what runs, and what
does not run on a converged host. The same steps run for real in testbed/test_e2e.py."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from tests.support.fakehost import defaults, run_fake
from tritonfleet.steps.host_prep import (
    PERSISTENCE_DROPIN,
    PERSISTENCE_DROPIN_TEXT,
    container_toolkit,
    nvidia_driver,
)

FPR = "EB693B3035CD5710E231E123A4B469963BF863CC"
BASE = {  # before a reboot: the kernel that will boot has the NVIDIA module (tritonfleet.host.boot_kernel; first:
        # its command also runs uname -r)
        'echo "running=$r"': ["running=6.1.0-28-amd64", "boot=6.1.0-28-amd64", "module=yes"],
        "uname -m": "x86_64", "uname -r": "6.1.0-28-amd64",
        "nvidia-smi -q": "    Persistence Mode                      : Enabled"}
# the proprietary flavour here (the branch logic below is the same for both; the default, open,
# and switching between them: unit/host/test_kernel_module.py)
DATA = {"cuda_distro": "debian12", "nvidia_kernel_module": "proprietary"}


def ops(cmds):
    """Commands that are not fact reads."""
    return [c for c in cmds if "##PYINFRA_NOCMD##" not in c and not c.startswith(("uname", "cat /etc/docker",
            "[ -f ", "dpkg-query -W -f '${db:Status-Abbrev}\\t", "systemctl show"))]


def dpkg(*rows: str) -> list[str]:
    """dpkg-query output lines ('status name version')."""
    return ["\t".join(r.split()) for r in rows]


def test_driver_bare_host():
    host, cmds, state = run_fake(nvidia_driver, BASE, DATA)
    assert not state.failed_hosts
    run = "\n".join(ops(cmds))
    # key fetched on the host and checked against the pinned fingerprint before it is installed
    assert "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub" in run
    assert FPR in run and "/usr/share/keyrings/cuda-archive-keyring.gpg" in run
    assert "apt-get -y update" in run or "apt-get update" in run
    assert re.search(r"install .*linux-headers-6\.1\.0-28-amd64.*dkms", run)
    # debian12's default branch is 580 (the repository has no R535): NVIDIA's pinning package
    # first, alone, then the metapackage
    pin = next(i for i, c in enumerate(cmds) if re.search(r"install .*nvidia-driver-pinning-580", c))
    driver = next(i for i, c in enumerate(cmds) if re.search(r"install .*cuda-drivers-580", c))
    assert pin < driver and "cuda-drivers" not in cmds[pin]
    assert "/etc/apt/preferences.d/tritonfleet-nvidia-driver" not in host.connector.uploads
    assert "update-initramfs -u" in run
    assert "apt-mark hold" in run
    assert "systemctl start nvidia-persistenced.service" in run


def test_driver_pinned_version_and_branch_from_data():
    host, cmds, _ = run_fake(nvidia_driver, BASE, {**DATA, "nvidia_driver_branch": "560",
                                                    "nvidia_driver_version": "560.28.03"})
    assert any("cuda-drivers-560=560.28.03-1" in c for c in cmds)
    # no pinning package for 560: our preferences cover every package of the driver's set
    pin = host.connector.uploads["/etc/apt/preferences.d/tritonfleet-nvidia-driver"]
    assert "Pin: version 560.28.03-*" in pin
    assert not any("nvidia-driver-pinning" in c for c in cmds)


def test_driver_converged_host_changes_nothing():
    responses = {
        **BASE,
        "cuda-archive-keyring.gpg": FPR,
        "dpkg-query -W": dpkg("ii nvidia-driver-pinning-580 580-1", "hi cuda-drivers-580 580.159.04-1",
                              "hi nvidia-driver 580.159.04-1", "hi nvidia-kernel-dkms 580.159.04-1", "ii linux-headers-6.1.0-28-amd64 6.1.76-1",
                              "ii dkms 3.0.10-8", "ii firmware-misc-nonfree 20230210-5"),
        "UnitFileState nvidia-persistenced.service": ["SubState=running", "UnitFileState=enabled"],
        PERSISTENCE_DROPIN: ["mode=644 user=root group=root",
                             hashlib.sha256(PERSISTENCE_DROPIN_TEXT.encode()).hexdigest()],
    }
    # (managed files: tests/unit/host/test_converged.py; the real re-run is in test_e2e_testbed)
    _, cmds, state = run_fake(nvidia_driver, responses, DATA)
    assert not state.failed_hosts
    run = "\n".join(ops(cmds))
    assert "curl" not in run, "a pinned key already installed must not be fetched again"
    assert "install cuda-drivers" not in run and "linux-headers" not in run
    assert "apt-mark hold" not in run and "systemctl start" not in run
    # holds and installed packages come from dpkg itself, never from apt's cache or `dpkg -l`
    # (read once per run while nothing changes: tests/unit/host/test_converged.py)
    assert not any(c.startswith(("dpkg -l", "apt-mark showhold")) or "( dpkg -l )" in c for c in cmds)


def test_driver_holds_packages_that_lost_their_hold():
    responses = {
        **BASE,
        "cuda-archive-keyring.gpg": FPR,
        "dpkg-query -W": dpkg("ii nvidia-driver-pinning-580 580-1", "ii cuda-drivers-580 580.159.04-1",
                              "hi nvidia-driver 580.159.04-1", "hi nvidia-kernel-dkms 580.159.04-1", "ii linux-headers-6.1.0-28-amd64 6.1.76-1",
                              "ii dkms 3.0.10-8", "ii firmware-misc-nonfree 20230210-5"),
    }
    _, cmds, _ = run_fake(nvidia_driver, responses, DATA)
    assert "apt-mark hold" in "\n".join(ops(cmds))


def test_toolkit_configures_runtime_only_when_missing():
    _, cmds, _ = run_fake(container_toolkit, {**BASE, "cat /etc/docker/daemon.json": json.dumps({"log-driver": "json-file"})}, DATA)
    run = "\n".join(cmds)
    assert "nvidia-ctk runtime configure --runtime=docker" in run
    assert re.search(r"install .*nvidia-container-toolkit=1\.17\.8-1.*libnvidia-container1=1\.17\.8-1", run)
    assert re.search(r"systemctl (re)?start docker.service", run)

    daemon = json.dumps({"log-driver": "json-file", "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}})
    _, cmds, _ = run_fake(container_toolkit, {**BASE, "cat /etc/docker/daemon.json": daemon,
                                              "command -v nvidia-container-runtime-hook": "/usr/bin/nvidia-container-runtime-hook"}, DATA)
    run = "\n".join(cmds)
    assert "nvidia-ctk runtime configure" not in run
    assert "systemctl restart docker" not in run


def test_toolkit_refuses_broken_daemon_json():
    _, cmds, state = run_fake(container_toolkit, {**BASE, "cat /etc/docker/daemon.json": "{not json"}, DATA)
    assert state.failed_hosts
    assert not any("nvidia-ctk" in c for c in cmds)


def test_secure_boot_stops_before_the_driver():
    _, cmds, state = run_fake(nvidia_driver, {**BASE, "mokutil --sb-state": "SecureBoot enabled"}, DATA)
    assert state.failed_hosts
    assert not any("apt-get" in c or "curl" in c for c in cmds)
    _, cmds, state = run_fake(nvidia_driver, {**BASE, "mokutil --sb-state": "SecureBoot enabled"},
                              {**DATA, "nvidia_secure_boot_ok": True})
    assert not state.failed_hosts and any("cuda-drivers-580" in c for c in cmds)


@pytest.mark.parametrize("version,pattern", [("27.3.1", "5:27.3.1-*"),  # the default, any distro
                                             ("5:27.3.1-1~ubuntu.22.04~jammy", "5:27.3.1-1~ubuntu.22.04~jammy")])
def test_docker_from_dockers_repository_with_pinned_key(version, pattern):
    from tritonfleet.steps.host_prep import docker_engine

    os_release = ["/etc/os-release", "ID=ubuntu", 'NAME="Ubuntu"', 'VERSION_ID="22.04"',
                  "VERSION_CODENAME=jammy", "---"]
    host, cmds, state = run_fake(docker_engine, {**BASE, "ls -pdL *-release": os_release,
                                                 "-f '${Version}' docker-ce": "5:27.3.1-1~ubuntu.22.04~jammy"},
                                 {**DATA, "docker_version": version})
    assert not state.failed_hosts
    run = "\n".join(cmds)
    assert "9DC858229FC7DD38854AE2D88D81803C0EBFCD88" in run and "/etc/apt/keyrings/docker.gpg" in run
    assert "https://download.docker.com/linux/ubuntu/gpg" in run
    assert "/etc/apt/sources.list.d/docker.list" in run
    # apt's candidate is the pinned version (priority 1001, also downgrades)
    assert host.connector.uploads["/etc/apt/preferences.d/tritonfleet-docker"].splitlines()[1:] == [
        "Package: docker-ce docker-ce-cli docker-ce-rootless-extras", f"Pin: version {pattern}",
        "Pin-Priority: 1001"]
    assert re.search(r"install .*docker-ce docker-ce-cli containerd\.io docker-buildx-plugin docker-compose-plugin", run)
    names = {n for meta in state.op_meta.values() for n in meta.names}
    assert f"Docker Engine | check: docker-ce is {version}" in names
    assert "Docker Engine | move Docker Engine to the pinned version" not in names  # nothing installed yet


def test_docker_installed_at_another_version_is_moved_to_the_pin():
    from tritonfleet.steps.host_prep import docker_engine

    os_release = ["/etc/os-release", "ID=debian", 'NAME="Debian GNU/Linux"', 'VERSION_ID="12"',
                  "VERSION_CODENAME=bookworm", "---"]
    responses = {**BASE, "ls -pdL *-release": os_release,
                 "dpkg-query -W -f '${db": dpkg("ii docker-ce 5:27.4.0-1~debian.12~bookworm")}
    _, cmds, state = run_fake(docker_engine, responses, DATA)
    assert "apt-get install -y -q --allow-downgrades docker-ce docker-ce-cli" in "\n".join(cmds)
    responses["dpkg-query -W -f '${Version}' docker-ce"] = "5:27.3.1-1~debian.12~bookworm"
    # at the pinned version, the pin file in place: nothing to move
    from tritonfleet.steps.host_prep import DOCKER_PIN_FILE, docker_pin_text

    pin_sha256 = hashlib.sha256(docker_pin_text("27.3.1").encode()).hexdigest()
    responses.update({
        "dpkg-query -W -f '${db": dpkg("ii docker-ce 5:27.3.1-1~debian.12~bookworm"),
        re.compile(rf"\[ -f {DOCKER_PIN_FILE} \] && stat"): ["mode=644 user=root group=root", pin_sha256],
    })
    _, _, state = run_fake(docker_engine, responses, DATA)
    assert not state.failed_hosts
    names = {n for meta in state.op_meta.values() for n in meta.names}
    assert not any("move Docker Engine" in n for n in names)


def test_registry_secret_only_on_stdin(monkeypatch):
    from tritonfleet.steps.triton import triton_image

    secret = "s3cr3t-registry-token"
    monkeypatch.setenv("TRITONFLEET_REGISTRY_PASSWORD", secret)
    _, cmds, state = run_fake(triton_image, BASE, {"registry_user": "$oauthtoken"})
    assert not state.failed_hosts
    run = "\n".join(cmds)
    assert "--password-stdin nvcr.io" in run and "docker pull nvcr.io/nvidia/tritonserver:24.08-py3" in run
    assert secret not in run  # never in a command line (it travels by SFTP into a 0600 file)

    monkeypatch.delenv("TRITONFLEET_REGISTRY_PASSWORD")
    with pytest.raises(Exception, match="TRITONFLEET_REGISTRY_PASSWORD"):
        run_fake(triton_image, BASE, {"registry_user": "$oauthtoken"})


def test_present_image_is_not_pulled_again():
    from tritonfleet.steps.triton import triton_image

    _, cmds, _ = run_fake(triton_image, {**BASE, "docker image inspect": "sha256:" + "a" * 64}, {})
    assert not any("docker pull" in c for c in cmds)


def test_docker_repository_needs_a_known_distro():
    from tritonfleet.steps.host_prep import docker_engine

    with pytest.raises(Exception, match="docker_source"):
        run_fake(docker_engine, BASE, DATA)


# ---------------------------------------------------------------- architectures and distros

OS_RELEASE = {
    "ubuntu2204": ["/etc/os-release", "ID=ubuntu", 'NAME="Ubuntu"', 'VERSION_ID="22.04"',
                   "VERSION_CODENAME=jammy", "---"],
    "ubuntu2404": ["/etc/os-release", "ID=ubuntu", 'NAME="Ubuntu"', 'VERSION_ID="24.04"',
                   "VERSION_CODENAME=noble", "---"],
    "ubuntu2604": ["/etc/os-release", "ID=ubuntu", 'NAME="Ubuntu"', 'VERSION_ID="26.04"',
                   "VERSION_CODENAME=resolute", "---"],
    "debian12": ["/etc/os-release", "ID=debian", 'NAME="Debian GNU/Linux"', 'VERSION_ID="12"',
                 "VERSION_CODENAME=bookworm", "---"],
}


@pytest.mark.parametrize("distro,codename", [("ubuntu2204", "jammy"), ("ubuntu2404", "noble"),
                                             ("ubuntu2604", "resolute"), ("debian12", "bookworm")])
@pytest.mark.parametrize("machine,cuda_arch,deb_arch", [("aarch64", "sbsa", "arm64"),
                                                        ("x86_64", "x86_64", "amd64")])
def test_repository_paths_per_architecture_and_distro(distro, codename, machine, cuda_arch, deb_arch):
    """NVIDIA's CUDA repository names arm64 "sbsa"; apt and the other repositories say arm64."""
    from pyinfra.api import deploy

    from tritonfleet.steps.host_prep import docker_engine

    @deploy("host layer")
    def host_layer():
        nvidia_driver()
        docker_engine()
        container_toolkit()

    host, cmds, state = run_fake(host_layer, {"uname -m": machine, "uname -r": "6.8.0-1-generic",
                                              "nvidia-smi -q": BASE["nvidia-smi -q"],
                                              "ls -pdL *-release": OS_RELEASE[distro],
                                              "-f '${Version}' docker-ce": f"5:27.3.1-1~{distro}"})
    assert not state.failed_hosts
    run = "\n".join(cmds)
    vendor = "ubuntu" if distro.startswith("ubuntu") else "debian"
    cuda = f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{cuda_arch}"
    assert f"{cuda}/3bf863cc.pub" in run
    assert f"https://download.docker.com/linux/{vendor}/gpg" in run
    up = host.connector.uploads
    assert up["/etc/apt/sources.list.d/cuda.list"] == (
        f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {cuda}/ /\n")
    assert up["/etc/apt/sources.list.d/docker.list"] == (
        f"deb [arch={deb_arch} signed-by=/etc/apt/keyrings/docker.gpg] "
        f"https://download.docker.com/linux/{vendor} {codename} stable\n")
    assert up["/etc/apt/sources.list.d/nvidia-container-toolkit.list"] == (
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
        f"https://nvidia.github.io/libnvidia-container/stable/deb/{deb_arch} /\n")


def test_unsupported_os_is_named():
    os_release = ["/etc/os-release", "ID=fedora", 'NAME="Fedora Linux"', 'VERSION_ID="40"', "---"]
    with pytest.raises(Exception, match="unsupported OS Fedora 40.*cuda_distro"):
        run_fake(nvidia_driver, {**BASE, "ls -pdL *-release": os_release})


# ---------------------------------------------------------------- planning: checks and follow-ups

def test_converged_host_plans_no_follow_up():
    """Holds, reboot, nvidia-ctk and the Docker restart are planned only when what they follow
    will change, so a dry run of a converged host lists no change. (The follow-ups of managed
    files, apt update and initramfs, are proven by the dry run on the testbed.)"""
    daemon = json.dumps({"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}})
    responses = {
        **BASE,
        "cuda-archive-keyring.gpg": FPR,
        "nvidia-container-toolkit-keyring.gpg": "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
        "dpkg-query -W": dpkg("ii nvidia-driver-pinning-580 580-1", "hi cuda-drivers-580 580.159.04-1",
                              "hi nvidia-driver 580.159.04-1", "hi nvidia-kernel-dkms 580.159.04-1", "ii linux-headers-6.1.0-28-amd64 6.1.76-1",
                              "ii dkms 3.0.10-8", "ii firmware-misc-nonfree 20230210-5",
                              "ii nvidia-container-toolkit 1.17.8-1", "ii nvidia-container-toolkit-base 1.17.8-1",
                              "ii libnvidia-container-tools 1.17.8-1", "ii libnvidia-container1 1.17.8-1"),
        "UnitFileState nvidia-persistenced.service": ["SubState=running", "UnitFileState=enabled"],
        PERSISTENCE_DROPIN: ["mode=644 user=root group=root",
                             hashlib.sha256(PERSISTENCE_DROPIN_TEXT.encode()).hexdigest()],
        "cat /etc/docker/daemon.json": daemon,
        "command -v nvidia-container-runtime-hook": "/usr/bin/nvidia-container-runtime-hook",
        "nvidia-smi --query-gpu": ["0, Tesla T4, GPU-1, 00000000:00:1E.0, 580.159.04, 7.5, 15360", "rc=0"],
    }
    from pyinfra.api import deploy

    @deploy("host layer")
    def layer():
        nvidia_driver()
        container_toolkit()

    _, _, state = run_fake(layer, responses, DATA)
    planned = {n for meta in state.op_meta.values() for n in meta.names}
    for follow_up in ("hold driver packages", "reboot", "register the nvidia runtime", "restart Docker"):
        assert not any(follow_up in n for n in planned), (follow_up, planned)
    # ... and on a bare host they are all there
    _, _, state = run_fake(layer, BASE, DATA)
    planned = {n for meta in state.op_meta.values() for n in meta.names}
    for follow_up in ("apt update (CUDA", "rebuild initramfs", "hold driver packages", "reboot",
                      "register the nvidia runtime", "restart Docker"):
        assert any(follow_up in n for n in planned), (follow_up, planned)


def test_a_check_runs_but_is_never_a_planned_change():
    from pyinfra.api import Config, Inventory, State, deploy
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.operations import run_ops

    from tritonfleet.pyinfra_ext.check import check

    ran = []

    def verify(what):
        ran.append(what)

    @deploy("d")
    def d():
        check(name="check: something", function=verify, what="ran")

    inventory = Inventory(([("@fake/h", {"fake_delay": 0, "fake_delay_jitter": 0})], {}))
    state = State(inventory, Config())
    connect_all(state)
    add_deploy(state, d)
    host = inventory.get_host("@fake/h")
    (op_hash,) = state.ops[host]
    assert state.ops[host][op_hash].operation_meta.will_change is False
    assert ran == []
    run_ops(state)
    assert ran == ["ran"]


@pytest.mark.parametrize("container,image_id,restart", [
    # started after the unit was written and the release switched: nothing to do
    (["running=true", "image=sha256:" + "a" * 64, "started=1000.5",
      "/etc/systemd/system/triton.service=900.0", "/opt/triton/model_repository=950.0"], "a", None),
    (["running=true", "image=sha256:" + "a" * 64, "started=1000.5",
      "/etc/systemd/system/triton.service=1001.0", "/opt/triton/model_repository=950.0"], "a",
     "the unit changed after it started"),
    (["running=true", "image=sha256:" + "a" * 64, "started=1000.5",
      "/etc/systemd/system/triton.service=900.0", "/opt/triton/model_repository=1000.7"], "a",
     "the model release was switched after it started"),
    (["running=true", "image=sha256:" + "a" * 64, "started=1000.5",
      "/etc/systemd/system/triton.service=900.0", "/opt/triton/model_repository=950.0"], "b",
     "it runs image aaaaaaaaaaaa, nvcr.io/nvidia/tritonserver:24.08-py3 is bbbbbbbbbbbb"),
    ([], "a", None),  # no container: starting it is enough
])
def test_triton_restarted_when_an_earlier_run_stopped_before_the_restart(container, image_id, restart):
    """A run cut between changing the unit, image or live release and the restart leaves Triton on
    the old one; the next run sees it (the container started before the change) and restarts."""
    from tritonfleet.serving.unit import render_unit, unit_context
    from tritonfleet.steps.triton import triton_service

    data = defaults("t4")
    unit_sha = hashlib.sha256(render_unit(unit_context(data)).encode()).hexdigest()
    responses = {
        "docker inspect --format '{{.State.Running}}": container,
        "docker image inspect": "sha256:" + image_id * 64,
        re.compile(r"\[ -f /etc/systemd/system/triton.service \] && stat"): ["mode=644 user=root group=root", unit_sha],
        re.compile(r"\[ -f /etc/tritonfleet/triton-api-key \] && stat"): ["mode=600 user=root group=root", "0" * 64],
        "systemctl show": ["ActiveState=active", "UnitFileState=enabled"],
    }
    _, cmds, state = run_fake(triton_service, responses, {})
    names = [n for meta in state.op_meta.values() for n in meta.names]
    restarts = [n for n in names if "restart" in n]
    assert not any("systemd unit" in n and "daemon-reload" in n for n in names)
    if restart is None:
        assert restarts == [], names
    else:
        assert restarts == [f"Triton service | restart triton (an earlier run stopped before the restart: {restart})"]


# ---------------------------------------------------------------- NVIDIA's package scheme per distro

SOURCES_822 = ["##FILE /etc/apt/sources.list.d/debian.sources", "Types: deb",
               "URIs: http://deb.debian.org/debian", "Suites: bookworm bookworm-updates", "Components: main",
               "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg", "",
               "Types: deb", "URIs: http://deb.debian.org/debian-security", "Suites: bookworm-security",
               "Components: main contrib non-free non-free-firmware", ""]


@pytest.mark.parametrize("distro", ["ubuntu2204", "ubuntu2404", "debian12"])
def test_default_branch_installs_with_nvidias_pinning_package(distro):
    host, cmds, state = run_fake(nvidia_driver, {**BASE, "ls -pdL *-release": OS_RELEASE[distro],
                                                 "for f in /etc/apt/sources.list": SOURCES_822}, {})
    assert not state.failed_hosts
    installs = [c for c in cmds if "apt-get" in c and " install " in c]
    assert re.search(r"install nvidia-driver-pinning-580\b", installs[1]), installs
    # R580: NVIDIA's default kernel modules are the open ones (nvidia_kernel_module None)
    assert re.search(r"install nvidia-open-580\b", installs[2]), installs
    assert "/etc/apt/preferences.d/tritonfleet-nvidia-driver" not in host.connector.uploads
    hold = next(c for c in cmds if "xargs -r apt-mark hold" in c)
    names = set(re.findall(r"-e '?([a-z0-9.+-]+)'?", hold))
    # exactly the driver's packages: not the Container Toolkit, egl-wayland or DKMS
    assert not names & {"libnvidia-container1", "libnvidia-container-tools", "libnvidia-egl-wayland1", "dkms"}
    nonfree = host.connector.uploads.get("/etc/apt/sources.list.d/tritonfleet-debian-nonfree.sources")
    if distro == "debian12":
        assert {"nvidia-driver", "firmware-nvidia-gsp", "libnvoptix1", "cuda-drivers-580"} <= names
        assert re.search(r"install .*firmware-misc-nonfree", installs[0])
        # contrib/non-free added where the archive lacks them (not for the security source that has them)
        assert nonfree.splitlines()[1:] == ["Types: deb", "URIs: http://deb.debian.org/debian",
                                            "Suites: bookworm bookworm-updates",
                                            "Components: contrib non-free non-free-firmware",
                                            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"]
    else:
        assert {"nvidia-driver-580", "libnvidia-compute-580", "nvidia-dkms-580"} <= names
        assert nonfree is None and "firmware-misc-nonfree" not in installs[0]


def test_ubuntu2604_default_branch_is_r595_with_unversioned_names():
    """NVIDIA's ubuntu2604 repository has only R595 (tritonfleet/data/nvidia_repos/ubuntu2604.toml):
    the default branch there, its pinning package, the open metapackage and the set held, all
    without the branch in their names."""
    host, cmds, state = run_fake(nvidia_driver, {**BASE, "ls -pdL *-release": OS_RELEASE["ubuntu2604"]}, {})
    assert not state.failed_hosts
    installs = [c for c in cmds if "apt-get" in c and " install " in c]
    assert re.search(r"install nvidia-driver-pinning-595\b", installs[1]), installs
    assert re.search(r"install nvidia-open\b", installs[2]) and "nvidia-open-" not in installs[2], installs
    hold = next(c for c in cmds if "xargs -r apt-mark hold" in c)
    names = set(re.findall(r"-e '?([a-z0-9.+-]+)'?", hold))
    assert {"nvidia-driver", "libnvidia-compute", "nvidia-dkms", "nvidia-firmware"} <= names
    assert not any(n.endswith("-595") or n.endswith("-580") for n in names), names
    assert "nvidia-container-toolkit-base" not in names


def test_ubuntu_branch_without_pinning_package_gets_our_pin_over_the_whole_set():
    host, cmds, state = run_fake(nvidia_driver, {**BASE, "ls -pdL *-release": OS_RELEASE["ubuntu2204"]},
                                 {"nvidia_driver_branch": "535", "nvidia_driver_version": "535.104.12"})
    assert not state.failed_hosts
    assert any(re.search(r"install cuda-drivers-535=535\.104\.12-1\b", c) for c in cmds)
    assert not any("nvidia-driver-pinning" in c for c in cmds)
    pin = host.connector.uploads["/etc/apt/preferences.d/tritonfleet-nvidia-driver"].splitlines()
    packages = pin[1].split()[1:]
    assert {"nvidia-driver-535", "libnvidia-compute-535", "nvidia-utils-535", "cuda-drivers-535"} <= set(packages)
    # one pattern for both shapes: cuda-drivers-535 is 535.104.12-1, the driver 535.104.12-0ubuntu1
    assert pin[2:] == ["Pin: version 535.104.12-*", "Pin-Priority: 1001"]


def test_branch_switch_from_pinning_package_to_own_pin():
    installed = dpkg("ii nvidia-driver-pinning-580 580-1", "hi cuda-drivers-580 580.159.04-1",
                     "hi nvidia-driver 580.159.04-1", "hi nvidia-kernel-dkms 580.159.04-1", "hi nvidia-smi 580.159.04-1",
                     "ii libnvidia-egl-wayland1 1:1.1.13-1", "ii dkms 3.0.10-8")
    # (pyinfra's own remove reads `dpkg -l`)
    dpkg_l = ["ii  cuda-drivers-580  580.159.04-1  amd64  d", "ii  nvidia-driver-pinning-580  580-1  all  p"]
    host, cmds, state = run_fake(nvidia_driver, {**BASE, "dpkg-query -W": installed, "dpkg -l": dpkg_l},
                                 {**DATA, "nvidia_driver_branch": "570"})
    assert not state.failed_hosts
    run = [c for c in ops(cmds)]
    unhold = next(i for i, c in enumerate(run) if "apt-mark unhold" in c)
    remove = next(i for i, c in enumerate(run) if re.search(r"remove [^\n]*cuda-drivers-580 nvidia-driver-pinning-580", c))
    install = next(i for i, c in enumerate(run) if re.search(r"--allow-downgrades cuda-drivers-570", c))
    # lower bounds only: the installed packages of the set are named, so apt moves them to 570
    assert re.search(r"apt-get install -y -q --allow-downgrades cuda-drivers-570 nvidia-kernel-dkms nvidia-driver nvidia-smi\b",
                     run[install])
    assert unhold < remove < install
    assert "Pin: version 570.*" in host.connector.uploads["/etc/apt/preferences.d/tritonfleet-nvidia-driver"]


NO_COMMUNICATION = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                    "that the latest NVIDIA driver is installed and running.")


def test_persistence_mode_is_turned_on_and_checked():
    host, cmds, state = run_fake(nvidia_driver, BASE, DATA)
    assert "--persistence-mode" in host.connector.uploads[PERSISTENCE_DROPIN]
    assert "ExecStart=\n" in host.connector.uploads[PERSISTENCE_DROPIN]
    assert not state.failed_hosts
    off = {**BASE, "nvidia-smi -q": "    Persistence Mode                      : Disabled"}
    _, _, state = run_fake(nvidia_driver, off, DATA)
    assert state.failed_hosts  # the service runs, persistence mode is off: named, not passed


def test_pinned_release_change_moves_the_whole_set():
    installed = dpkg("hi cuda-drivers-570 570.133.07-1", "hi nvidia-driver 570.133.07-1", "hi nvidia-kernel-dkms 570.133.07-1", "hi libcuda1 570.133.07-1")
    host, cmds, state = run_fake(nvidia_driver, {**BASE, "dpkg-query -W": installed},
                                 {**DATA, "nvidia_driver_branch": "570", "nvidia_driver_version": "570.124.06"})
    assert not state.failed_hosts
    run = "\n".join(ops(cmds))
    assert "apt-mark unhold" in run
    assert re.search(r"apt-get install -y -q --allow-downgrades cuda-drivers-570=570\.124\.06-1 nvidia-kernel-dkms nvidia-driver "
                     r"libcuda1\b", run)
    assert "Pin: version 570.124.06-*" in host.connector.uploads["/etc/apt/preferences.d/tritonfleet-nvidia-driver"]


# --------------------------------------------------------------------------- SSH sessions (linger)

LINGER_KEY = "/var/lib/systemd/linger/"  # a substring of LINGER_COMMAND: the fake host's answer to it


@pytest.mark.parametrize("answer, user", [("none root", "root"), ("none deploy-bot", "deploy-bot"),
                                          ("linger root", None), ("no-logind", None), ("", None),
                                          ("none two words", None)])
def test_ssh_sessions_enables_linger_only_for_a_user_without_it(answer, user):
    from tritonfleet.steps.sessions import ssh_sessions

    _, cmds, state = run_fake(ssh_sessions, {LINGER_KEY: answer}, DATA)
    assert not state.failed_hosts
    changes = [c for c in cmds if "loginctl enable-linger" in c]
    assert changes == ([f"loginctl enable-linger {user}"] if user else []), cmds


def test_ssh_sessions_off_reads_and_changes_nothing():
    from tritonfleet.steps.sessions import ssh_sessions

    _, cmds, state = run_fake(ssh_sessions, {LINGER_KEY: "none root"}, {**DATA, "ssh_user_linger": False})
    assert not state.failed_hosts
    assert not any("linger" in c for c in cmds), cmds


def test_ssh_sessions_leave_a_run_on_the_host_itself_alone():
    """Pull mode runs the deploy on the host through pyinfra's @local connector: no SSH session,
    so no fact read and nothing changed; a host reached over a connection is acted on."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_host

    from tritonfleet.host.layer import keeps_sessions, session_facts

    inventory = Inventory(([("@local", {}), ("@fake/gpu1", {})], {}))
    State(inventory, Config())
    for name, acts in (("@local", False), ("@fake/gpu1", True)):
        with ctx_host.use(inventory.get_host(name)):
            assert keeps_sessions({"ssh_user_linger": True}) is acts, name
            assert bool(session_facts({"ssh_user_linger": True})) is acts, name
            assert not keeps_sessions({"ssh_user_linger": False}) and not session_facts({"ssh_user_linger": False})
