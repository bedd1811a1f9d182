"""Bare Debian 13 (trixie) test hosts taken to serving by the real deploys/triton.py, with Debian
13's own driver packages from the mirror (nvidia-driver 550): one with Debian's docker.io, one with
Docker's repository (the stand-in's trixie suite).

Nothing in the deploy knows it is on Debian 13: what differs from Debian 12 is data
(tritonfleet/data/distro_archives/debian13-archive.toml: the branch, the packages, docker-cli next to
docker.io, trixie's nvidia-modprobe as a helper) and host facts (os-release, the host's deb822
sources with trixie's suites). The test-only data is Debian 12's (docs/driver-sources.md, Tests):
no Recommends and no kernel headers (this machine's kernel has none in Debian's archive), no
nvidia-persistenced (no GPU), the GPU's answers from the stand-in for Debian's installed release
(``nvidia_smi_command``); and Triton 24.05 (the stand-in image under that tag): Debian 13's R550 cannot
run the default 24.08, which pre-flight says first, naming the host, with nothing changed."""

from __future__ import annotations

import base64
import json
import os
import re
import time

import pytest

from tests.support.fakehost import defaults
from tests.support.testbed import (
    changed_ops,
    host_state,
    infer_resnet,
    lines_of,
    mark,
    pyinfra,
    pyinfra_raw,
    ssh,
    status_of,
    success_count,
)
from tritonfleet.host import nvidia_repos as vendorfacts
from tritonfleet_testbed.standin_repo import ANSWER_PATH, smi_answer

REFUSED = "tritonfleet pre-flight failed, no host was changed"
ARCHIVE = "debian13-archive"
BRANCH = vendorfacts.branches(ARCHIVE)[-1]
RELEASE = vendorfacts.release(ARCHIVE, BRANCH)
# the newest Triton release whose driver needs R550 meets (tritonfleet/gpu/rules.py), and a CUDA base
# image R550's CUDA 12.4 runs (the default test image is CUDA 12.8's)
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.05-py3"
CUDA_IMAGE = "nvidia/cuda:12.4.1-base-ubuntu22.04"
# test-only data, as for Debian 12's own driver (tests/testbed/test_driver_source.py)
DEBIAN = ["--data", "nvidia_driver_source=debian", "--data", 'nvidia_kernel_packages=["dkms"]',
          "--data", "nvidia_persistenced=False", "--data", f"nvidia_smi_command={ANSWER_PATH}"]

timings: dict[str, float] = {}


@pytest.fixture(scope="module")
def trixie_hosts():
    """Two bare Debian 13 hosts (tb21, tb22) with the stand-in repositories and images; destroyed
    afterwards (and the testbed taken down when they were its last hosts)."""
    from tritonfleet_testbed import hosts
    from tritonfleet_testbed.cli import bring_up

    t0 = time.monotonic()
    state = bring_up(2, suite="trixie")
    timings["testbed up (2 trixie hosts)"] = time.monotonic() - t0
    bare = [h for h in state.hosts if h.suite == "trixie"]
    for h in bare:
        assert "VERSION_CODENAME=trixie" in ssh(h, "cat /etc/os-release")
        # apt without Recommends (as minimal images have it): DKMS's Recommends would bring Debian's
        # linux-headers-amd64, and DKMS would then compile the module for a kernel the host never boots
        ssh(h, "echo 'APT::Install-Recommends \"false\";' > /etc/apt/apt.conf.d/99-no-recommends")
        # the stand-in's answer for Debian 13's driver release (the GPU the host "has")
        script = base64.b64encode(smi_answer(RELEASE).encode()).decode()
        ssh(h, f"mkdir -p {os.path.dirname(ANSWER_PATH)} && echo {script} | base64 -d > {ANSWER_PATH} "
               f"&& chmod 755 {ANSWER_PATH}")
    yield bare
    for h in bare:
        hosts.destroy_host(h.name)
    if not hosts.State.load().hosts:
        hosts.down()
    print("\ndebian 13 timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


def images() -> list[str]:
    """Test data: the stand-in Triton 24.05 and CUDA 12.4 images, as archives."""
    from tritonfleet_testbed.standin_images import build_cuda_image, build_triton_image

    archives = {TRITON_IMAGE: str(build_triton_image(TRITON_IMAGE)), CUDA_IMAGE: str(build_cuda_image(CUDA_IMAGE))}
    return ["--data", f"triton_image={TRITON_IMAGE}", "--data", f"cuda_test_image={CUDA_IMAGE}",
            "--data", f"image_archives={json.dumps(archives)}"]


def installed(h) -> dict[str, str]:
    return dict(line.split()[1:3] for line in ssh(
        h, "dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\\n' | awk '$1 ~ /^[ih]i/'").splitlines())


def serves(h, err: str) -> None:
    """Debian 13's own driver (pinned, held), the GPU check, an inference, status."""
    pkgs = installed(h)
    assert pkgs["nvidia-driver"].startswith(f"{RELEASE}-") and pkgs["libcuda1"] == pkgs["nvidia-driver"], pkgs
    assert "cuda-drivers" not in " ".join(pkgs) and not any(p.startswith("nvidia-driver-pinning") for p in pkgs)
    held = set(ssh(h, "apt-mark showhold").split())
    assert {"nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1"} <= held, held
    assert "nvidia-modprobe" not in held  # trixie's is its own source's (570): a helper
    assert re.search(rf"Candidate: {re.escape(RELEASE)}-", ssh(h, "apt-cache policy nvidia-driver"))
    assert "nvidia" in ssh(h, "docker info --format '{{json .Runtimes}}'")
    for where in ("host", "container"):
        assert re.search(rf"GPU check\s+{re.escape(h.name)}\s+{where}\s+1x .*driver {re.escape(RELEASE)} .*CUDA 12\.4",
                         err), (where, err[-4000:])
    assert infer_resnet(h.address).shape == (1, 1000)
    assert success_count(h.address, "resnet50_onnx") >= 1
    _, row = status_of(h.name)
    assert row["driver_source"] == "debian", row


def test_bare_debian13_host_reaches_serving_with_debians_own_driver_and_docker_io(trixie_hosts):
    h = trixie_hosts[0]

    # 1. with the default Triton image (24.08) pre-flight refuses Debian 13's own driver, naming the
    # host, the branch and what 24.08 needs; the host is unchanged
    before = mark(h)
    res = pyinfra_raw("-y", "--limit", h.name, *DEBIAN, "inventories/testbed.py", "deploys/triton.py")
    out = " ".join((res.stdout + res.stderr).decode(errors="replace").split())
    assert res.returncode != 0 and REFUSED in out, out[-3000:]
    assert (f"{h.name}: driver {BRANCH} (Debian 13's own archive) with GPU class T4: driver branch R{BRANCH} is not "
            "supported: Triton 24.08") in out, out[-3000:]
    # the ways on: an older image, and not NVIDIA's CUDA repository (refused on Debian 13 too)
    assert f"Use a triton_image that R{BRANCH} runs on T4: Triton 24.05" in out, out[-3000:]
    assert 'nvidia_driver_source = "cuda" is refused on debian13 too' in out, out[-3000:]
    assert "Starting operation" not in out
    assert host_state(h) == before

    # 2. bare to serving: the whole deploy, Debian 13's own driver from the mirror, docker.io
    t0 = time.monotonic()
    res, data = pyinfra("deploys/triton.py", "--limit", h.name, *DEBIAN, *images())
    timings["bare to serving, docker.io"] = time.monotonic() - t0
    err = lines_of(res.stderr)
    assert res.returncode == 0, err[-6000:]
    assert data.get("results", {}).get("failed_hosts") == [], err[-4000:]
    serves(h, err)
    # the components added to the host's own trixie sources
    nonfree = ssh(h, "cat /etc/apt/sources.list.d/tritonfleet-debian-nonfree.sources")
    assert "Suites: trixie trixie-updates" in nonfree and "Components: contrib non-free non-free-firmware" in nonfree
    # Debian 13's docker.io with its client, which trixie ships apart (docker-cli)
    pkgs = installed(h)
    assert pkgs["docker.io"].startswith("26.") and pkgs["docker-cli"] == pkgs["docker.io"], pkgs

    # 3. a re-run changes nothing
    t0 = time.monotonic()
    res, data = pyinfra("deploys/triton.py", "--limit", h.name, *DEBIAN, *images())
    timings["re-run, converged"] = time.monotonic() - t0
    assert res.returncode == 0 and changed_ops(data) == [], (changed_ops(data), res.stderr[-3000:])


def test_bare_debian13_host_reaches_serving_with_dockers_repository(trixie_hosts):
    """docker_source = "docker": Docker's repository for trixie (`<url>/docker/debian trixie stable`,
    the stand-in's trixie suite), its pinned docker-ce, no docker.io."""
    h = trixie_hosts[1]
    # the default source, NVIDIA's CUDA repository, is refused on Debian 13 (no facts of NVIDIA's
    # debian13 repository: docs/driver-sources.md), naming the host and the way on; nothing changed
    before = mark(h)
    res = pyinfra_raw("-y", "--limit", h.name, "inventories/testbed.py", "deploys/triton.py")
    out = " ".join((res.stdout + res.stderr).decode(errors="replace").split())
    assert res.returncode != 0 and REFUSED in out, out[-3000:]
    assert (f"{h.name}: tritonfleet has no facts of NVIDIA's CUDA repository for debian13" in out
            and f'set nvidia_driver_source = "debian" for this host (its distro\'s own driver, {RELEASE})' in out), out[-3000:]
    assert host_state(h) == before

    t0 = time.monotonic()
    res, data = pyinfra("deploys/triton.py", "--limit", h.name, *DEBIAN, *images(), "--data", "docker_source=docker")
    timings["bare to serving, Docker's repository"] = time.monotonic() - t0
    err = lines_of(res.stderr)
    assert res.returncode == 0, err[-6000:]
    assert data.get("results", {}).get("failed_hosts") == [], err[-4000:]
    serves(h, err)
    assert " trixie stable" in ssh(h, "cat /etc/apt/sources.list.d/docker.list")
    pkgs = installed(h)
    assert pkgs["docker-ce"] == f"5:{defaults()['docker_version']}-1~debian.13~trixie", pkgs
    assert "docker.io" not in pkgs and "docker-cli" not in pkgs, pkgs
