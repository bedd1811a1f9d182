"""The stand-in vendor repositories: signed, installable, and their programs behave like the
real ones (parsed with the same parsers the deploy uses)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tritonfleet.core import procs
from tritonfleet.gpu import facts as gpu
from tritonfleet.gpu.rules import check_gpus
from tritonfleet.host import nvidia_repos as vendorfacts
from tritonfleet_testbed.standin_repo import (
    DOCKER_CE_VERSIONS,
    TOOLKIT_VERSION,
    _deb,
    _standin_branches,
    build_vendor_repo,
    gpu_profile,
    parse_smi_list,
)

FIX = Path(__file__).parents[2] / "fixtures" / "nvidia"
KERNEL = "6.1.0-99-testbed"
# branch -> (driver, CUDA, the package holding nvidia-smi): Debian 12's branches, and R535 from
# the Ubuntu 22.04 stand-in (Debian 12's repository has none)
DRIVER_BRANCHES = {b: (v, c) for b, (v, c) in _standin_branches("debian12").items()}
SMI_PACKAGE = {b: f"nvidia-smi_{v}-1_amd64" for b, (v, _) in DRIVER_BRANCHES.items()}
DRIVER_BRANCHES["535"] = _standin_branches("ubuntu2204")["535"]
SMI_PACKAGE["535"] = f"nvidia-utils-535_{DRIVER_BRANCHES['535'][0]}-0ubuntu1_amd64"


@pytest.fixture(scope="module")
def docker_io(tmp_path_factory):
    """A small package shaped like Debian's docker.io (the testbed repacks the real one)."""
    out = tmp_path_factory.mktemp("docker-io")
    unit = "[Service]\nExecStart=/usr/sbin/dockerd -H fd://\n"
    _deb(out, "docker.io", "20.10.24+dfsg1-1+deb12u1",
         depends="libc6 (>= 2.34), adduser, containerd (>= 1.4~), iptables, lsb-base, runc (>= 1.0.0~rc8~), tini",
         description="Linux container runtime\nTest double.",
         files=[("/usr/sbin/dockerd", "#!/bin/sh\necho dockerd\n", 0o755),
                ("/usr/sbin/docker-proxy", "#!/bin/sh\n", 0o755),
                ("/usr/bin/docker", "#!/bin/sh\necho docker-cli \"$@\"\n", 0o755),
                ("/lib/systemd/system/docker.service", unit, 0o644),
                ("/lib/systemd/system/docker.socket", "[Socket]\nListenStream=/run/docker.sock\n", 0o644)],
         symlinks=[("/usr/bin/docker-init", "tini-static")])
    return next(out.glob("docker.io_*.deb"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory, docker_io):
    return build_vendor_repo(tmp_path_factory.mktemp("vendor") / "repo", KERNEL, docker_io_deb=docker_io)


@pytest.fixture(scope="module")
def extracted(repo, tmp_path_factory):
    """Every package unpacked into its own directory: {filename stem: dir}."""
    out = {}
    base = tmp_path_factory.mktemp("x")
    for d in [*repo.cuda_dirs.values(), repo.toolkit_dir, repo.docker_dir / "dists/bookworm/pool/stable/amd64"]:
        for deb in d.glob("*.deb"):
            target = base / deb.stem
            subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
            out[deb.stem] = target
    return out


def control(deb: Path) -> dict:
    text = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    fields, key = {}, None
    for line in text.splitlines():
        if line.startswith(" ") and key:
            fields[key] += "\n" + line
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def dearmored(repo, tmp_path) -> Path:
    k = tmp_path / "key.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(k), str(repo.toolkit_key)], check=True)
    return k


# ---------------------------------------------------------------- layout, keys, signatures

def test_layout_and_keys(repo):
    cuda = repo.root / "cuda/debian12/x86_64"
    assert repo.cuda_dirs == {d: repo.root / f"cuda/{d}/x86_64" for d in ("debian12", "ubuntu2204", "ubuntu2404", "ubuntu2604")}
    assert repo.toolkit_dir == repo.root / "libnvidia-container/stable/deb/amd64"
    assert repo.cuda_key == cuda / repo.cuda_key_name
    assert repo.cuda_key_name == repo.fingerprint[-8:].lower() + ".pub"
    assert repo.toolkit_key == repo.root / "libnvidia-container/gpgkey"
    assert repo.docker_key == repo.root / "docker/debian/gpg" and repo.docker_dir == repo.root / "docker/debian"
    for key in (repo.cuda_key, repo.toolkit_key, repo.docker_key):
        assert key.read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
        shown = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons", str(key)],
                               capture_output=True, text=True, check=True).stdout
        assert [ln.split(":")[9] for ln in shown.splitlines() if ln.startswith("fpr:")][0] == repo.fingerprint
    assert len(repo.fingerprint) == 40


def subkeys(key: Path) -> list[str]:
    shown = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons", str(key)],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return [b.split(":")[9] for a, b in zip(shown, shown[1:], strict=False) if a.startswith("sub:") and b.startswith("fpr:")]


@pytest.mark.parametrize("which", ["cuda", "toolkit", "docker"])
def test_signatures_verify_with_gpgv(repo, tmp_path, which):
    d = {"cuda": repo.cuda_dirs["debian12"], "toolkit": repo.toolkit_dir,
         "docker": repo.docker_dir / "dists/bookworm"}[which]
    k = dearmored(repo, tmp_path)
    signer = subkeys(repo.toolkit_key)  # like Docker's key: the primary certifies, a subkey signs
    assert len(signer) == 1
    for args in (["InRelease"], ["Release.gpg", "Release"]):
        p = subprocess.run(["gpgv", "--keyring", str(k), *[str(d / a) for a in args]],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert signer[0] in p.stderr and "Good signature" in p.stderr
    # a changed Release no longer verifies
    bad = tmp_path / "Release"
    origin = "Docker" if which == "docker" else "NVIDIA"
    bad.write_text((d / "Release").read_text().replace(f"Origin: {origin}", "Origin: someone"))
    p = subprocess.run(["gpgv", "--keyring", str(k), str(d / "Release.gpg"), str(bad)], capture_output=True)
    assert p.returncode != 0
    release = (d / "Release").read_text()
    assert "Packages.gz" in release and "SHA256:" in release


def test_rebuild_reuses_repo_and_key(repo, docker_io, tmp_path):
    inrelease = repo.cuda_dirs["debian12"] / "InRelease"
    before = inrelease.stat().st_mtime_ns
    again = build_vendor_repo(repo.root, KERNEL, docker_io_deb=docker_io)
    assert again.fingerprint == repo.fingerprint
    assert inrelease.stat().st_mtime_ns == before
    # new inputs: rebuilt in place, same key (in a copy: the module's repository stays as built)
    copy = tmp_path / "repo"
    shutil.copytree(repo.root, copy, ignore=shutil.ignore_patterns("S.*"))  # not gpg's sockets
    other = build_vendor_repo(copy, "6.1.0-98-testbed", distros=("debian12",), docker_io_deb=docker_io)
    assert other.fingerprint == repo.fingerprint
    assert (other.cuda_dirs["debian12"] / "linux-headers-6.1.0-98-testbed_6.1.0-98-testbed_amd64.deb").is_file()
    assert not (other.cuda_dirs["debian12"] / f"linux-headers-{KERNEL}_{KERNEL}_amd64.deb").exists()
    assert not (copy / "cuda/ubuntu2204").exists()  # what the old build had and the new one has not
    assert inrelease.stat().st_mtime_ns == before


# ---------------------------------------------------------------- package metadata

@pytest.mark.parametrize("distro", ["debian12", "ubuntu2204", "ubuntu2404", "ubuntu2604"])
def test_cuda_packages_follow_the_facts(repo, distro):
    """Generated from tritonfleet/data/nvidia_repos/<distro>.toml: the real package set and names,
    the distro's version shapes, lower bounds only, the pinning package where there is one."""
    d = repo.cuda_dirs[distro]
    for branch, (version, _) in _standin_branches(distro).items():
        names = vendorfacts.driver_packages(distro, branch)
        # the revision of the facts' example: -1 (Debian), -0ubuntu1 (22.04/24.04), -1ubuntu1 (26.04)
        v = f"{version}-{vendorfacts.version_shape(distro)['example'].split('-', 1)[1]}"
        for name in names[1:]:
            c = control(d / f"{name}_{v}_amd64.deb")
            assert vendorfacts.version_matches(distro, c["Version"], "driver")
        meta = control(d / f"{names[0]}_{version}-1_amd64.deb")
        assert vendorfacts.version_matches(distro, meta["Version"], "metapackage")
        driver = names[1]  # nvidia-driver (Debian; Ubuntu from 590), nvidia-driver-<branch> before
        # a lower bound only, as NVIDIA's (Ubuntu's takes the driver of either flavour)
        want = f"{driver} (>= {version})" + ("" if distro == "debian12" else f" | {driver}-open (>= {version})")
        assert meta["Depends"] == want
        assert "<<" not in control(d / f"{driver}_{v}_amd64.deb")["Depends"]
        # the open flavour: its metapackage pulls its own module package, and each package only one
        # flavour has conflicts with its twin of the other (apt cannot keep both)
        opn = vendorfacts.flavour_packages(distro, branch, "open")
        prop = vendorfacts.flavour_packages(distro, branch, "proprietary")
        assert opn[0] == vendorfacts.metapackage(distro, branch, "open")
        open_meta = control(d / f"{opn[0]}_{version}-1_amd64.deb")["Depends"]
        assert f"{opn[1]} (>= {version})" in open_meta
        for o, p_ in zip(opn[1:], prop[1:], strict=True):
            assert control(d / f"{o}_{v}_amd64.deb")["Conflicts"] == p_
            assert control(d / f"{p_}_{v}_amd64.deb")["Conflicts"] == o
        pin = vendorfacts.pinning_package(distro, branch)
        assert bool(pin) == (int(branch) >= 580)
        if pin:
            deb = next(d.glob(f"{pin}_*_all.deb"))
            assert control(deb)["Version"].startswith(f"{branch}-")  # 580-1 / 580-2ubuntu1: no release
    headers = control(d / f"linux-headers-{KERNEL}_{KERNEL}_amd64.deb")
    assert headers["Package"] == f"linux-headers-{KERNEL}"
    assert control(d / "libnvidia-egl-wayland1_1.1.13-1_amd64.deb")["Version"] == "1:1.1.13-1"


def test_toolkit_packages_control_fields(repo):
    v = f"{TOOLKIT_VERSION}-1"
    d = repo.toolkit_dir
    names = sorted(control(p)["Package"] for p in d.glob("*.deb"))
    assert names == ["libnvidia-container-tools", "libnvidia-container1", "nvidia-container-toolkit",
                     "nvidia-container-toolkit-base"]
    for p in d.glob("*.deb"):
        assert control(p)["Version"] == v
    tk = control(d / f"nvidia-container-toolkit_{v}_amd64.deb")["Depends"]
    assert f"nvidia-container-toolkit-base (= {v})" in tk and f"libnvidia-container-tools (>= {v})" in tk
    assert "python3" in tk
    assert control(d / f"libnvidia-container-tools_{v}_amd64.deb")["Depends"] == f"libnvidia-container1 (= {v})"
    assert "python3" in control(d / f"nvidia-container-toolkit-base_{v}_amd64.deb")["Depends"]
    packages = (d / "Packages").read_text()
    assert "Filename: ./nvidia-container-toolkit_1.17.8-1_amd64.deb" in packages


def test_package_contents(extracted):
    smi = extracted[SMI_PACKAGE["535"]] / "usr/bin/nvidia-smi"
    assert os.access(smi, os.X_OK) and smi.read_text().startswith("#!/bin/sh")
    p = extracted["nvidia-persistenced_570.133.07-1_amd64"]
    unit = (p / "lib/systemd/system/nvidia-persistenced.service").read_text()
    assert "Type=forking" in unit and "ExecStart=/usr/bin/nvidia-persistenced" in unit
    assert "WantedBy=multi-user.target" in unit
    assert os.access(p / "usr/bin/nvidia-persistenced", os.X_OK)
    base = extracted["nvidia-container-toolkit-base_1.17.8-1_amd64"]
    assert os.access(base / "usr/bin/nvidia-ctk", os.X_OK) and os.access(base / "usr/bin/nvidia-container-runtime", os.X_OK)
    assert os.access(extracted["nvidia-container-toolkit_1.17.8-1_amd64"] / "usr/bin/nvidia-container-runtime-hook", os.X_OK)
    headers = extracted[f"linux-headers-{KERNEL}_{KERNEL}_amd64"]
    assert os.readlink(headers / f"lib/modules/{KERNEL}/build") == f"/usr/src/linux-headers-{KERNEL}"


@pytest.mark.parametrize("suite,suffix", [("bookworm", "-1~debian.12~bookworm"), ("trixie", "-1~debian.13~trixie")])
def test_docker_repository_like_dockers(repo, docker_io, suite, suffix):
    """Docker's layout (dists/<codename>/stable, pool below dists), names and version scheme, for
    Debian 12 and 13."""
    dist = repo.docker_dir / f"dists/{suite}"
    release = (dist / "Release").read_text()
    for field in ("Origin: Docker", "Label: Docker CE", f"Suite: {suite}", f"Codename: {suite}",
                  "Components: stable", "Architectures: amd64"):
        assert field in release
    assert "stable/binary-amd64/Packages" in release and ".deb" not in release
    packages = (dist / "stable/binary-amd64/Packages").read_text()
    stanzas = [dict(line.split(": ", 1) for line in st.splitlines() if ": " in line and not line.startswith(" "))
               for st in packages.strip().split("\n\n")]
    versions = sorted((st["Package"], st["Version"]) for st in stanzas)
    assert versions == sorted([
        ("containerd.io", "1.7.22-1"),
        ("docker-buildx-plugin", f"0.17.1{suffix}"),
        ("docker-compose-plugin", f"2.29.7{suffix}"),
        *[(p, f"5:{v}{suffix}") for v in DOCKER_CE_VERSIONS for p in ("docker-ce", "docker-ce-cli")],
    ])
    for st in stanzas:
        assert st["Filename"].startswith(f"dists/{suite}/pool/stable/amd64/") and "5:" not in st["Filename"]
    ce = next(st for st in stanzas if st["Package"] == "docker-ce")
    assert "containerd.io (>= 1.6.24)" in ce["Depends"] and "docker-ce-cli" in ce["Depends"]
    assert "tini" in ce["Depends"] and "containerd (" not in ce["Depends"] and "docker.io" in ce["Conflicts"]
    assert next(st for st in stanzas if st["Package"] == "containerd.io")["Depends"].startswith("containerd (")


def test_docker_packages_carry_the_engine_and_answer_versions(extracted):
    v = f"{DOCKER_CE_VERSIONS[0]}-1~debian.12~bookworm"
    ce, cli = extracted[f"docker-ce_{v}_amd64"], extracted[f"docker-ce-cli_{v}_amd64"]
    assert (ce / "usr/sbin/dockerd").read_text() == "#!/bin/sh\necho dockerd\n"
    assert os.access(ce / "usr/sbin/dockerd", os.X_OK)
    assert (ce / "lib/systemd/system/docker.service").is_file() and os.readlink(ce / "usr/bin/docker-init") == "tini-static"
    assert os.access(cli / "usr/bin/docker", os.X_OK) and not (ce / "usr/bin/docker").exists()
    for package, command, line in (("docker-compose-plugin_2.29.7", "compose", "Docker Compose version v2.29.7"),
                                   ("docker-buildx-plugin_0.17.1", "buildx", "github.com/docker/buildx v0.17.1 257815a")):
        version = "v" + package.split("_")[1]
        plugin = extracted[f"{package}-1~debian.12~bookworm_amd64"] / f"usr/libexec/docker/cli-plugins/docker-{command}"
        meta = json.loads(subprocess.run([str(plugin), "docker-cli-plugin-metadata"], capture_output=True,
                                         text=True, check=True).stdout)
        assert meta["SchemaVersion"] == "0.1.0" and meta["Version"] == version
        out = subprocess.run([str(plugin), command, "version"], capture_output=True, text=True, check=True).stdout
        assert out.strip() == line
        assert subprocess.run([str(plugin), command, "up"], capture_output=True).returncode != 0


# ---------------------------------------------------------------- apt resolves them

def apt(tmp_path: Path, repo, *args: str, prefs: str | None = None) -> subprocess.CompletedProcess:
    k = dearmored(repo, tmp_path)
    state = tmp_path / "apt"
    (state / "lists/partial").mkdir(parents=True, exist_ok=True)
    (state / "cache/archives/partial").mkdir(parents=True, exist_ok=True)
    (state / "prefs").mkdir(exist_ok=True)
    if prefs:
        (state / "prefs/pin").write_text(prefs)
    (state / "sources.list").write_text(
        f"deb [signed-by={k}] file:{repo.cuda_dirs['debian12']}/ /\n"
        f"deb [signed-by={k}] file:{repo.toolkit_dir}/ /\n")
    opts = ["-o", f"Dir::Etc::SourceList={state / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
            "-o", f"Dir::State::Lists={state / 'lists'}", "-o", f"Dir::Cache={state / 'cache'}",
            "-o", f"Dir::Etc::PreferencesParts={state / 'prefs'}", "-o", "Dir::Etc::Preferences=/dev/null",
            "-o", "Debug::NoLocking=1"]
    up = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True)
    assert up.returncode == 0 and "NO_PUBKEY" not in up.stderr and "not signed" not in up.stderr, up.stderr
    return subprocess.run(["apt-get", *opts, "-s", *args], capture_output=True, text=True)


def installs(p: subprocess.CompletedProcess) -> dict:
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("Inst "):
            parts = line.split()
            out[parts[1]] = parts[2].strip("(")
    return out


def test_apt_installs_toolkit_pinned_and_headers(repo, tmp_path):
    v = f"{TOOLKIT_VERSION}-1"
    p = apt(tmp_path, repo, "install", f"nvidia-container-toolkit={v}", f"nvidia-container-toolkit-base={v}",
            f"libnvidia-container-tools={v}", f"libnvidia-container1={v}", f"linux-headers-{KERNEL}")
    assert p.returncode == 0, p.stdout + p.stderr
    got = installs(p)
    assert got["nvidia-container-toolkit"] == v and got["libnvidia-container1"] == v
    assert got[f"linux-headers-{KERNEL}"] == KERNEL


def test_apt_unpinned_older_branch_silently_installs_the_newest(repo, tmp_path):
    # lower bounds only, one set of names for every branch (NVIDIA's debian12 repository): asking
    # for R570 without a pin installs R580's driver, without an error
    p = apt(tmp_path, repo, "install", "cuda-drivers-570")
    assert p.returncode == 0, p.stdout + p.stderr
    got = installs(p)
    assert got["cuda-drivers-570"] == "570.133.07-1" and got["nvidia-driver"] == "580.159.04-1"
    assert got["firmware-nvidia-gsp"] == got["libnvoptix1"] == "580.159.04-1"
    assert got["libnvidia-egl-wayland1"] == "1:1.1.13-1"


def test_apt_pin_over_the_whole_set_installs_the_branch(repo, tmp_path):
    names = " ".join(vendorfacts.all_driver_packages("debian12"))
    p = apt(tmp_path, repo, "install", "cuda-drivers-570",
            prefs=f"Package: {names}\nPin: version 570.*\nPin-Priority: 1001\n")
    assert p.returncode == 0, p.stdout + p.stderr
    got = installs(p)
    assert {got[n] for n in vendorfacts.driver_packages("debian12", "570")[1:]} == {"570.133.07-1"}
    # a pin that misses packages of the set: their candidates stay at the newest branch, which
    # the pinned nvidia-driver (its set at its own version) cannot take
    (tmp_path / "partial").mkdir()
    p = apt(tmp_path / "partial", repo, "install", "cuda-drivers-570",
            prefs="Package: nvidia-driver nvidia-smi\nPin: version 570.*\nPin-Priority: 1001\n")
    assert p.returncode != 0 and "libcuda1 (= 570.133.07-1) but 580.159.04-1 is to be installed" in p.stdout + p.stderr


def test_apt_pinning_package_carries_preferences_for_the_set(repo, tmp_path):
    deb = next(repo.cuda_dirs["debian12"].glob("nvidia-driver-pinning-580_*_all.deb"))
    out = tmp_path / "x"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(out)], check=True)
    prefs = (out / "etc/apt/preferences.d/nvidia-driver-pinning-580").read_text()
    assert "Pin: version 580.*" in prefs
    assert set(vendorfacts.all_driver_packages("debian12")) <= set(prefs.splitlines()[1].split()[1:])
    p = apt(tmp_path, repo, "install", "cuda-drivers-580", prefs=prefs)
    assert p.returncode == 0 and installs(p)["nvidia-driver"] == "580.159.04-1"


# ---------------------------------------------------------------- stand-in nvidia-smi

def host_root(tmp_path: Path, gpu_class: str) -> Path:
    root = tmp_path / f"root-{gpu_class}"
    (root / "etc/nvidia-standin").mkdir(parents=True)
    env = gpu_profile(gpu_class)
    if env:
        (root / "etc/nvidia-standin/gpu.env").write_text(env)
    return root


SHELLS = [s for s in ("dash", "busybox") if shutil.which(s)]


def smi(extracted, branch: str, root: Path, *args: str, shell: str = "dash", **env) -> subprocess.CompletedProcess:
    script = extracted[SMI_PACKAGE[branch]] / "usr/bin/nvidia-smi"
    cmd = ["busybox", "sh", str(script)] if shell == "busybox" else [shell, str(script)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(root), **env})


def test_shells_available():
    assert SHELLS == ["dash", "busybox"], "the stand-in must be checked with dash and busybox sh"


@pytest.mark.parametrize("shell", ["dash", "busybox"])
@pytest.mark.parametrize("branch", sorted(DRIVER_BRANCHES))
@pytest.mark.parametrize("gpu_class,name,cc,mem", [("T4", "Tesla T4", "7.5", 15360), ("L4", "NVIDIA L4", "8.9", 23034)])
def test_nvidia_smi_parsed_by_the_deploys_parsers(extracted, tmp_path, shell, branch, gpu_class, name, cc, mem):
    root = host_root(tmp_path, gpu_class)
    version, cuda = DRIVER_BRANCHES[branch]
    p = smi(extracted, branch, root, *gpu.QUERY_COMMAND.split()[1:], shell=shell)
    assert p.returncode == 0, p.stdout + p.stderr
    q = gpu.parse_query(p.stdout.splitlines())
    assert q.ok, q
    g = q.gpus[0]
    assert (g.index, g.name, g.compute_cap, g.memory_total_mib, g.driver_version) == (0, name, cc, mem, version)
    table = smi(extracted, branch, root, shell=shell)
    assert table.returncode == 0
    s = gpu.parse_summary(table.stdout.splitlines())
    assert (s["status"], s["driver_version"], s["cuda_version"]) == ("ok", version, cuda)
    assert [(x["name"], x["memory_total_mib"]) for x in s["gpus"]] == [(name, mem)]
    assert check_gpus("h", gpu_class, q.gpus, s["cuda_version"]) == []
    listed = parse_smi_list(smi(extracted, branch, root, "-L", shell=shell).stdout.splitlines())
    assert listed == [{"index": 0, "name": name, "uuid": g.uuid}]


def without_time(text: str) -> list[str]:
    return text.splitlines()[1:] if text.splitlines()[0][:3].isalpha() else text.splitlines()


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_nvidia_smi_table_matches_real_capture(extracted, tmp_path, shell, monkeypatch):
    """With the capture's GPU values the stand-in renders the real tables byte for byte."""
    import tritonfleet_testbed.standin_repo as vr

    # 535 table: docker/docs L4 capture (535.288.01; the stand-in's 535 is 535.104.12)
    root = host_root(tmp_path, "L4")
    out = smi(extracted, "535", root, shell=shell).stdout.replace("535.104.12", "535.288.01")
    assert without_time(out) == (FIX / "smi_l4_535.288.01.txt").read_text().splitlines()
    # wide table (550 and later): the T4 550.54.15 capture
    t4 = dict(vr.GPU_PROFILES["T4"], PCI_BUS_ID="00000000:00:04.0", TEMPERATURE_C="65", PERF_STATE="P8",
              POWER_DRAW_W="12")
    monkeypatch.setitem(vr.GPU_PROFILES, "T4", t4)
    root = host_root(tmp_path / "t4", "T4")
    out = smi(extracted, "560", root, shell=shell).stdout.replace("560.28.03", "550.54.15").replace(
        "CUDA Version: 12.6", "CUDA Version: 12.4")
    expected = (FIX / "smi_t4_550.54.15.txt").read_text().splitlines()
    assert without_time(out) == expected[1:]
    assert out.splitlines()[0].endswith("       ")


def test_nvidia_smi_without_gpu(extracted, tmp_path):
    root = host_root(tmp_path, "none")
    for args in ((), tuple(gpu.QUERY_COMMAND.split()[1:])):
        p = smi(extracted, "535", root, *args)
        assert p.returncode == 9
        assert p.stdout.splitlines()[0] == (FIX / "smi_no_communication.txt").read_text().strip()
        assert gpu.parse_query(p.stdout.splitlines()).status == "no_communication"
        assert gpu.parse_summary(p.stdout.splitlines())["status"] == "no_communication"


def test_nvidia_smi_query_fields_and_errors(extracted, tmp_path):
    root = host_root(tmp_path, "L4")
    p = smi(extracted, "535", root, "--query-gpu=name,memory.total,memory.used,utilization.gpu,persistence_mode,uuid,pci.bus_id",
            "--format=csv")
    assert p.stdout.splitlines() == [
        "name, memory.total [MiB], memory.used [MiB], utilization.gpu [%], persistence_mode, uuid, pci.bus_id",
        "NVIDIA L4, 23034 MiB, 0 MiB, 4 %, Disabled, GPU-3a23c669-1f69-c64e-cf85-44e9b07e7a2a, 00000000:31:00.0"]
    p = smi(extracted, "535", root, "--query-gpu=name,memory.total", "--format=csv,noheader")
    assert p.stdout.splitlines() == (FIX / "query_name_memory_l4_noheader.csv").read_text().splitlines()
    p = smi(extracted, "535", root, "--query-gpu=index,name,compute_cap", "--format=csv,noheader,nounits")
    assert p.stdout.strip() == "0, NVIDIA L4, 8.9"
    p = smi(extracted, "535", root, "--query-gpu=id,name,compute_cap", "--format=csv")
    assert p.returncode == 2
    assert p.stdout.splitlines()[0] == (FIX / "query_id_invalid.txt").read_text().strip()
    assert gpu.parse_query(p.stdout.splitlines(), ("id", "name", "compute_cap")).invalid_field == "id"


def test_driver_change_without_reboot_is_a_version_mismatch(extracted, tmp_path):
    root = host_root(tmp_path, "T4")
    assert smi(extracted, "535", root).returncode == 0  # loads the 535 module
    assert (root / "run/nvidia-standin/module-version").read_text().strip() == "535.104.12"
    p = smi(extracted, "560", root)  # 560 installed, 535 still loaded
    assert p.returncode != 0
    assert gpu.parse_summary(p.stdout.splitlines())["status"] == "version_mismatch"
    assert p.stdout.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                     "NVML library version: 560.28"]
    (root / "run/nvidia-standin/module-version").unlink()  # reboot: /run is empty again
    assert smi(extracted, "560", root).returncode == 0


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_nvidia_smi_while_nouveau_holds_the_gpu(extracted, tmp_path, shell):
    """As on a real first install: nouveau bound the GPU at boot, so the installed driver cannot
    load: no version mismatch, nvidia-smi cannot communicate with the driver until a reboot after
    nouveau was blacklisted."""
    root = host_root(tmp_path, "L4")
    with open(root / "etc/nvidia-standin/gpu.env", "a") as f:
        f.write('NOUVEAU="1"\n')
    p = smi(extracted, "580", root, shell=shell)
    assert p.returncode == 9 and gpu.parse_summary(p.stdout.splitlines())["status"] == "no_communication"
    (root / "etc/modprobe.d").mkdir()
    (root / "etc/modprobe.d/blacklist-nouveau.conf").write_text("blacklist nouveau\noptions nouveau modeset=0\n")
    assert smi(extracted, "580", root, shell=shell).returncode == 9  # blacklisted during this boot
    assert not (root / "run/nvidia-standin/module-version").exists()
    later = str(int(time.time()) + 60)  # the next boot: nouveau blacklisted, the NVIDIA module loads
    assert smi(extracted, "580", root, shell=shell, NVIDIA_STANDIN_BOOT_TIME=later).returncode == 0
    assert (root / "run/nvidia-standin/module-version").read_text().strip() == "580.159.04"
    assert smi(extracted, "580", root, shell=shell).returncode == 0  # loaded: stays loaded


def test_gpu_profile():
    assert gpu_profile("none") == "" and gpu_profile(None) == ""
    assert 'GPU_NAME="Tesla T4"' in gpu_profile("t4") and 'COMPUTE_CAP="7.5"' in gpu_profile("T4")
    assert 'GPU_NAME="NVIDIA L4"' in gpu_profile("l4") and 'MEMORY_MIB="23034"' in gpu_profile("L4")
    with pytest.raises(ValueError, match="A100"):
        gpu_profile("A100")


# ---------------------------------------------------------------- nvidia-persistenced

def _started(pid: int) -> str:
    """/proc/PID/stat's starttime ("" when gone): with the pid, a process's identity (pids are reused)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _running(pid: int, started: str) -> bool:
    """That very process still runs: not another process on its reused pid, and alive (a zombie,
    ended and not reaped yet, counts as ended). The daemon's sleep outliving it was a lost TERM,
    fixed in the stand-in (its trap sends KILL), not a zombie or a reused pid."""
    return bool(started) and _started(pid) == started and procs.alive(pid)


def test_nvidia_persistenced(extracted, tmp_path):
    script = extracted["nvidia-persistenced_570.133.07-1_amd64"] / "usr/bin/nvidia-persistenced"
    root = host_root(tmp_path, "L4")
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(root)}
    p = subprocess.run(["dash", str(script), "--verbose"], capture_output=True, text=True, env=env, timeout=20)
    assert p.returncode == 0, p.stderr
    pidfile = root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, 0)
        children = [(int(c), _started(int(c))) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    finally:
        os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not pidfile.exists() and not any(_running(c, t) for c, t in children):
            break
        time.sleep(0.1)
    assert not pidfile.exists()
    assert children and not any(_running(c, t) for c, t in children)  # its sleep went with it
    # the packaged unit's --no-persistence-mode: the daemon runs, persistence mode stays off
    for flag, mode in (("--no-persistence-mode", "Disabled"), ("--persistence-mode", "Enabled")):
        p = subprocess.run(["dash", str(script), flag], capture_output=True, text=True, env=env, timeout=20)
        assert p.returncode == 0, p.stderr
        q = smi(extracted, "570", root, "-q")
        assert [ln.split(":")[1].strip() for ln in q.stdout.splitlines() if "Persistence Mode" in ln] == [mode]
        os.kill(int(pidfile.read_text()), signal.SIGTERM)
        for _ in range(50):
            if not pidfile.exists():
                break
            time.sleep(0.1)
    unit = (extracted["nvidia-persistenced_570.133.07-1_amd64"] / "lib/systemd/system/nvidia-persistenced.service")
    assert "--no-persistence-mode" in unit.read_text()
    none = host_root(tmp_path, "none")
    p = subprocess.run(["dash", str(script)], capture_output=True, text=True,
                       env=dict(env, NVIDIA_STANDIN_ROOT=str(none)), timeout=20)
    assert p.returncode == 1 and "nvidia-persistenced failed to initialize" in p.stderr


# ---------------------------------------------------------------- nvidia-ctk

def ctk(extracted, *args, cwd=None) -> subprocess.CompletedProcess:
    script = extracted["nvidia-container-toolkit-base_1.17.8-1_amd64"] / "usr/bin/nvidia-ctk"
    return subprocess.run(["python3", str(script), *args], capture_output=True, text=True, cwd=cwd)


def test_nvidia_ctk_keeps_other_keys_and_is_idempotent(extracted, tmp_path):
    cfg = tmp_path / "etc/docker/daemon.json"
    cfg.parent.mkdir(parents=True)
    original = {"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "data-root": "/srv/docker",
                "runtimes": {"crun": {"path": "/usr/bin/crun"}}}
    cfg.write_text(json.dumps(original))
    p = ctk(extracted, "runtime", "configure", "--runtime=docker", f"--config={cfg}")
    assert p.returncode == 0, p.stderr
    data = json.loads(cfg.read_text())
    assert data["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    assert data["runtimes"]["crun"] == {"path": "/usr/bin/crun"}
    for key in ("log-driver", "log-opts", "data-root"):
        assert data[key] == original[key]
    first = cfg.read_bytes()
    assert not first.endswith(b"\n") and b'\n    "data-root": "/srv/docker",' in first
    msgs = [line.split('msg="', 1)[1].rstrip('"') for line in p.stderr.splitlines()]
    assert msgs == ["Ignoring runtime-config-override flag for docker", f"Loading config from {cfg}",
                    f"Wrote updated config to {cfg}", "It is recommended that docker daemon be restarted."]
    again = ctk(extracted, "runtime", "configure", "--runtime=docker", "--config", str(cfg))
    assert again.returncode == 0 and cfg.read_bytes() == first


def test_nvidia_ctk_new_file_matches_real_output(extracted, tmp_path):
    cfg = tmp_path / "docker/daemon.json"
    p = ctk(extracted, "runtime", "configure", "--runtime=docker", f"--config={cfg}")
    assert p.returncode == 0
    assert cfg.read_text() + "\n" == (FIX / "daemon_json_after_ctk.json").read_text()
    assert 'level=info msg="Config file does not exist; using empty config"' in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    p = ctk(extracted, "runtime", "configure", "--runtime=docker", f"--config={bad}")
    assert p.returncode == 1 and "unable to load config for runtime docker" in p.stderr
    assert bad.read_text() == "{not json"


def test_nvidia_ctk_terminal_log_format_matches_capture(extracted, tmp_path, monkeypatch):
    script = extracted["nvidia-container-toolkit-base_1.17.8-1_amd64"] / "usr/bin/nvidia-ctk"
    loader = importlib.machinery.SourceFileLoader("standin_nvidia_ctk", str(script))
    spec = importlib.util.spec_from_loader("standin_nvidia_ctk", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(mod.sys, "stderr", err)
    assert mod.main(["runtime", "configure", "--runtime=docker", f"--config={tmp_path}/daemon.json"]) == 0
    # padding depends on the message length: compare without it, then check it with the real path
    got = err.getvalue().replace(f"{tmp_path}/daemon.json", "/etc/docker/daemon.json").splitlines()
    real = (FIX / "ctk_configure_docker_no_config_tty.txt").read_text().splitlines()
    assert [g.rstrip() for g in got] == [r.rstrip() for r in real]
    err.truncate(0)
    err.seek(0)
    assert mod.main(["runtime", "configure", f"--config={tmp_path}/daemon.json"]) == 0
    got = err.getvalue().replace(f"{tmp_path}/daemon.json", "/etc/docker/daemon.json").splitlines()
    real = (FIX / "ctk_configure_docker_existing_config_tty.txt").read_text().splitlines()
    assert [g.rstrip() for g in got[1:]] == [r.rstrip() for r in real]
    err.truncate(0)
    err.seek(0)
    for line in real[:2] + (FIX / "ctk_configure_docker_no_config_tty.txt").read_text().splitlines():
        level = {"INFO": "info", "WARN": "warning"}[line[:4]]
        mod.log(level, line[11:].rstrip())
    assert err.getvalue().splitlines()[:2] == real[:2]
    out = io.StringIO()
    monkeypatch.setattr(mod.sys, "stdout", out)
    assert mod.main(["--version"]) == 0
    first = out.getvalue().splitlines()
    assert first[0] == "NVIDIA Container Toolkit CLI version 1.17.8" and first[1].startswith("commit: ")
    assert len(first[1].split()[1]) == 40


# ---------------------------------------------------------------- the OCI hook

def bundle(tmp_path: Path, env: list[str]) -> tuple[Path, Path]:
    b = tmp_path / "bundle"
    rootfs = b / "rootfs"
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "bin").symlink_to("usr/bin")
    (rootfs / "etc").mkdir()
    (b / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2-dev", "root": {"path": "rootfs"},
        "process": {"args": ["nvidia-smi"], "env": ["PATH=/usr/local/sbin:/usr/bin:/bin", *env]},
    }))
    return b, rootfs


def hook(extracted, host: Path, b: Path, *args: str) -> subprocess.CompletedProcess:
    script = extracted["nvidia-container-toolkit_1.17.8-1_amd64"] / "usr/bin/nvidia-container-runtime-hook"
    state = json.dumps({"ociVersion": "1.0.2-dev", "id": "abc", "status": "creating", "pid": 4242,
                        "bundle": str(b)})
    return subprocess.run(["python3", str(script), *args], input=state, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(host)})


def test_hook_makes_nvidia_smi_visible_in_the_container(extracted, tmp_path):
    host = host_root(tmp_path, "L4")
    (host / "usr/bin").mkdir(parents=True)
    shutil.copy(extracted[SMI_PACKAGE["535"]] / "usr/bin/nvidia-smi", host / "usr/bin/nvidia-smi")
    assert smi(extracted, "535", host).returncode == 0  # the host loaded the module
    b, rootfs = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    p = hook(extracted, host, b, "prestart")
    assert p.returncode == 0, p.stderr
    assert os.access(rootfs / "usr/bin/nvidia-smi", os.X_OK)
    assert (rootfs / "etc/nvidia-standin/gpu.env").read_text() == gpu_profile("L4")
    assert (rootfs / "run/nvidia-standin/module-version").read_text().strip() == "535.104.12"
    # inside the container (busybox sh, paths relative to its root)
    p = subprocess.run(["busybox", "sh", str(rootfs / "bin/nvidia-smi")], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(rootfs)})
    s = gpu.parse_summary(p.stdout.splitlines())
    assert (s["status"], s["gpus"][0]["name"]) == ("ok", "NVIDIA L4")
    assert hook(extracted, host, b, "poststop").returncode == 0


def test_hook_copies_the_stand_in_answer_of_a_host_whose_driver_cannot_answer(extracted, tmp_path):
    """A host with a real driver that cannot answer for the stand-in GPU (Debian's nvidia-smi on a
    test host) and the stand-in's answer at ANSWER_PATH (put there by a test): the container gets
    the answer, not the host's own nvidia-smi."""
    from tritonfleet_testbed.standin_repo import ANSWER_PATH, smi_answer

    host = host_root(tmp_path, "T4")
    (host / "usr/bin").mkdir(parents=True)
    (host / "usr/bin/nvidia-smi").write_text("ELF: Debian's nvidia-smi\n")
    answer = host / ANSWER_PATH.lstrip("/")
    answer.parent.mkdir(parents=True)
    answer.write_text(smi_answer("535.309.01"))
    answer.chmod(0o755)
    b, rootfs = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    p = hook(extracted, host, b, "prestart")
    assert p.returncode == 0, p.stderr
    p = subprocess.run(["busybox", "sh", str(rootfs / "usr/bin/nvidia-smi")], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(rootfs)})
    s = gpu.parse_summary(p.stdout.splitlines())
    assert (s["status"], s["driver_version"], s["cuda_version"]) == ("ok", "535.309.01", "12.2"), p.stdout


def test_hook_without_gpu_request_or_without_gpu(extracted, tmp_path):
    host = host_root(tmp_path, "T4")
    (host / "usr/bin").mkdir(parents=True)
    shutil.copy(extracted[SMI_PACKAGE["560"]] / "usr/bin/nvidia-smi", host / "usr/bin/nvidia-smi")
    b, rootfs = bundle(tmp_path / "a", ["NVIDIA_VISIBLE_DEVICES=void"])
    assert hook(extracted, host, b, "prestart").returncode == 0
    assert not (rootfs / "usr/bin/nvidia-smi").exists()
    nogpu = host_root(tmp_path, "none")
    (nogpu / "usr/bin").mkdir(parents=True)
    shutil.copy(host / "usr/bin/nvidia-smi", nogpu / "usr/bin/nvidia-smi")
    b, rootfs = bundle(tmp_path / "b", ["NVIDIA_VISIBLE_DEVICES=all"])
    p = hook(extracted, nogpu, b, "prestart")
    assert p.returncode == 1 and "driver not loaded" in p.stderr
    assert not (rootfs / "usr/bin/nvidia-smi").exists()


# ---------------------------------------------------------------- GPU loss at daemon-reload

def test_nvidia_ctk_creates_the_dev_char_symlinks_like_the_real_one(extracted, tmp_path):
    host = host_root(tmp_path, "T4")
    char = tmp_path / "char"
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(host)}
    script = extracted["nvidia-container-toolkit-base_1.17.8-1_amd64"] / "usr/bin/nvidia-ctk"

    def run(*args, root=host):
        return subprocess.run(["python3", str(script), "system", "create-dev-char-symlinks", *args],
                              capture_output=True, text=True, env={**env, "NVIDIA_STANDIN_ROOT": str(root)})

    p = run("--create-all", "--dev-char-path", str(char))
    assert p.returncode == 0, p.stderr
    links = {q.name: os.readlink(q) for q in char.iterdir()}
    assert links == {"195:254": "/dev/nvidia-modeset", "195:255": "/dev/nvidiactl", "509:0": "/dev/nvidia-uvm",
                     "509:1": "/dev/nvidia-uvm-tools", "195:0": "/dev/nvidia0"}
    msgs = [ln.split('msg="', 1)[1].rstrip('"') for ln in p.stderr.splitlines()]
    assert msgs[1] == f"Creating link {char}/195:255 => /dev/nvidiactl"
    again = run("--create-all", "--dev-char-path", str(char))  # as the real one: warns, exits 0
    assert again.returncode == 0
    assert f"Could not create symlink: symlink /dev/nvidiactl {char}/195:255: file exists" in again.stderr
    assert "level=warning" in again.stderr
    nogpu = run("--create-all", "--dev-char-path", str(tmp_path / "none"), root=host_root(tmp_path, "none"))
    assert nogpu.returncode == 0 and "No NVIDIA devices found in /" in nogpu.stderr
    assert not (tmp_path / "none").exists()
    both = run("--create-all", "--watch")
    assert both.returncode == 1 and "create-all and watch are mutually exclusive" in both.stderr


def test_daemon_reload_without_the_symlinks_costs_a_running_container_its_gpus(extracted, tmp_path):
    """The stand-in of NVIDIA's notice (nvidia-docker#1730): the generator (run by systemd at every
    daemon-reload) takes the GPUs from containers the hook set up unless /dev/char/195:255 exists;
    a re-created container sees them again."""
    host = host_root(tmp_path, "L4")
    (host / "usr/bin").mkdir(parents=True)
    shutil.copy(extracted[SMI_PACKAGE["535"]] / "usr/bin/nvidia-smi", host / "usr/bin/nvidia-smi")
    gen = extracted["nvidia-container-toolkit_1.17.8-1_amd64"] / "usr/lib/systemd/system-generators/" \
                                                                   "nvidia-standin-device-rules"
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(host)}

    def in_container(rootfs):
        return subprocess.run(["busybox", "sh", str(rootfs / "usr/bin/nvidia-smi"), "-L"], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(rootfs)})

    b, rootfs = bundle(tmp_path / "a", ["NVIDIA_VISIBLE_DEVICES=all"])
    assert hook(extracted, host, b, "prestart").returncode == 0
    assert in_container(rootfs).stdout.startswith("GPU 0: NVIDIA L4 (UUID: ")
    assert subprocess.run(["busybox", "sh", str(gen), "/run/a", "/run/b", "/run/c"], env=env).returncode == 0
    lost = in_container(rootfs)
    assert (lost.returncode, lost.stdout.strip()) == (255, "Failed to initialize NVML: Unknown Error")
    assert smi(extracted, "535", host, "-L").returncode == 0  # the host itself still sees it
    # with the symlinks a reload leaves a new container alone
    (host / "dev/char").mkdir(parents=True)
    (host / "dev/char/195:255").symlink_to("/dev/nvidiactl")
    b2, rootfs2 = bundle(tmp_path / "b", ["NVIDIA_VISIBLE_DEVICES=all"])
    assert hook(extracted, host, b2, "prestart").returncode == 0
    assert subprocess.run(["busybox", "sh", str(gen)], env=env).returncode == 0
    assert in_container(rootfs2).returncode == 0
    # a container that is gone is forgotten
    records = host / "run/nvidia-standin/gpu-containers"
    assert [p.name for p in records.iterdir()] == ["abc"]
    shutil.rmtree(rootfs2)
    assert subprocess.run(["busybox", "sh", str(gen)], env=env).returncode == 0
    assert list(records.iterdir()) == []


def test_driver_binding_at_boot_runs_the_udev_rule_for_the_nvidia_driver(extracted, tmp_path):
    """The stand-in of the boot-time uevent: a rule for /bus/pci/drivers/nvidia runs (as the
    deploy's 71-nvidia-dev-char.rules does on a real host), other rules do not; nothing while
    nouveau holds the GPU or without one."""
    from tritonfleet.gpu import guard as gpuguard

    bind = extracted[SMI_PACKAGE["535"]] / "usr/lib/nvidia-standin/bind"
    unit = extracted[SMI_PACKAGE["535"]] / "lib/systemd/system/nvidia-standin-bind.service"
    assert "ExecStart=/usr/lib/nvidia-standin/bind" in unit.read_text()
    assert (extracted[SMI_PACKAGE["535"]] / "etc/systemd/system/multi-user.target.wants/nvidia-standin-bind.service"
            ).is_symlink()
    host = host_root(tmp_path, "T4")
    rules = host / "lib/udev/rules.d"
    rules.mkdir(parents=True)
    out = tmp_path / "ran"
    (rules / "71-nvidia-dev-char.rules").write_text(
        gpuguard.UDEV_RULE.replace("/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all",
                                   f"/bin/sh -c 'echo bound >> {out}'"))
    (rules / "50-other.rules").write_text(f'ACTION=="add", SUBSYSTEM=="net", RUN+="/bin/sh -c \'echo net >> {out}\'"\n')

    def run(root):
        return subprocess.run(["busybox", "sh", str(bind)], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(root)})

    assert run(host).returncode == 0 and out.read_text() == "bound\n"
    (host / "etc/nvidia-standin/gpu.env").write_text(gpu_profile("T4") + 'NOUVEAU="1"\n')
    assert run(host).returncode == 0 and out.read_text() == "bound\n"  # nouveau holds it: no bind
    nogpu = host_root(tmp_path, "none")
    (nogpu / "lib").mkdir()
    shutil.copytree(rules, nogpu / "lib/udev/rules.d")
    assert run(nogpu).returncode == 0 and out.read_text() == "bound\n"


# ---------------------------------------------------------------- kernel upgrades and DKMS

def test_newer_kernels_sort_after_the_running_one():
    from tritonfleet_testbed.standin_repo import newer_kernels

    for running in (KERNEL, "6.1.0-28-amd64", "6.18.44-fc-v1147", "5.15.0-25-generic", "odd"):
        a, b = newer_kernels(running)
        order = subprocess.run(["sort", "-V"], input=f"{b}\n{running}\n{a}\n", capture_output=True,
                               text=True).stdout.split()
        assert order == [running, a, b]


def test_kernel_upgrade_packages(repo, extracted):
    from tritonfleet_testbed.standin_repo import newer_kernels

    with_headers, without = newer_kernels(KERNEL)
    d = repo.cuda_dirs["debian12"]
    for k in (with_headers, without):
        deb = next(d.glob(f"linux-image-{k}_*_amd64.deb"))
        x = extracted[deb.stem]
        assert (x / f"boot/vmlinuz-{k}").is_file() and (x / f"lib/modules/{k}").is_dir()
        post = subprocess.run(["dpkg-deb", "-I", str(deb), "postinst"], capture_output=True, text=True).stdout
        assert "/var/run/reboot-required" in post and f"--arg={k}" in post and "/etc/kernel/postinst.d" in post
    assert list(d.glob(f"linux-headers-{with_headers}_*.deb")) and not list(d.glob(f"linux-headers-{without}_*.deb"))
    deb = next(d.glob(f"linux-headers-{with_headers}_*.deb"))
    post = subprocess.run(["dpkg-deb", "-I", str(deb), "postinst"], capture_output=True, text=True).stdout
    assert "/etc/kernel/header_postinst.d" in post


def test_standin_dkms_builds_for_kernels_with_headers(extracted, tmp_path):
    pkg = extracted[next(k for k in extracted if k.startswith("nvidia-kernel-dkms_580."))]
    for hook in ("etc/kernel/header_postinst.d/nvidia-standin-dkms", "etc/kernel/postinst.d/nvidia-standin-dkms"):
        assert os.access(pkg / hook, os.X_OK)
    root = tmp_path / "root"
    (root / "lib/modules/6.1.0-28-amd64/build").mkdir(parents=True)
    (root / "lib/modules/6.1.0-29-amd64").mkdir(parents=True)

    def dkms(*args):
        return subprocess.run(["busybox", "sh", str(pkg / "usr/lib/nvidia-standin/dkms"), *args], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(root)})

    p = dkms()  # the package's postinst: every kernel with headers
    assert p.returncode == 0 and "built and installed for kernel 6.1.0-28-amd64" in p.stdout
    module = root / "lib/modules/6.1.0-28-amd64/updates/dkms/nvidia.ko"
    assert module.read_text().startswith("stand-in nvidia kernel module 580.")
    assert not list((root / "lib/modules/6.1.0-29-amd64").rglob("nvidia.ko*"))
    p = dkms("6.1.0-29-amd64")  # a kernel without headers: nothing built, said so, not an error
    assert p.returncode == 0 and "no headers for kernel 6.1.0-29-amd64" in p.stderr
    (root / "lib/modules/6.1.0-29-amd64/build").mkdir()
    assert dkms("6.1.0-29-amd64").returncode == 0  # its headers arrive: the hook builds it
    assert (root / "lib/modules/6.1.0-29-amd64/updates/dkms/nvidia.ko").is_file()
