"""The facts about NVIDIA's real repositories (tritonfleet/data/nvidia_repos/): every fact names a
source, what is not confirmed says so, and the answers the deploy uses follow from them."""

from __future__ import annotations

import re

import pytest

from tritonfleet import ROOT
from tritonfleet.host import nvidia_repos as vendorfacts
from tritonfleet.host.nvidia_repos import DATA, DISTROS

FILES = sorted(p.stem for p in DATA.glob("*.toml"))
URL = re.compile(r"^https://[a-z0-9.-]+\.[a-z]{2,}/\S*$")


def test_one_file_per_distro_and_common():
    assert set(FILES) == {*DISTROS, "common"}


@pytest.mark.parametrize("name", FILES)
def test_every_fact_names_a_source(name):
    facts = vendorfacts.load(name)["facts"]
    assert facts, f"{name}: no facts"
    for key, fact in facts.items():
        sources = fact.get("source")
        assert sources, f"{name}.{key}: no source"
        sources = [sources] if isinstance(sources, str) else sources
        for s in sources:
            # a public address, or a file of this repository that names its own source
            assert URL.match(s) or (ROOT / s).is_file(), f"{name}.{key}: source {s!r} is neither a URL nor a file here"
        assert isinstance(fact.get("confirmed"), bool), f"{name}.{key}: say whether it is confirmed"
        assert "value" in fact, f"{name}.{key}: no value"
        if not fact["confirmed"]:
            assert len(fact.get("note", "")) > 40, f"{name}.{key}: unconfirmed, the note must say what is not known"


def test_every_distro_answers_the_same_questions():
    keys = [set(vendorfacts.load(d)["facts"]) for d in DISTROS]
    assert all(k == keys[0] for k in keys)


def test_debian12_has_no_r535_ubuntu2204_starts_at_515():
    assert "535" not in vendorfacts.branches("debian12")
    assert vendorfacts.branches("debian12")[0] == "545"
    assert vendorfacts.branches("ubuntu2204")[0] == "515" and "535" in vendorfacts.branches("ubuntu2204")


@pytest.mark.parametrize("distro", DISTROS)
def test_package_names_per_branch(distro):
    pkgs = vendorfacts.driver_packages(distro, "580")
    assert pkgs[0] == "cuda-drivers-580"
    assert vendorfacts.pinning_package(distro, "580") == "nvidia-driver-pinning-580"
    assert vendorfacts.pinning_package(distro, "570") is None
    new = vendorfacts.driver_packages(distro, "590")
    assert new[0] == "cuda-drivers" and not any("590" in p for p in new)
    if vendorfacts.family(distro) == "ubuntu":
        assert "nvidia-driver-580" in pkgs and "libnvidia-compute-580" in pkgs
        assert "libnvidia-compute" in new
    else:
        assert {"nvidia-driver", "firmware-nvidia-gsp", "libglx-nvidia0", "libnvoptix1"} <= set(pkgs)
        assert vendorfacts.driver_packages(distro, "570")[1:] == pkgs[1:]  # one name set for all branches
    assert not set(vendorfacts.not_driver_packages(distro)) & set(vendorfacts.all_driver_packages(distro))


def test_version_shapes():
    assert vendorfacts.version_matches("debian12", "580.159.04-1", "driver")
    assert not vendorfacts.version_matches("ubuntu2204", "535.183.01-1", "driver")
    assert vendorfacts.version_matches("ubuntu2204", "535.104.12-0ubuntu1", "driver")
    assert vendorfacts.version_matches("ubuntu2204", "535.104.12-1", "metapackage")
    # Ubuntu 26.04: NVIDIA builds <upstream>-1ubuntu1 there (595.71.05-1ubuntu1)
    assert vendorfacts.version_matches("ubuntu2604", "595.71.05-1ubuntu1", "driver")
    assert vendorfacts.version_shape("ubuntu2604")["example"] == "595.71.05-1ubuntu1"


def test_ubuntu2604_has_only_r595_with_unversioned_names():
    assert vendorfacts.branches("ubuntu2604") == ["595"]
    assert vendorfacts.release("ubuntu2604", "595") == "595.71.05"
    pkgs = vendorfacts.driver_packages("ubuntu2604", "595")
    assert pkgs[0] == "cuda-drivers" and {"libnvidia-compute", "libnvidia-cfg1", "nvidia-firmware"} <= set(pkgs)
    assert not any("595" in p for p in pkgs)
    assert vendorfacts.driver_packages("ubuntu2604", "595", "open")[:2] == ["nvidia-open", "nvidia-driver-open"]


def test_unknown_distro_names_the_known_ones():
    with pytest.raises(vendorfacts.UnknownDistro, match="ubuntu2204, ubuntu2404, ubuntu2604, debian12"):
        vendorfacts.load("ubuntu1804")


def test_docs_show_the_current_table_and_every_unconfirmed_fact():
    doc = (ROOT / "docs" / "nvidia-repositories.md").read_text()
    assert vendorfacts.table() in doc, "regenerate the table: python -m tritonfleet.host.nvidia_repos"
    for name in (*DISTROS, "common"):
        for key, _ in vendorfacts.unconfirmed(name):
            assert f"**{name} `{key}`**" in doc, f"docs/nvidia-repositories.md does not list {name} {key} as unconfirmed"
