"""The NVIDIA kernel module flavour (nvidia_kernel_module): the parsers of modinfo's licence and
/proc/driver/nvidia/version, the packages each flavour installs per repository layout, the driver
step's commands when a host switches flavour (pyinfra's @fake connector), the GPU verification's
and `tritonfleet status`'s verdicts, and the stand-in's modinfo and /proc answers."""

from __future__ import annotations

import re
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fakehost import run_fake
from tritonfleet.host import kernel_module as kmod
from tritonfleet.host import nvidia_repos as vendorfacts

OPEN_PROC = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
             "(dvs-builder@U22-I3-B17-02-5)  Tue Sep 23 09:55:41 UTC 2025")
PROP_PROC = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.135  Fri Jan 10 20:00:00 UTC 2025"


# ---------------------------------------------------------------- parsers

def test_captured_answers():
    assert kmod.from_proc(OPEN_PROC) == "open" and kmod.proc_version(OPEN_PROC) == "580.95.05"
    assert kmod.from_proc(PROP_PROC) == "proprietary" and kmod.proc_version(PROP_PROC) == "550.135"
    assert kmod.from_proc("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  595.45.04  Release Build") == "open"
    assert kmod.from_license("Dual MIT/GPL") == "open" and kmod.from_license("NVIDIA") == "proprietary"
    assert kmod.from_proc("") is None and kmod.from_license("") is None
    assert kmod.from_proc("head: cannot open '/proc/driver/nvidia/version'") is None
    assert kmod.from_license("modinfo: ERROR: Module nvidia not found.") is None


@given(version=st.from_regex(r"\A[0-9]{3}\.[0-9]{1,3}(\.[0-9]{2})?\Z"),
       arch=st.sampled_from(["x86_64", "aarch64", "ppc64le"]),
       tail=st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=60),
       open_=st.booleans())
def test_proc_line_any_version_and_tail(version, arch, tail, open_):
    line = (f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {version}  Release Build  {tail}" if open_
            else f"NVRM version: NVIDIA UNIX {arch} Kernel Module  {version}  {tail}")
    assert kmod.from_proc(line) == ("open" if open_ else "proprietary")
    assert kmod.proc_version(line) == version


@given(st.text(max_size=200))
def test_parsers_never_raise_and_need_the_marker(text):
    kmod.from_proc(text), kmod.from_license(text), kmod.proc_version(text)
    state = kmod.parse(text.splitlines())
    if not any(line.strip().startswith(kmod.MARK) for line in text.splitlines()):
        assert state == kmod.ModuleState(None, None)


@given(license_=st.sampled_from(["Dual MIT/GPL", "NVIDIA", "", "GPL", "Proprietary"]),
       proc=st.sampled_from([OPEN_PROC, PROP_PROC, ""]),
       noise=st.lists(st.text(alphabet="abc =:\t", max_size=20), max_size=5))
@settings(max_examples=60)
def test_command_output_round_trip(license_, proc, noise):
    lines = [*noise, f"kmod:license={license_}", "  kmod:version=580.1", f"kmod:proc={proc}", *noise]
    other, mine = kmod.split(lines)
    assert other == noise + noise and len(mine) == 3
    s = kmod.parse(lines)
    assert s.installed == kmod.from_license(license_) and s.loaded == kmod.from_proc(proc)
    for wanted in kmod.FLAVOURS:
        problem = s.problem(wanted)
        wrong = (s.installed not in (None, wanted)) or (s.loaded not in (None, wanted)) or \
            (s.installed is None and bool(license_))
        assert bool(problem) == wrong, (s, wanted, problem)


def test_default_flavour_follows_nvidia():
    assert kmod.default_flavour("580") == "open" and kmod.default_flavour("560") == "open"
    assert kmod.default_flavour("555") == "proprietary" and kmod.default_flavour("535.104.12") == "proprietary"


def test_summary():
    assert kmod.ModuleState("open", "open").summary() == "open"
    assert kmod.ModuleState("proprietary", "open").summary() == "proprietary (loaded: open)"
    assert kmod.ModuleState(None, None).summary() == "-"


# ---------------------------------------------------------------- packages per repository layout

@pytest.mark.parametrize("distro", [d for d in vendorfacts.DISTROS if "580" in vendorfacts.branches(d)])
def test_flavour_packages(distro):
    opn, prop = (vendorfacts.flavour_packages(distro, "580", f) for f in ("open", "proprietary"))
    assert opn[0] == "nvidia-open-580" and prop[0] == "cuda-drivers-580"
    assert vendorfacts.flavour_packages(distro, "590", "open")[0] == "nvidia-open"
    if vendorfacts.family(distro) == "debian":
        assert opn[1:] == ["nvidia-kernel-open-dkms"] and prop[1:] == ["nvidia-kernel-dkms"]
    else:
        assert opn[1:] == ["nvidia-driver-580-open", "nvidia-dkms-580-open", "nvidia-kernel-source-580-open"]
        assert prop[1:] == ["nvidia-driver-580", "nvidia-dkms-580", "nvidia-kernel-source-580"]
        assert "nvidia-dkms-open" in vendorfacts.flavour_packages(distro, "590", "open")
    # both flavours are the driver's set: held, pinned, kept from unattended-upgrades
    every = set(vendorfacts.all_driver_packages(distro))
    assert set(opn) | set(prop) <= every
    shared = set(vendorfacts.driver_packages(distro, "580", "open")) & set(vendorfacts.driver_packages(distro, "580"))
    assert not shared & (set(opn) | set(prop))


@pytest.mark.parametrize("distro", [d for d in vendorfacts.DISTROS if "580" not in vendorfacts.branches(d)])
def test_flavour_packages_of_a_repository_without_580(distro):
    """A repository whose oldest branch is newer (Ubuntu 26.04: R595 only): each of its branches'
    flavours are in the driver's set, unversioned names from R590."""
    every = set(vendorfacts.all_driver_packages(distro))
    for branch in vendorfacts.branches(distro):
        opn, prop = (vendorfacts.flavour_packages(distro, branch, f) for f in ("open", "proprietary"))
        assert opn[0] == "nvidia-open" and set(opn) | set(prop) <= every


# ---------------------------------------------------------------- the driver step (@fake)

from tritonfleet.steps.host_prep import nvidia_driver  # noqa: E402

BASE = {'echo "running=$r"': ["running=6.1.0-28-amd64", "boot=6.1.0-28-amd64", "module=yes"],
        "uname -m": "x86_64", "uname -r": "6.1.0-28-amd64",
        "nvidia-smi -q": "    Persistence Mode                      : Enabled",
        "nvidia-smi --query-gpu=driver_version": "580.159.04"}
REBOOT = "( sleep 1 && reboot )"


def dpkg(*rows: str) -> list[str]:
    return ["\t".join(r.split()) for r in rows]


def kmod_answer(license_: str, proc: str) -> list[str]:
    return [f"kmod:license={license_}", "kmod:version=580.159.04", f"kmod:proc={proc}"]


OPEN_HOST = dpkg("ii nvidia-driver-pinning-580 580-1", "hi nvidia-open-580 580.159.04-1",
                 "hi nvidia-driver 580.159.04-1", "hi nvidia-kernel-open-dkms 580.159.04-1",
                 "hi libcuda1 580.159.04-1", "ii linux-headers-6.1.0-28-amd64 6.1.76-1", "ii dkms 3.0.10-8",
                 "ii firmware-misc-nonfree 20230210-5")


def installs(cmds):
    return [c for c in cmds if "apt-get" in c and " install " in c and not c.startswith("r=$(uname")]


def test_default_is_open_and_names_its_module_package():
    _, cmds, state = run_fake(nvidia_driver, BASE, {"cuda_distro": "debian12"})
    assert not state.failed_hosts
    assert any(re.search(r"install nvidia-open-580 nvidia-kernel-open-dkms\b", c) for c in installs(cmds))
    assert not any("cuda-drivers-580" in c for c in installs(cmds))
    _, cmds, _ = run_fake(nvidia_driver, BASE, {"cuda_distro": "debian12", "nvidia_kernel_module": "proprietary"})
    assert any(re.search(r"install cuda-drivers-580 nvidia-kernel-dkms\b", c) for c in installs(cmds))
    assert not any("nvidia-open" in c or "open-dkms" in c for c in installs(cmds))


def test_switch_on_ubuntu_names_every_package_of_both_flavours():
    os_release = ["/etc/os-release", "ID=ubuntu", 'VERSION_ID="22.04"', "VERSION_CODENAME=jammy", "NAME=Ubuntu"]
    rows = dpkg("ii nvidia-driver-pinning-580 580-2ubuntu1", "hi cuda-drivers-580 580.159.04-1",
                "hi nvidia-driver-580 580.159.04-0ubuntu1", "hi nvidia-dkms-580 580.159.04-0ubuntu1",
                "hi nvidia-kernel-source-580 580.159.04-0ubuntu1", "hi libnvidia-compute-580 580.159.04-0ubuntu1")
    _, cmds, _ = run_fake(nvidia_driver, {**BASE, "ls -pdL *-release": os_release, "dpkg-query -W": rows},
                          {"cuda_distro": "ubuntu2204", "nvidia_kernel_module": "open"})
    swap = next(c for c in cmds if "--allow-downgrades nvidia-open-580" in c)
    assert re.search(r"nvidia-open-580 nvidia-driver-580-open nvidia-dkms-580-open nvidia-kernel-source-580-open\b", swap)
    for gone in ("nvidia-driver-580", "nvidia-dkms-580", "nvidia-kernel-source-580"):
        assert re.search(rf"\s{gone}-(\s|$)", swap), (gone, swap)
    assert "libnvidia-compute-580" in swap  # the shared packages move with it


def test_converged_open_host_changes_nothing():
    responses = {**BASE, "dpkg-query -W": OPEN_HOST, "modinfo -F license": kmod_answer("Dual MIT/GPL", OPEN_PROC)}
    _, cmds, state = run_fake(nvidia_driver, responses, {"cuda_distro": "debian12"})
    assert not state.failed_hosts
    assert not installs(cmds) and not any("apt-mark unhold" in c or REBOOT in c for c in cmds)


# ---------------------------------------------------------------- GPU verification and status

def test_verification_fails_a_host_with_the_other_flavour():
    from tritonfleet.steps.verify import verify_gpus

    query = "0, Tesla T4, GPU-1, 00000000:00:1E.0, 580.159.04, 7.5, 15360"
    summary = "| NVIDIA-SMI 580.159.04     Driver Version: 580.159.04     CUDA Version: 13.0     |"
    section = "@@tritonfleet-section@@"

    def answer(license_, proc):
        return [query, section, summary, *kmod_answer(license_, proc), section, query, section, summary]

    data = {"gpu_class": "T4", "gpu_verify_container": "always"}
    good = {"q=$(nvidia-smi": answer("Dual MIT/GPL", OPEN_PROC)}
    _, _, state = run_fake(lambda: verify_gpus(load_image=False), good, data)
    assert not state.failed_hosts
    bad = {"q=$(nvidia-smi": answer("NVIDIA", PROP_PROC)}
    _, cmds, state = run_fake(lambda: verify_gpus(load_image=False), bad, data)
    assert state.failed_hosts
    report = next(c for c in cmds if "last-failure.json" in c)
    assert "installed module is proprietary" in report and "expected open" in report
    assert "nvidia_kernel_module" in report
    _, _, state = run_fake(lambda: verify_gpus(load_image=False), bad, {**data, "nvidia_kernel_module": "proprietary"})
    assert not state.failed_hosts


def test_status_shows_the_flavour_and_drift():
    from tritonfleet.fleet import probe
    from tritonfleet.inventory.roster import FleetHost

    text = "@gpu\nTesla T4, 580.159.04\n@kmod\n" + "\n".join(kmod_answer("NVIDIA", PROP_PROC)) + "\n"
    fh = FleetHost("h1", ["t4"], {"gpu_class": "T4", "ssh_hostname": "10.0.0.1"})
    st = probe.interpret(fh, probe.parse(text))
    assert st.module == "proprietary"
    drift = probe.module_drift(st, {"kernel_module": None, "driver_branch": None})
    assert drift and "installed module is proprietary" in drift[0] and "(want open)" in drift[0]
    assert probe.module_drift(st, {"kernel_module": "proprietary"}) == []
    anything = type("Anything", (), {"get": lambda self, k, d=None: {"triton_http_port": 8000}.get(k, "x")})()
    assert "kmod:license" in probe.command(anything)


# ---------------------------------------------------------------- the stand-in's answers

def test_standin_modinfo_and_proc_follow_the_installed_flavour(tmp_path):
    from tritonfleet_testbed.standin_repo import STANDIN, _template

    kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    root = tmp_path / "root"
    (root / f"lib/modules/{kernel}/build").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(root)}

    def sh(script: str, *args: str) -> subprocess.CompletedProcess:
        path = tmp_path / "s.sh"
        path.write_text(script)
        return subprocess.run(["sh", str(path), *args], capture_output=True, text=True, env=env)

    modinfo = (STANDIN / "nvidia-standin-modinfo.sh").read_text()
    assert sh(modinfo, "-F", "license", "nvidia").returncode == 1  # no module yet
    for license_, flavour in (("Dual MIT/GPL", "open"), ("NVIDIA", "proprietary")):
        dkms = _template("nvidia-standin-dkms.sh", DRIVER_VERSION="580.159.04", LICENSE=license_,
                         DESCRIPTION="x")
        assert sh(dkms).returncode == 0
        got = sh(modinfo, "-F", "license", "nvidia").stdout.strip()
        assert kmod.from_license(got) == flavour
        assert sh((STANDIN / "nvidia-standin-load-module.sh").read_text()).returncode == 0
        proc = (root / "proc/driver/nvidia/version").read_text().splitlines()[0]
        assert kmod.from_proc(proc) == flavour and kmod.proc_version(proc) == "580.159.04"
    sh(dkms, "remove")
    assert not (root / f"lib/modules/{kernel}/updates/dkms/nvidia.ko").exists()
