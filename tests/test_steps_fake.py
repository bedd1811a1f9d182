"""Command generation of the deploy steps (pyinfra's @fake connector): what runs, and what
does not run on a converged host. The same steps run for real in test_e2e_testbed.py."""

from __future__ import annotations

import json
import re

import pytest
from fakehost import run_fake

from tritonfleet.steps.host_prep import container_toolkit, nvidia_driver

FPR = "EB693B3035CD5710E231E123A4B469963BF863CC"
BASE = {"uname -m": "x86_64", "uname -r": "6.1.0-28-amd64"}
DATA = {"cuda_distro": "debian12"}


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
    assert re.search(r"install .*cuda-drivers-535", run)
    assert "update-initramfs -u" in run
    assert "apt-mark hold" in run
    assert "systemctl start nvidia-persistenced.service" in run


def test_driver_pinned_version_and_branch_from_data():
    _, cmds, _ = run_fake(nvidia_driver, BASE, {**DATA, "nvidia_driver_branch": "560",
                                                 "nvidia_driver_version": "560.35.03-1"})
    assert any("cuda-drivers-560=560.35.03-1" in c for c in cmds)


def test_driver_converged_host_changes_nothing():
    responses = {
        **BASE,
        "cuda-archive-keyring.gpg": FPR,
        "dpkg-query -W": dpkg("hi cuda-drivers-535 535.183.01-1", "hi nvidia-utils-535 535.183.01-1",
                              "ii linux-headers-6.1.0-28-amd64 6.1.76-1", "ii dkms 3.0.10-8"),
        "nvidia-persistenced.service": ["SubState=running", "UnitFileState=enabled"],
    }
    # (managed files: tests/test_fast_ops.py; the real re-run is in test_e2e_testbed)
    _, cmds, state = run_fake(nvidia_driver, responses, DATA)
    assert not state.failed_hosts
    run = "\n".join(ops(cmds))
    assert "curl" not in run, "a pinned key already installed must not be fetched again"
    assert "install cuda-drivers" not in run and "linux-headers" not in run
    assert "apt-mark hold" not in run and "systemctl start" not in run
    # holds and installed packages come from dpkg itself, never from apt's cache or `dpkg -l`
    # (read once per run while nothing changes: tests/test_fast_ops.py)
    assert not any(c.startswith(("dpkg -l", "apt-mark showhold")) or "( dpkg -l )" in c for c in cmds)


def test_driver_holds_packages_that_lost_their_hold():
    responses = {
        **BASE,
        "cuda-archive-keyring.gpg": FPR,
        "dpkg-query -W": dpkg("ii cuda-drivers-535 535.183.01-1", "hi nvidia-utils-535 535.183.01-1",
                              "ii linux-headers-6.1.0-28-amd64 6.1.76-1", "ii dkms 3.0.10-8"),
    }
    _, cmds, _ = run_fake(nvidia_driver, responses, DATA)
    assert "apt-mark hold" in "\n".join(ops(cmds))


def test_toolkit_configures_runtime_only_when_missing():
    _, cmds, _ = run_fake(container_toolkit, {**BASE, "cat /etc/docker/daemon.json": json.dumps({"log-driver": "json-file"})}, DATA)
    run = "\n".join(cmds)
    assert "nvidia-ctk runtime configure --runtime=docker" in run
    assert re.search(r"install .*nvidia-container-toolkit=1\.16\.2-1.*libnvidia-container1=1\.16\.2-1", run)
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
    assert not state.failed_hosts and any("cuda-drivers-535" in c for c in cmds)


def test_docker_from_dockers_repository_with_pinned_key():
    from tritonfleet.steps.host_prep import docker_engine

    os_release = ["/etc/os-release", "ID=ubuntu", 'NAME="Ubuntu"', 'VERSION_ID="22.04"',
                  "VERSION_CODENAME=jammy", "---"]
    _, cmds, state = run_fake(docker_engine, {**BASE, "ls -pdL *-release": os_release},
                              {**DATA, "docker_version": "5:27.3.1-1~ubuntu.22.04~jammy"})
    assert not state.failed_hosts
    run = "\n".join(cmds)
    assert "9DC858229FC7DD38854AE2D88D81803C0EBFCD88" in run and "/etc/apt/keyrings/docker.gpg" in run
    assert "https://download.docker.com/linux/ubuntu/gpg" in run
    assert "/etc/apt/sources.list.d/docker.list" in run
    assert re.search(r"install 'docker-ce=5:27\.3\.1-1~ubuntu\.22\.04~jammy' 'docker-ce-cli=5:27", run)


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
