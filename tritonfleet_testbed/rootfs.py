"""Debian root filesystems for the testbed, built with debootstrap and cached as tar.zst.

The Debian mirror is never written down here: it is read from this machine's own apt
configuration, and that configuration is copied into every root filesystem so the test
hosts use the same mirror as the machine that built them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("TRITONFLEET_CACHE", "/var/cache/tritonfleet"))
SUITE = "bookworm"  # the default: `tritonfleet testbed up` without --distro
# The Debian releases the testbed builds hosts of: suite -> the release's name in tritonfleet's
# data (tritonfleet/data/distro_archives/<name>-archive.toml) and the testbed inventory's group.
SUITES = {"bookworm": "debian12", "trixie": "debian13"}


@dataclass(frozen=True)
class Mirror:
    uri: str
    suite: str
    components: tuple[str, ...]


def _deb822_stanzas(text: str):
    stanza: dict[str, str] = {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if stanza:
                yield stanza
            stanza = {}
            continue
        if line.startswith("#"):
            continue
        if ":" in line and not line[0].isspace():
            key, _, value = line.partition(":")
            stanza[key.strip().lower()] = value.strip()
    return


def parse_apt_sources(files: dict[str, str]) -> list[Mirror]:
    """Parse sources.list and deb822 .sources texts ({file name: text}) into mirrors."""
    mirrors: list[Mirror] = []
    for name, text in files.items():
        if name.endswith(".sources"):
            for st in _deb822_stanzas(text):
                if "deb" not in st.get("types", "").split():
                    continue
                if st.get("enabled", "yes").lower() == "no":
                    continue
                comps = tuple(st.get("components", "main").split())
                for uri in st.get("uris", "").split():
                    for suite in st.get("suites", "").split():
                        mirrors.append(Mirror(uri.rstrip("/"), suite, comps))
        else:
            for line in text.splitlines():
                line = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(line) >= 3 and line[0] == "deb":
                    mirrors.append(Mirror(line[1].rstrip("/"), line[2], tuple(line[3:])))
    return mirrors


def read_apt_sources(root: Path = Path("/")) -> dict[str, str]:
    out: dict[str, str] = {}
    main = root / "etc/apt/sources.list"
    if main.exists():
        out[str(main)] = main.read_text()
    d = root / "etc/apt/sources.list.d"
    if d.is_dir():
        for p in sorted(d.iterdir()):
            if p.suffix in (".list", ".sources") and p.is_file():
                out[str(p)] = p.read_text()
    return out


def _archive(m: Mirror) -> bool:
    """A Debian main archive source of a release itself (not -updates, -security, -backports)."""
    return "main" in m.components and "security" not in m.uri and "-" not in m.suite


def debian_mirror(suite: str = SUITE) -> Mirror:
    """The mirror this machine's apt uses for Debian ``suite`` (main archive, not security). A
    suite the machine's apt does not name is taken from the same archive as the release it does
    name (one Debian archive serves every release: dists/<suite>/)."""
    mirrors = parse_apt_sources(read_apt_sources())
    for m in mirrors:
        if m.suite == suite and "main" in m.components and "security" not in m.uri:
            return m
    for m in mirrors:
        if _archive(m):
            return Mirror(m.uri, suite, m.components)
    raise RuntimeError(
        f"no apt source for Debian {suite} main found in /etc/apt/sources.list(.d); "
        "the testbed uses this machine's own Debian mirror"
    )


def machine_suite() -> str | None:
    """The Debian release this machine's own apt sources name (its main archive's suite)."""
    return next((m.suite for m in parse_apt_sources(read_apt_sources()) if _archive(m)), None)


def retarget_suites(text: str, name: str, old: str, new: str) -> str:
    """apt source text ``name`` (one-line .list or deb822 .sources) with release ``old``'s suites
    (``old``, ``old-updates``, ``old-security``, ...) renamed to ``new``'s; other lines unchanged."""
    word = re.compile(rf"(?<![\w.-]){re.escape(old)}(?=(-[a-z]+)?(\s|$))")
    out = []
    for line in text.splitlines(keepends=True):
        if name.endswith(".sources"):
            if line.lower().startswith("suites:"):
                key, _, rest = line.partition(":")
                line = f"{key}:{word.sub(new, rest)}"
        elif line.lstrip().startswith("deb"):
            line = word.sub(new, line)
        out.append(line)
    return "".join(out)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    return subprocess.run(cmd, **kw)


def debootstrap(target: Path, include: list[str], variant: str = "minbase", suite: str = SUITE) -> None:
    """debootstrap ``suite`` into ``target`` from this machine's mirror, then copy its apt setup."""
    mirror = debian_mirror(suite)
    target.mkdir(parents=True, exist_ok=True)
    run(
        [
            "debootstrap",
            f"--variant={variant}",
            "--include=" + ",".join(include),
            suite,
            str(target),
            mirror.uri,
        ],
        stdout=subprocess.DEVNULL,
    )
    copy_apt_config(target, suite)


def copy_apt_config(target: Path, suite: str = SUITE) -> None:
    """Give ``target`` this machine's apt sources and apt.conf.d (same mirror, same options); for
    another release than the machine's own, its sources name ``suite``'s suites instead."""
    for sub in ("etc/apt/sources.list.d", "etc/apt/apt.conf.d"):
        src = Path("/") / sub
        if src.is_dir():
            dst = target / sub
            dst.mkdir(parents=True, exist_ok=True)
            for p in src.iterdir():
                if p.is_file() and not p.name.endswith(".disabled-by-farm"):
                    if sub.endswith("sources.list.d") and p.suffix not in (".list", ".sources"):
                        continue
                    shutil.copy2(p, dst / p.name)
    main = Path("/etc/apt/sources.list")
    dst = target / "etc/apt/sources.list"
    if main.exists():
        shutil.copy2(main, dst)
    elif dst.exists() and (target / "etc/apt/sources.list.d").glob("*.sources"):
        dst.unlink()
    own = machine_suite()
    if own and own != suite:
        for name, text in read_apt_sources(target).items():
            Path(name).write_text(retarget_suites(text, name, own, suite))
    # keyrings named by Signed-By in the copied sources
    for text in read_apt_sources(target).values():
        for m in re.finditer(r"(?:Signed-By:|signed-by=)\s*(/\S+?)(?:\]|\s|$)", text):
            key = Path(m.group(1))
            if key.exists() and not (target / key.relative_to("/")).exists():
                (target / key.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(key, target / key.relative_to("/"))


def cached_tarball(name: str, recipe: str, build) -> Path:
    """Return CACHE/<name>-<hash(recipe)>.tar.zst, building it with ``build(dir)`` when missing."""
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    out = CACHE / f"{name}-{digest}.tar.zst"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    # two testbed instances coming up at once (the suite's parts) build it once: the second
    # waits for the first and finds the tarball made
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out
        return _build_tarball(out, CACHE / f".build-{name}-{digest}", build)


def _build_tarball(out: Path, work: Path, build) -> Path:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    try:
        build(work)
        tmp = out.with_suffix(".tmp")
        run(["tar", "--zstd", "-C", str(work), "-cpf", str(tmp), "."])
        tmp.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def extract(tarball: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    run(["tar", "--zstd", "-C", str(dest), "-xpf", str(tarball)])
