"""Where a host's driver came from (tritonfleet.host.driver_source): generated dpkg states and .run
files, the refusal with its migration help, the removal commands, and the status column."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet.fleet.probe import parse
from tritonfleet.host import driver_source as ds
from tritonfleet.host import nvidia_repos as vendorfacts

# packages that look like NVIDIA's but are not the driver: never a source, never removed
NOISE = {"dkms": "3.0.10-8", "libnvidia-egl-wayland1": "1:1.1.10-1", "nvidia-container-toolkit": "1.17.8-1",
         "libnvidia-container1": "1.17.8-1", "nvidia-kernel-common": "20151021+13",
         "glx-alternative-nvidia": "1.2.2", "nvidia-installer-cleanup": "20220217+3~deb12u1",
         "firmware-misc-nonfree": "20230210-5", "linux-headers-6.1.0-28-amd64": "6.1.76-1", "curl": "7.88.1-10"}

# (Debian 12's mirror: nvidia-driver 535.309.01-0+deb12u1 from bookworm-security, 535.261.03-1 in
# bookworm itself, nvidia-persistenced 535.171.04-1~deb12u1; `apt-cache policy` on a test host)
DEBIAN_NAMES = ["nvidia-driver", "nvidia-driver-libs", "nvidia-driver-bin", "nvidia-kernel-dkms", "nvidia-smi",
                "libcuda1", "nvidia-persistenced", "libnvidia-ml1", "firmware-nvidia-gsp", "nvidia-alternative"]
UBUNTU_NAMES = ["nvidia-driver-{b}-server", "nvidia-utils-{b}-server", "nvidia-compute-utils-{b}-server",
                "libnvidia-compute-{b}-server", "linux-modules-nvidia-{b}-server-6.8.0-1015-aws"]

release = st.tuples(st.integers(0, 300), st.integers(0, 99))


@st.composite
def driver_of(draw, source: str):
    """(installed {name: [version]}, the names that are the driver) for one source."""
    a, b = draw(release)
    if source == "cuda-debian":
        branch = draw(st.sampled_from(vendorfacts.branches("debian12")))
        version = f"{branch}.{a}.{b:02d}-1"
        names = draw(st.lists(st.sampled_from(DEBIAN_NAMES), min_size=1, unique=True))
        # a branch Debian's own archives carry too (550: trixie) is told by NVIDIA's metapackage
        if branch in ds.DEBIAN_ONLY_BRANCHES or draw(st.booleans()):
            names.append(f"cuda-drivers-{branch}")
    elif source == "cuda-ubuntu":
        branch = draw(st.sampled_from(vendorfacts.branches("ubuntu2204")))
        version = f"{branch}.{a}.{b:02d}-0ubuntu1"
        names = [f"nvidia-driver-{branch}", f"libnvidia-compute-{branch}", f"cuda-drivers-{branch}"]
    elif source == "cuda-ubuntu2604":  # R595 only, unversioned names, <upstream>-1ubuntu1 (ubuntu2604.toml)
        branch = draw(st.sampled_from(vendorfacts.branches("ubuntu2604")))
        version = f"{branch}.{a}.{b:02d}-1ubuntu1"
        # (nvidia-kernel-common is also the name of Debian's helper package in NOISE: one or the other)
        names = draw(st.lists(st.sampled_from([p for p in vendorfacts.driver_packages("ubuntu2604", branch)[1:]
                                               if p not in NOISE]), min_size=1, unique=True))
        if draw(st.booleans()):
            names.append(vendorfacts.metapackage("ubuntu2604", branch))
    elif source == "debian":
        branch = draw(st.sampled_from(ds.DEBIAN_ONLY_BRANCHES))
        version = f"{branch}.{a}.{b:02d}-" + draw(st.sampled_from(["0+deb12u1", "1~deb12u1", "2~deb12u3", "1"]))
        names = draw(st.lists(st.sampled_from(DEBIAN_NAMES), min_size=1, unique=True))
    else:  # ubuntu
        branch = draw(st.sampled_from(["535", "550", "570"]))
        version = f"{branch}.{a}.{b:02d}-0ubuntu0.{draw(st.sampled_from(['22.04', '24.04', '26.04']))}.{draw(st.integers(1, 9))}"
        names = [n.format(b=branch) for n in draw(st.lists(st.sampled_from(UBUNTU_NAMES), min_size=1, unique=True))]
    return {n: [version] for n in names}, sorted(names), version.split("-")[0]


SOURCES = {"cuda-debian": "cuda", "cuda-ubuntu": "cuda", "cuda-ubuntu2604": "cuda", "debian": "debian",
           "ubuntu": "ubuntu"}


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(sorted(SOURCES)), data=st.data(),
       noise=st.dictionaries(st.sampled_from(sorted(NOISE)), st.just(None)), held=st.data())
def test_one_source_is_told_from_its_packages(kind, data, noise, held):
    installed, names, version = data.draw(driver_of(kind))
    for n in noise:
        installed[n] = [NOISE[n]]
    holds = held.draw(st.lists(st.sampled_from(sorted(installed)), unique=True))
    found = ds.detect(installed, holds)
    assert found.source == SOURCES[kind] and found.others == ()
    assert found.packages == {SOURCES[kind]: names}
    assert found.version == version
    assert set(found.held) == set(holds) & set(names)
    # the same source converges; any other is a conflict, and its removal touches only the driver
    assert ds.conflict(found, SOURCES[kind]) == [] and ds.removal_commands(found, SOURCES[kind]) == []
    other = "debian" if SOURCES[kind] == "cuda" else "cuda"
    cmds = ds.removal_commands(found, other)
    purge = cmds[-1].split()
    assert purge[:5] == ["DEBIAN_FRONTEND=noninteractive", "apt-get", "purge", "-y", "-q"]
    assert sorted(purge[5:]) == names and not set(purge) & set(NOISE)
    unhold = [c for c in cmds if c.startswith("apt-mark unhold")]
    assert (unhold[0].split()[2:] if unhold else []) == sorted(set(holds) & set(names))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), owned=st.booleans(), with_log=st.booleans(), kind=st.sampled_from(["none", *sorted(SOURCES)]))
def test_run_installer_files_lead_and_are_removed_with_its_uninstaller(data, owned, with_log, kind):
    installed, names, _ = data.draw(driver_of(kind)) if kind != "none" else ({}, [], None)
    files = {"files": {ds.RUN_UNINSTALLER: "some-package" if owned else ""},
             "runlog": "535.183.01" if with_log else None}
    found = ds.detect(installed, [], files)
    if not owned or with_log:
        assert found.source == ds.RUNFILE
        assert found.others == ((SOURCES[kind],) if kind != "none" else ())
        assert found.version == ("535.183.01" if with_log else None)
        cmds = ds.removal_commands(found, "cuda")
        if not owned:
            assert cmds[0] == f"{ds.RUN_UNINSTALLER} --silent"
        else:  # a backup log but no uninstaller of its own: refused, nothing guessed
            assert "exit 1" in cmds[0] and ds.RUN_LOG in cmds[0]
    else:  # a packaged nvidia-uninstall is not the .run installer
        assert found.source == (SOURCES[kind] if kind != "none" else None)


def test_bare_host_and_noise_only_have_no_driver():
    assert ds.detect({}, []).source is None
    found = ds.detect({n: [v] for n, v in NOISE.items()}, list(NOISE))
    assert found.source is None and found.summary() == "none" and found.held == ()


def test_mixed_host_names_both_sources():
    installed = {"nvidia-driver": ["535.183.01-1~deb12u1"], "libcuda1": ["535.183.01-1~deb12u1"],
                 "linux-modules-nvidia-535-server-6.8.0-1015-aws": ["6.8.0-1015.16"]}
    # (the Ubuntu module's version is the kernel's: not a driver release, so not counted)
    assert ds.detect(installed).sources == ("debian",)
    installed["nvidia-utils-535-server"] = ["535.183.06-0ubuntu0.22.04.1"]
    found = ds.detect(installed)
    assert found.source == "debian" and found.others == ("ubuntu",)
    assert ds.conflict(found, "debian") == ["ubuntu"]


def test_migration_help_names_host_packages_and_ways_on():
    found = ds.detect({"nvidia-driver": ["535.183.01-1~deb12u1"], "nvidia-smi": ["535.183.01-1~deb12u1"]},
                      ["nvidia-driver"])
    text = ds.migration_help("tb1-t4", found, "cuda", "580")
    assert text.startswith("tb1-t4: the host already has an NVIDIA driver (debian 535.183.01)")
    assert "Debian's own packages (non-free): nvidia-driver, nvidia-smi" in text
    assert "nvidia_driver_migrate = True" in text and "apt-mark unhold nvidia-driver" in text
    assert "apt-get purge -y -q nvidia-driver nvidia-smi" in text
    assert "docs/driver-sources.md" in text
    cuda = ds.detect({"cuda-drivers-580": ["580.159.04-1"], "nvidia-driver": ["580.159.04-1"]})
    assert 'or set nvidia_driver_source = "cuda" to keep' in ds.migration_help("h", cuda, "debian", "535")
    run = ds.detect({}, [], {"files": {ds.RUN_UNINSTALLER: ""}, "runlog": "580.95.05"})
    text = ds.migration_help("tb1-t4", run, "cuda", "580")
    assert "runfile 580.95.05" in text and f"{ds.RUN_UNINSTALLER} --silent" in text
    assert "nvidia_driver_source =" not in text  # a .run install is no source to keep


def test_files_and_probe_output_parse():
    lines = [f"file={ds.RUN_UNINSTALLER} owner=", "file=/usr/bin/nvidia-installer owner=nvidia-installer-cleanup",
             "runlog=580.95.05"]
    assert ds.parse_files(lines) == {"files": {ds.RUN_UNINSTALLER: "", "/usr/bin/nvidia-installer":
                                               "nvidia-installer-cleanup"}, "runlog": "580.95.05"}
    text = ("@driver_source\nhi \tnvidia-driver\t535.183.01-1~deb12u1\nii \tnvidia-smi\t535.183.01-1~deb12u1\n"
            "rc \tnvidia-old\t470.1-1\n")
    found = ds.parse_probe(parse(text)["driver_source"])
    assert found.source == "debian" and found.held == ("nvidia-driver",) and found.packages == {
        "debian": ["nvidia-driver", "nvidia-smi"]}


# ---------------------------------------------------------------- the driver step (@fake connector)

from tests.support.fakehost import run_fake  # noqa: E402
from tests.unit.steps.test_steps_fake import BASE, DATA, dpkg, ops  # noqa: E402
from tritonfleet.steps.host_prep import nvidia_driver  # noqa: E402

DEBIAN_HOST = dpkg("hi nvidia-driver 535.183.01-1~deb12u1", "ii nvidia-smi 535.183.01-1~deb12u1",
                   "hi libcuda1 535.183.01-1~deb12u1", "ii nvidia-kernel-common 20151021+13",
                   "ii dkms 3.0.10-8", "ii firmware-misc-nonfree 20230210-5")


def test_driver_step_refuses_another_source_without_migrate():
    _, cmds, state = run_fake(nvidia_driver, {**BASE, "dpkg-query -W": DEBIAN_HOST}, DATA)
    assert state.failed_hosts
    run = "\n".join(c for c in ops(cmds) if "last-failure.json" not in c)  # (the failure report)
    assert "apt-get" not in run and "curl" not in run  # nothing changed


def test_migration_from_debian_purges_then_installs_cuda_and_holds():
    host, cmds, state = run_fake(nvidia_driver, {**BASE, "dpkg-query -W": DEBIAN_HOST},
                                 {**DATA, "nvidia_driver_migrate": True})
    assert not state.failed_hosts
    run = ops(cmds)
    unhold = next(i for i, c in enumerate(run) if "apt-mark unhold libcuda1 nvidia-driver" in c)
    purge = next(i for i, c in enumerate(run) if "apt-get purge -y -q libcuda1 nvidia-driver nvidia-smi" in c)
    key = next(i for i, c in enumerate(run) if "curl -fsSL" in c and "3bf863cc.pub" in c)
    driver = next(i for i, c in enumerate(run) if "install -y -q --allow-downgrades cuda-drivers-580" in c)
    hold = next(i for i, c in enumerate(run) if "xargs -r apt-mark hold" in c)
    assert unhold < purge < key < driver < hold
    assert "nvidia-kernel-common" not in run[purge] and "dkms" not in run[purge]
    # once: the reboot is decided on the host after the install (loaded module vs installed driver)
    assert sum("apt-get purge" in c for c in run) == 1


def test_migration_from_a_run_install_runs_its_uninstaller_first():
    files = [f"file={ds.RUN_UNINSTALLER} owner=", "runlog=550.54.14"]
    _, cmds, state = run_fake(nvidia_driver, {**BASE, "nvidia-uninstall": files},
                              {**DATA, "nvidia_driver_migrate": True})
    assert not state.failed_hosts
    run = ops(cmds)
    uninstall = next(i for i, c in enumerate(run) if f"{ds.RUN_UNINSTALLER} --silent" in c)
    driver = next(i for i, c in enumerate(run) if "cuda-drivers-580" in c and "install" in c)
    assert uninstall < driver and not any("apt-get purge" in c for c in run)
    _, cmds, state = run_fake(nvidia_driver, {**BASE, "nvidia-uninstall": files}, DATA)
    assert state.failed_hosts and not any("--silent" in c for c in ops(cmds) if "last-failure" not in c)


def test_same_source_converges_without_migration():
    cuda = dpkg("ii nvidia-driver-pinning-580 580-1", "hi cuda-drivers-580 580.159.04-1",
                "hi nvidia-driver 580.159.04-1")
    _, cmds, state = run_fake(nvidia_driver, {**BASE, "dpkg-query -W": cuda}, DATA)
    assert not state.failed_hosts
    assert not any("purge" in c or "--silent" in c for c in ops(cmds))


DEBIAN_SOURCES = ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
                  "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")


def acts(cmds) -> list[str]:
    """What the step runs: no fact reads (single or batched)."""
    return [c for c in ops(cmds) if "@@tritonfleet-fact@@" not in c]


def test_debian_source_from_bare_uses_debians_archive_pins_and_holds():
    host, cmds, state = run_fake(nvidia_driver, {**BASE, "/etc/apt/sources.list.d/*.sources": DEBIAN_SOURCES},
                                 {**DATA, "nvidia_driver_source": "debian"})
    assert not state.failed_hosts
    run = "\n".join(acts(cmds))
    assert "3bf863cc.pub" not in run and "cuda-drivers" not in run  # no NVIDIA repository
    driver = next(c for c in acts(cmds) if "apt-get" in c and " install " in c and "nvidia-driver" in c)
    for p in ("nvidia-driver", "nvidia-smi", "nvidia-persistenced", "libcuda1"):
        assert re.search(rf"\b{p}\b", driver), driver
    pin = host.connector.uploads["/etc/apt/preferences.d/tritonfleet-nvidia-driver"]
    assert "Pin: version 535.*" in pin and " nvidia-kernel-dkms " in pin and "cuda-drivers" not in pin
    assert "apt-mark hold" in run and "-e libcuda1" in run
    assert "blacklist nouveau" in host.connector.uploads["/etc/modprobe.d/blacklist-nouveau.conf"]


def test_debian_source_converged_changes_nothing():
    # nvidia-kernel-dkms: nvidia-driver's dependency (the proprietary flavour, named by the deploy too)
    installed = dpkg("hi nvidia-driver 535.309.01-0+deb12u1", "hi nvidia-kernel-dkms 535.309.01-0+deb12u1",
                     "hi nvidia-smi 535.309.01-0+deb12u1",
                     "hi libcuda1 535.309.01-0+deb12u1", "hi nvidia-persistenced 535.171.04-1~deb12u1",
                     "ii linux-headers-6.1.0-28-amd64 6.1.76-1", "ii dkms 3.0.10-8+deb12u1")
    _, cmds, state = run_fake(nvidia_driver, {**BASE, "dpkg-query -W": installed},
                              {**DATA, "nvidia_driver_source": "debian", "nvidia_persistenced": False})
    assert not state.failed_hosts
    run = "\n".join(acts(cmds))
    assert "apt-get" not in run and "apt-mark" not in run, run


def test_migration_from_cuda_to_debian_purges_nvidias_packages_and_its_repository():
    cuda = dpkg("ii nvidia-driver-pinning-580 580-1", "hi cuda-drivers-580 580.159.04-1",
                "hi nvidia-driver 580.159.04-1", "ii dkms 3.0.10-8")
    host, cmds, state = run_fake(nvidia_driver, {**BASE, "dpkg-query -W": cuda, "[ -f /etc/apt/sources.list.d/cuda.list ]":
                                                 ["mode=644 user=root group=root", "a" * 64]},
                                 {**DATA, "nvidia_driver_source": "debian", "nvidia_driver_migrate": True})
    assert not state.failed_hosts
    run = acts(cmds)
    purge = next(i for i, c in enumerate(run)
                 if "apt-get purge -y -q cuda-drivers-580 nvidia-driver nvidia-driver-pinning-580" in c)
    gone = next(i for i, c in enumerate(run) if "rm -f /etc/apt/sources.list.d/cuda.list" in c)
    driver = next(i for i, c in enumerate(run) if "--allow-downgrades nvidia-driver nvidia-kernel-dkms nvidia-smi" in c)
    assert purge < gone < driver
    assert "Pin: version 535.*" in host.connector.uploads["/etc/apt/preferences.d/tritonfleet-nvidia-driver"]


def test_debian_source_only_on_debian():
    import pytest

    from tritonfleet.settings import access as config
    with pytest.raises(config.ConfigError, match=r'nvidia_driver_source = "debian" installs Debian\'s own '
                                                 r'nvidia-driver \(debian12, debian13\), but this host is ubuntu2204'):
        run_fake(nvidia_driver, BASE, {"cuda_distro": "ubuntu2204", "nvidia_driver_source": "debian"})


# ---------------------------------------------------------------- Debian 13 (trixie): the same step, other data

TRIXIE = ["/etc/os-release", "ID=debian", 'NAME="Debian GNU/Linux"', 'VERSION_ID="13"', "VERSION_CODENAME=trixie", "---"]
TRIXIE_SOURCES = ["##FILE /etc/apt/sources.list.d/debian.sources", "Types: deb",
                  "URIs: http://mirror.example/debian", "Suites: trixie trixie-updates", "Components: main",
                  "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg", "",
                  "Types: deb", "URIs: http://mirror.example/debian-security", "Suites: trixie-security",
                  "Components: main", "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg", ""]
# trixie's nvidia-driver and what it pulls in (its mirror's index: source nvidia-graphics-drivers
# 550.163.01-2; nvidia-persistenced has its own source and revision)
TRIXIE_DRIVER = {"nvidia-driver": ["550.163.01-2"], "nvidia-kernel-dkms": ["550.163.01-2"],
                 "nvidia-smi": ["550.163.01-2"], "libcuda1": ["550.163.01-2"], "libnvidia-gpucomp": ["550.163.01-2"],
                 "nvidia-persistenced": ["550.163.01-1"], "nvidia-kernel-common": ["20240109+1"],
                 "dkms": ["3.2.2-1~deb13u1"], "nvidia-modprobe": ["570.133.07-1"]}


def test_trixies_own_driver_is_debians():
    found = ds.detect(TRIXIE_DRIVER, ["nvidia-driver"])
    assert found.source == "debian" and found.version == "550.163.01" and found.others == ()
    assert "nvidia-kernel-common" not in found.packages["debian"] and "dkms" not in found.packages["debian"]
    # trixie's nvidia-modprobe (its own source, 570) is a helper, not NVIDIA's 570 next to Debian's 550;
    # at the driver's branch (bookworm's, or NVIDIA's own) it counts with the driver as before
    assert "nvidia-modprobe" not in found.packages["debian"]
    same = ds.detect({**TRIXIE_DRIVER, "nvidia-modprobe": ["550.163.01-1"]})
    assert same.sources == ("debian",) and "nvidia-modprobe" in same.packages["debian"]
    # NVIDIA's 550 (its debian12 repository has the branch too) is told by its metapackage
    cuda = {**TRIXIE_DRIVER, "cuda-drivers-550": ["550.163.01-1"]}
    assert ds.detect(cuda).source == "cuda"


def test_debian_source_on_debian_13_installs_trixies_550_from_its_own_sources():
    from tritonfleet.host.layer import NONFREE_FILE

    host, cmds, state = run_fake(nvidia_driver, {**BASE, "ls -pdL *-release": TRIXIE,
                                                 "for f in /etc/apt/sources.list": TRIXIE_SOURCES},
                                 {"nvidia_kernel_module": "proprietary", "nvidia_driver_source": "debian"})
    assert not state.failed_hosts
    run = "\n".join(acts(cmds))
    assert "3bf863cc.pub" not in run and "cuda-drivers" not in run
    # the components are added to the host's own trixie sources (deb822), mirror and key as they are
    nonfree = host.connector.uploads[NONFREE_FILE]
    assert "Suites: trixie trixie-updates" in nonfree and "Suites: trixie-security" in nonfree
    assert "URIs: http://mirror.example/debian\n" in nonfree and "bookworm" not in nonfree
    assert "Components: contrib non-free non-free-firmware" in nonfree
    driver = next(c for c in acts(cmds) if "apt-get" in c and " install " in c and "nvidia-driver" in c)
    for p in ("nvidia-driver", "nvidia-smi", "nvidia-persistenced", "libcuda1"):
        assert re.search(rf"\b{p}\b", driver), driver
    pin = host.connector.uploads["/etc/apt/preferences.d/tritonfleet-nvidia-driver"]
    assert "Pin: version 550.*" in pin and " libnvidia-gpucomp " in pin and "cuda-drivers" not in pin


def test_cuda_source_on_debian_13_is_refused_naming_the_host_and_the_way_on():
    import pytest

    from tritonfleet.settings import access as config
    with pytest.raises(config.ConfigError) as e:
        run_fake(nvidia_driver, {**BASE, "ls -pdL *-release": TRIXIE}, {"nvidia_kernel_module": "proprietary"})
    text = str(e.value)
    assert "tritonfleet has no facts of NVIDIA's CUDA repository for debian13" in text, text
    assert 'set nvidia_driver_source = "debian" for this host (its distro\'s own driver, 550.163.01)' in text, text
    assert text.startswith("@fake/gpu1: ") and "docs/driver-sources.md" in text
