"""What public sources show of NVIDIA's CUDA repositories, per distro (tritonfleet/data/nvidia_repos/).

Parse only: the files hold facts with their sources; this module reads them and answers
questions about one repository (which branches it has, what a branch's packages are called, the
shape of their versions, whether the branch has NVIDIA's pinning package). The deploy decides
with the answers (host_layer.py, steps/host_prep.py, preflight.py); the testbed builds its stand-in repository
from the same facts (tritonfleet_testbed/standin_repo.py).

``python -m tritonfleet.host.nvidia_repos`` prints the per-distro table and what is not confirmed.
"""

from __future__ import annotations

import re
from functools import cache

from .. import resource
from ..core.errors import UsageError

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

DATA = resource("data", "nvidia_repos")
DISTROS = ("ubuntu2204", "ubuntu2404", "ubuntu2604", "debian12")
# a distro's own archive as a driver source (nvidia_driver_source = "debian"): same questions,
# answered from data/distro_archives/<name>.toml
ARCHIVES = resource("data", "distro_archives")
DEBIAN_ARCHIVE = "debian12-archive"


def archives() -> tuple[str, ...]:
    """Every distro archive tritonfleet has facts of ("debian12-archive", "debian13-archive")."""
    return tuple(sorted(p.stem for p in ARCHIVES.glob("*.toml")))


def archive_of(distro: str) -> str | None:
    """The facts of ``distro``'s own archive as a driver source ("debian13" -> "debian13-archive"),
    or None where tritonfleet has none."""
    name = f"{distro}-archive"
    return name if name in archives() else None


class UnknownDistro(UsageError, ValueError):
    pass


@cache
def load(name: str) -> dict:
    """The file ``name`` (a distro, or "common"): {"distro", "family", "facts": {key: fact}}."""
    path = DATA / f"{name}.toml"
    if not path.is_file() and (ARCHIVES / f"{name}.toml").is_file():
        path = ARCHIVES / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(DISTROS)
        raise UnknownDistro(
            f"no facts about NVIDIA's CUDA repository for {name!r} (known: {known}; "
            f"they live in {DATA.relative_to(DATA.parents[2])}/<distro>.toml)"
        )
    raw = tomllib.loads(path.read_text())
    facts = {}
    for f in raw.get("fact", []):
        facts[f["key"]] = f
    return {"distro": raw.get("distro"), "family": raw.get("family"), "facts": facts, "path": path}


def value(name: str, key: str):
    return load(name)["facts"][key]["value"]


def family(distro: str) -> str:
    return load(distro)["family"]


def branches(distro: str) -> list[str]:
    """Driver branches NVIDIA's repository for ``distro`` has (oldest first)."""
    return sorted((str(b) for b in value(distro, "branches")), key=int)


def release(distro: str, branch: str) -> str | None:
    """A real release of ``branch`` (upstream version), when the facts name one."""
    return value(distro, "releases").get(str(branch))


def _unversioned(distro: str, branch: str) -> bool:
    meta = value(distro, "metapackage")
    return int(branch) >= int(meta["unversioned_from"])


def metapackage(distro: str, branch: str, flavour: str = "proprietary") -> str:
    """The package that installs the driver of ``branch`` with the kernel modules of ``flavour``
    (proprietary: cuda-drivers-<branch>; open: nvidia-open-<branch>; from 590 unversioned)."""
    meta = value(distro, "metapackage")
    if flavour == "open":  # a distro archive's one metapackage takes either flavour (Debian's nvidia-driver)
        meta = value(distro, "open_flavour").get("metapackage", meta)
    if _unversioned(distro, branch):
        return meta["unversioned"]
    return meta["template"].format(branch=branch)


def pinning_package(distro: str, branch: str) -> str | None:
    """NVIDIA's pinning package for ``branch``, or None where the repository has none (known)."""
    pin = value(distro, "pinning_package")
    if int(branch) < int(pin["from_branch"]):
        return None
    return pin["template"].format(branch=branch)


def pinning_packages(distro: str) -> list[str]:
    """Every pinning package the repository has (one per branch that has one)."""
    return [p for b in branches(distro) if (p := pinning_package(distro, b))]


def install_with(distro: str) -> list[str]:
    """Packages named next to the metapackage (a distro archive's tools), where the facts say so."""
    facts = load(distro)["facts"]
    return list(facts["install_with"]["value"]) if "install_with" in facts else []


def _name(distro: str, branch: str, template: str) -> str:
    if "{branch}" in template and _unversioned(distro, branch):
        template = template.replace("-{branch}", "")
    return template.format(branch=branch)


def driver_packages(distro: str, branch: str, flavour: str = "proprietary") -> list[str]:
    """The driver's package set for ``branch`` with ``flavour``'s kernel modules, metapackage first."""
    replaces = value(distro, "open_flavour")["replaces"] if flavour == "open" else {}
    names = [_name(distro, branch, replaces.get(t, t)) for t in value(distro, "driver_packages")]
    return [metapackage(distro, branch, flavour), *names]


def flavour_packages(distro: str, branch: str, flavour: str) -> list[str]:
    """The packages only ``flavour`` has (metapackage first): what moves when a host switches."""
    meta, *names = driver_packages(distro, branch, flavour)
    other = set(driver_packages(distro, branch, "open" if flavour == "proprietary" else "proprietary"))
    # the metapackage stays first even where both flavours share it (Debian's nvidia-driver)
    return [meta, *(p for p in names if p not in other)]


def all_driver_packages(distro: str) -> list[str]:
    """The driver's packages of every branch and both flavours of the repository (for holds and
    pins across a switch)."""
    seen: dict[str, None] = {}
    for b in branches(distro):
        for flavour in ("proprietary", "open"):
            for p in driver_packages(distro, b, flavour):
                seen.setdefault(p)
    return list(seen)


def version_shape(distro: str) -> dict:
    """{"metapackage": regex, "driver": regex, "example": version} of this repository's versions."""
    return value(distro, "version_shape")


def version_matches(distro: str, version: str, which: str = "metapackage") -> bool:
    return re.fullmatch(version_shape(distro)[which], str(version)) is not None


def apt_components(distro: str) -> dict:
    """{"needed": [components of the distro's own archive], "packages": [to install first]}."""
    return value(distro, "apt_components")


def not_driver_packages(distro: str) -> list[str]:
    return list(value(distro, "not_driver_packages"))


def unconfirmed(name: str) -> list[tuple[str, str]]:
    """(key, note) of every fact of ``name`` marked confirmed = false."""
    return [(k, f.get("note", "")) for k, f in load(name)["facts"].items() if not f.get("confirmed")]


def table() -> str:
    rows = [
        "| distro | branches in NVIDIA's repository | metapackage | pinning package | version shape (driver) |",
        "|---|---|---|---|---|",
    ]
    for d in DISTROS:
        bs = branches(d)
        pin = value(d, "pinning_package")
        rows.append(
            f"| {d} | {bs[0]}-{bs[-1]} ({', '.join(bs)}) | `{value(d, 'metapackage')['template']}` "
            f"(from {value(d, 'metapackage')['unversioned_from']}: `cuda-drivers`) | "
            f"`{pin['template']}` from {pin['from_branch']} | `{version_shape(d)['example']}` |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
    for name in (*DISTROS, *archives(), "common"):
        for key, note in unconfirmed(name):
            print(f"- {name} {key}: {' '.join(note.split())}")
