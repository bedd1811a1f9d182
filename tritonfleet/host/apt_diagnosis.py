"""What a failed apt-get, apt-mark or dpkg command means: apt's output classified into the causes
seen in the field (the report built from it: tritonfleet.host.apt_report).

Pure: ``classify`` reads the output (and exit status) of one command and names the cause, its
particulars (package, version, repository, file, process), apt's key lines, what it means and the
fix; ``apt_report.failure`` turns that into the report every failure after pre-flight uses. The
commands run in ``tritonfleet.host.ops.aptlock`` (which also waits for held locks); the messages
read are tritonfleet.host.apt_messages.

The messages are apt's and dpkg's own (English: the commands run with ``LC_ALL=C.UTF-8``). Each
rule below names the message it reads; the texts are from apt's source (Debian/apt, files named
per rule) and were captured from apt 2.6.1 on Debian 12 (tests/fixtures/apt/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..core.report import WORDS_KEEP
from .apt_messages import (
    CONFLICT_RE,
    DEPENDS_LINE_RE,
    DOWNGRADED,
    DPKG_ERROR_RE,
    DPKG_LOCK_PID_RE,
    DPKG_PROCESSING_RE,
    ENOSPC_RE,
    EXPIRED_RE,
    FETCH_RE,
    GLOB_RE,
    GPG_ERROR_RE,
    HELD_BROKEN,
    HELD_CHANGED,
    HTTP_STATUS_RE,
    INDEX_FILE_RE,
    INFO_CHANGED_RE,
    INTERRUPTED_RE,
    KEYSIG_RE,
    LOCATE_RE,
    LOCK_FILE_RE,
    LOCK_HELD_RE,
    LOCK_RE,
    MALFORMED_RE,
    MISMATCH_RE,
    NO_CANDIDATE_RE,
    NO_RELEASE_RE,
    NO_SPACE_RE,
    NOISE_RE,
    NOT_SIGNED_RE,
    OWN_RE,
    SOURCES_UNREADABLE,
    SUBPROCESS_RE,
    TYPE_RE,
    UNMET_RE,
    UNREACHABLE_RE,
    VERSION_RE,
    WAITED_RE,
)

# on the host: the whole output of the last apt command that failed (the report keeps its key lines)
APT_LOG = "/var/lib/tritonfleet/apt-last-failure.log"
GROUP_DATA = "group data (inventories/group_data/, or the inventory)"
REPO_SETTINGS = "cuda_repo_url, container_toolkit_repo_url or docker_repo_url"
KEY_SETTINGS = "cuda_repo_key_fingerprint, container_toolkit_key_fingerprint or docker_repo_key_fingerprint"


@dataclass
class AptDiagnosis:
    """What a failed apt command says. ``changed``: apt or dpkg may have changed packages before
    it stopped (otherwise apt stopped before it installed or removed anything)."""

    cause: str
    found: str
    meaning: str
    fix: str
    lines: list[str] = field(default_factory=list)
    changed: bool = False
    packages: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def output_lines(output) -> list[str]:
    text = output if isinstance(output, str) else "\n".join(output or [])
    out = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        # progress lines rewritten in place with \r: the last state is what a terminal shows
        out.append(raw.rsplit("\r", 1)[-1].rstrip())
    return out


def repo_base(url: str) -> str:
    """The repository's base URL as a source line names it, from a URL apt printed for one of its
    files ("http://h/debian/dists/bookworm/InRelease" -> "http://h/debian"; a flat repository's
    "http://h/cuda/x86_64/./Packages" -> "http://h/cuda/x86_64")."""
    url = url.strip().strip("'")
    for part in ("/dists/", "/pool/"):
        if part in url:
            return url.split(part, 1)[0].rstrip("/")
    if re.search(r"\.(?:u?deb|dsc)$", url):
        url = url.rsplit("/", 1)[0]
    if INDEX_FILE_RE.search(url):
        url = url[: INDEX_FILE_RE.search(url).start()]
    url = re.sub(r"(?:/\.)+$", "", url)
    return url.rstrip("/")


def _hostport(url: str) -> str:
    m = re.match(r"^[a-z+]+://([^/]+)", url)
    return m.group(1) if m else url


def _uniq(seq):
    seen, out = set(), []
    for x in seq:
        if x and x not in seen:
            seen.add(x)
            out.append(x)
    return out


def joined(items: list[str], most: int = 4) -> str:
    items = list(items)
    if len(items) > most:
        return ", ".join(items[:most]) + f" and {len(items) - most} more"
    return ", ".join(items)


class _Seen:
    """The output's lines, and which of them decided the cause (they always reach the report)."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        self.key: list[int] = []

    def find(self, pattern: re.Pattern | str, want_all: bool = True) -> list[tuple[int, re.Match | None]]:
        hits = []
        for i, ln in enumerate(self.lines):
            m = pattern.search(ln) if isinstance(pattern, re.Pattern) else (ln if pattern in ln else None)
            if m:
                hits.append((i, m if isinstance(m, re.Match) else None))
                if not want_all:
                    break
        return hits

    def mark(self, hits) -> None:
        self.key += [i for i, _ in hits]


def classify(output, rc: int = 100, *, waited: int | None = None, require: str = "") -> AptDiagnosis | None:
    """The cause of a failed apt/dpkg command from its output (stdout and stderr, as lines or one
    text) and exit status; None when it did not fail. ``waited``: seconds the lock wait waited (the
    bound it gave up at). ``require``: a repository URL the command must have read (the deploy's
    own ``apt-get update`` after it added that repository): apt-get update only warns, and exits 0,
    when a repository cannot be fetched; then that repository's warning is the failure."""
    lines = output_lines(output)
    seen = _Seen(lines)
    if rc == 0:
        if not require:
            return None
        base = repo_base(require)
        named = re.compile(re.escape(base) + r"(?:[/\s']|$)") if base else None
        hits = [(i, ln) for i, ln in enumerate(lines) if ln.startswith(("W: ", "E: ")) and named and named.search(ln)]
        if not hits:
            return None
        # the same classification, on the warnings about that repository alone
        d = classify([ln for _, ln in hits], 100)
        d.found = f"apt-get update could not read {base}: {d.found}"
        d.lines = _words(lines, [i for i, _ in hits])
        d.meaning += (
            " (apt-get update only warns about a repository it cannot read; the packages of that "
            "repository cannot be installed until it can)"
        )
        return d
    for rule in RULES:
        d = rule(seen, waited)
        if d is not None:
            d.lines = _words(lines, seen.key)
            return d
    return _unknown(seen, rc)


def _words(lines: list[str], key: list[int], keep: int = WORDS_KEEP) -> list[str]:
    """apt's key lines, in their order: the lines that decided the cause first, then its other
    error and warning lines; nothing of tritonfleet's own, no progress, each line once."""
    wanted = _uniq_idx(lines, key)
    rest = [
        i
        for i, ln in enumerate(lines)
        if i not in wanted
        and not OWN_RE.search(ln)
        and (ln.startswith(("E: ", "W: ", "Err:", "dpkg: ")) or DPKG_PROCESSING_RE.search(ln))
    ]
    rest = _uniq_idx(lines, rest)
    chosen = wanted[:keep] + rest[: max(0, keep - len(wanted))]
    out, texts = [], set()
    for i in sorted(chosen):
        if lines[i].strip() not in texts:
            texts.add(lines[i].strip())
            out.append(lines[i])
    return out


def _uniq_idx(lines: list[str], idx: list[int]) -> list[int]:
    seen, out = set(), []
    for i in sorted(set(idx)):
        t = lines[i].strip()
        if t and t not in seen:
            seen.add(t)
            out.append(i)
    return out


# ------------------------------------------------------------------------------------------ rules


def _lock(s: _Seen, waited: int | None) -> AptDiagnosis | None:
    hits = s.find(LOCK_RE)
    if not hits:
        return None
    s.mark(hits)
    holder = ""
    for _, m in s.find(LOCK_HELD_RE, want_all=False):
        holder = f"process {m.group(2)}" + (f" ({m.group(3)})" if m.group(3) else "")
    if not holder:
        for _, m in s.find(DPKG_LOCK_PID_RE, want_all=False):
            holder = f"process {m.group(1)}"
    # the lock file apt names ("Could not get lock <file>"), else the frontend lock or directory
    files = _uniq([m.group(1) for _, m in s.find(LOCK_FILE_RE) if m.group(1)]) or _uniq(
        [next(g for g in m.groups() if g) for _, m in s.find(LOCK_FILE_RE)]
    )
    for _, m in s.find(WAITED_RE, want_all=False):
        waited = int(m.group(1)) if waited is None else waited
    what = f"the apt/dpkg lock ({joined(files)})" if files else "the apt/dpkg lock"
    by = f"held by {holder}" if holder else "held by another process"
    found = (
        f"{what} stayed {by} for more than {waited} s (apt_lock_timeout)" if waited is not None else f"{what} is {by}"
    )
    pid = re.search(r"process (\d+)", holder)
    look = f" (`ps -o pid,etime,args -p {pid.group(1)}` on the host shows it)" if pid else ""
    return AptDiagnosis(
        "apt lock held",
        found,
        "another package manager run (unattended-upgrades, apt-daily, an operator's apt) holds apt's and dpkg's "
        "locks; apt refuses to start meanwhile and this step changed nothing",
        f"let that process finish (unattended-upgrades usually does within minutes) or stop it{look}, then run the "
        f"deploy again; apt_lock_timeout in {GROUP_DATA} sets how long a deploy waits",
        files=files,
    )


def _interrupted(s: _Seen, waited) -> AptDiagnosis | None:
    hits = s.find(INTERRUPTED_RE)
    if not hits:
        return None
    s.mark(hits)
    return AptDiagnosis(
        "dpkg interrupted",
        "an earlier dpkg run was cut off: apt refuses to install or remove anything until "
        "`dpkg --configure -a` finished it",
        "a package operation was killed, or the host lost power, in the middle of it; packages are left half installed",
        "run the deploy again: each host-layer step starts with `dpkg --configure -a` when dpkg was interrupted "
        "(by hand: `dpkg --configure -a` on the host; `dpkg --audit` lists what is left)",
    )


def _sources(s: _Seen, waited) -> AptDiagnosis | None:
    files, entries, urls = [], [], []
    for hits, kind in (
        (s.find(MALFORMED_RE), "malformed"),
        (s.find(TYPE_RE), "type"),
        (s.find(CONFLICT_RE), "conflict"),
    ):
        s.mark(hits)
        for _, m in hits:
            if kind == "malformed":
                files.append(m.group(2))
                entries.append(
                    f"entry {m.group(1)} of {m.group(2)} is malformed" + (f" ({m.group(3)})" if m.group(3) else "")
                )
            elif kind == "type":
                files.append(m.group(3))
                entries.append(f"line {m.group(2)} of {m.group(3)} has the unknown type '{m.group(1)}'")
            else:
                urls.append(repo_base(m.group(2)))
                entries.append(f"{m.group(2)} {m.group(3)} is listed twice with different {m.group(1)} values")
    unreadable = s.find(SOURCES_UNREADABLE)
    if not entries and not unreadable:
        return None
    s.mark(unreadable)
    files, urls = _uniq(files), _uniq(urls)
    where = (
        joined(files)
        if files
        else "the file that lists it (found below)"
        if urls
        else "/etc/apt/sources.list or /etc/apt/sources.list.d/"
    )
    return AptDiagnosis(
        "apt sources unreadable",
        "apt cannot read the host's sources: " + ("; ".join(entries) or "the list of sources could not be read"),
        "apt reads every sources file before it does anything; one bad entry stops every apt command on the host"
        + (
            " (the same repository listed twice with two keyrings: often an older entry from a vendor's install "
            "guide next to the deploy's own, or a key rotation)"
            if urls
            else ""
        ),
        f"correct or remove that entry in {where} (one entry per repository, one signed-by keyring each), then run "
        "the deploy again",
        files=files,
        urls=urls,
    )


def _disk(s: _Seen, waited) -> AptDiagnosis | None:
    hits = s.find(NO_SPACE_RE)
    enospc = s.find(ENOSPC_RE)
    if not hits and not enospc:
        return None
    s.mark(hits + enospc)
    where = hits[0][1].group(1) if hits else ""
    found = (
        f"not enough free space in {where} for the packages to download"
        if where
        else f"the disk filled while packages were written ({s.lines[enospc[0][0]].strip()})"
    )
    return AptDiagnosis(
        "disk full",
        found,
        "apt checks the space for the download first (then it changed nothing); a disk that fills while dpkg "
        "unpacks leaves that package half installed",
        f"free space on the host (`df -h {where or '/ /var'}`; `apt-get clean` drops downloaded packages), then run "
        "the deploy again",
        changed=not hits,
        files=[where] if where else [],
    )


def _expired(s: _Seen, waited) -> AptDiagnosis | None:
    hits = s.find(EXPIRED_RE)
    changed = s.find(INFO_CHANGED_RE)
    if not hits and not changed:
        return None
    s.mark(hits + changed)
    if hits:
        m = hits[0][1]
        url = m.group(1)
        return AptDiagnosis(
            "repository metadata out of date",
            f"the Release file of {url} is {m.group(2)} ({m.group(3)})",
            "apt refuses a repository whose signed metadata is past its Valid-Until date, or dated in the future: the "
            "host's clock is wrong, or the mirror has stopped syncing",
            "check the host's clock (`timedatectl`) and the mirror (`apt-get update` on the host), then run the "
            "deploy again",
            urls=[repo_base(url)],
        )
    m = changed[0][1]
    return AptDiagnosis(
        "repository changed its release information",
        f"repository {m.group(1)} changed its '{m.group(2)}' from '{m.group(3)}' to '{m.group(4)}'",
        "apt stops using a repository whose signed identity changed until an operator accepts it (a new release "
        "of the distribution, or a source pointing at another repository)",
        "check that the source still points where it should; if the change is expected, accept it on the host "
        "(`apt-get update --allow-releaseinfo-change`), then run the deploy again",
        urls=[repo_base(m.group(1))],
    )


def _gpg(s: _Seen, waited) -> AptDiagnosis | None:
    gpg = s.find(GPG_ERROR_RE)
    unsigned = s.find(NOT_SIGNED_RE)
    keysig = s.find(KEYSIG_RE)
    if not gpg and not unsigned and not (keysig and s.find("signatures")):
        return None
    s.mark(gpg + unsigned)
    urls = _uniq([repo_base(m.group(1)) for _, m in gpg] + [repo_base(m.group(1)) for _, m in unsigned])
    sigs = _uniq([f"{m.group(1)} {m.group(2)}" for _, m in keysig])
    kinds = {sig.split()[0] for sig in sigs}
    if "NO_PUBKEY" in kinds:
        why = (
            "the key that signs it is not in the keyring its source names (signed-by): the vendor rotated its "
            "key (NVIDIA did in 2022), the keyring file is missing or stale, or the source names another keyring"
        )
    elif kinds & {"EXPKEYSIG", "EXPSIG"}:
        why = "the key that signs it has expired in the host's keyring: the vendor extended or replaced it"
    elif kinds & {"BADSIG"}:
        why = (
            "the signature does not match the data: a proxy or mirror changed the files, or a mirror is in the "
            "middle of a sync"
        )
    elif kinds & {"REVKEYSIG"}:
        why = "the key that signs it was revoked"
    else:
        why = "apt found no valid signature for it"
    return AptDiagnosis(
        "repository signature",
        f"repository {joined(urls) or '(named below)'} is not signed by a key the host trusts"
        + (f" ({joined(sigs)})" if sigs else ""),
        f"apt refuses a repository it cannot verify; {why}",
        "compare the key the vendor publishes now with the fingerprint pinned for that repository "
        f"({KEY_SETTINGS} in {GROUP_DATA}) and with the keyring the source's signed-by names (file below); then run "
        "the deploy again (it fetches the key and checks it against the pinned fingerprint)",
        urls=urls,
    )


def _fetches(s: _Seen) -> list[tuple[int, str, str]]:
    """(line, url, reason) of every "Failed to fetch" line; the reason follows on the line."""
    out = []
    for i, m in s.find(FETCH_RE):
        out.append((i, m.group(1), m.group(2).strip()))
    return out


def _missing_repository(s: _Seen, waited) -> AptDiagnosis | None:
    norel = s.find(NO_RELEASE_RE)
    index404 = [
        (i, url, why)
        for i, url, why in _fetches(s)
        if INDEX_FILE_RE.search(url)
        and HTTP_STATUS_RE.match(why)
        and HTTP_STATUS_RE.match(why).group(1) in ("404", "403", "410")
    ]
    if not norel and not index404:
        return None
    s.mark(norel + [(i, None) for i, _, _ in index404])
    urls = _uniq([repo_base(m.group(1)) for _, m in norel] + [repo_base(u) for _, u, _ in index404])
    said = _uniq([" ".join(HTTP_STATUS_RE.match(w).group(1, 2)) for _, _, w in index404])
    return AptDiagnosis(
        "repository not found",
        f"there is no repository at {joined(urls)}" + (f" ({joined(said)})" if said else " (no Release file)"),
        "the server answers, but has no apt repository at that URL: a wrong distro or architecture in the URL, or "
        "a repository the vendor moved or removed",
        f"correct the URL ({REPO_SETTINGS} in {GROUP_DATA}, or the entry in the sources file below), then run the "
        "deploy again",
        urls=urls,
    )


def _unreachable(s: _Seen, waited) -> AptDiagnosis | None:
    fetch = [(i, url, why) for i, url, why in _fetches(s) if UNREACHABLE_RE.search(why)]
    other = [] if fetch else [(i, m) for i, m in s.find(UNREACHABLE_RE) if s.lines[i].startswith(("E: ", "W: "))]
    if not fetch and not other:
        return None
    s.mark([(i, None) for i, _, _ in fetch] + other)
    urls = _uniq([repo_base(u) for _, u, _ in fetch])
    hosts = _uniq([_hostport(u) for u in urls])
    reasons = _uniq(
        [UNREACHABLE_RE.search(w).group(0).rstrip(":") for _, _, w in fetch]
        + [m.group(0).rstrip(":") for _, m in other]
    )
    detail = [s.lines[i] for i, _, _ in fetch[:1]] or [s.lines[i] for i, _ in other[:1]]
    said = re.search(r"\((\d+: [^)]*)\)", detail[0]) if detail else None
    return AptDiagnosis(
        "repository unreachable",
        f"the host cannot reach {joined(hosts) or 'a repository'}" + f" ({said.group(1) if said else joined(reasons)})",
        "the network between the host and that repository, a proxy, a firewall or DNS failed, or the mirror is down; "
        "nothing was installed",
        "check from the host (`apt-get update`; `curl -sI <the URL above>`); behind a proxy or air-gapped, point apt "
        "at the proxy or a local mirror (apt.conf.d, or the repository URLs in "
        f"{GROUP_DATA}); then run the deploy "
        "again",
        urls=urls,
    )


def _download(s: _Seen, waited) -> AptDiagnosis | None:
    fetch = _fetches(s)
    mismatch = s.find(MISMATCH_RE)
    archives = s.find("Unable to fetch some archives")
    if not fetch and not mismatch and not archives:
        return None
    s.mark([(i, None) for i, _, _ in fetch] + mismatch + archives)
    files = _uniq([u.rsplit("/", 1)[-1] for _, u, _ in fetch])
    why = fetch[0][2] if fetch else (s.lines[mismatch[0][0]].strip() if mismatch else "")
    why = " ".join(re.sub(r"\s*\[IP: [^\]]*\]", "", why).split())
    return AptDiagnosis(
        "package download failed",
        f"downloading {joined(files) or 'packages'} failed" + (f" ({why})" if why else ""),
        "the package lists on the host name a file the mirror no longer has, or that differs from what the lists "
        "say (the lists are older than the mirror, a mirror is in the middle of a sync, or a proxy cache is stale)",
        "run `apt-get update` on the host (or wait a few minutes for a mirror that is syncing), then run the deploy "
        "again",
        urls=_uniq([repo_base(u) for _, u, _ in fetch]),
    )


def _held(s: _Seen, waited) -> AptDiagnosis | None:
    broken = s.find(HELD_BROKEN)
    changed = s.find(HELD_CHANGED)
    downgraded = s.find(DOWNGRADED)
    unmet = s.find(UNMET_RE)
    if not (broken or changed or downgraded or unmet):
        return None
    s.mark(broken + changed + downgraded + unmet)
    deps = []
    for i, ln in enumerate(s.lines):
        if DEPENDS_LINE_RE.search(ln) and any(j < i for j, _ in unmet):
            deps.append(i)
    s.mark([(i, None) for i in deps[:8]])
    held = []
    for i, ln in enumerate(s.lines):
        if ln.startswith("The following held packages will be changed"):
            j = i + 1
            while j < len(s.lines) and s.lines[j].startswith(" "):
                held += s.lines[j].split()
                s.key.append(j)
                j += 1
            s.key.append(i)
    pkgs = _uniq([m.group(1) for m in (DEPENDS_LINE_RE.search(s.lines[i]) for i in deps) if m and m.group(1)])
    shown = "; ".join(" ".join(s.lines[i].split()) for i in deps[:2])
    if downgraded and not (broken or changed or unmet):
        return AptDiagnosis(
            "downgrade refused",
            "the install would downgrade packages and apt-get was not allowed to",
            "a pinned version older than the installed one",
            "allow the downgrade for that step, or pin the installed version; then run the deploy again",
        )
    if changed or broken:
        found = (
            f"installing would change held packages ({joined(held)})"
            if changed
            else "apt cannot satisfy the dependencies without changing held packages" + (f": {shown}" if shown else "")
        )
        return AptDiagnosis(
            "held packages",
            found,
            "a package held with apt-mark (tritonfleet holds the driver's packages at their branch) stands in the way: "
            "the usual cause is a driver branch or version change while the other branch is held, or a package "
            "pinned by hand",
            "see the holds with `apt-mark showhold` on the host; set nvidia_driver_branch / nvidia_driver_version "
            f"in {GROUP_DATA} to what should be installed (a deploy moves its own holds), or release a hold set by hand "
            "(`apt-mark unhold <package>`); then run the deploy again",
            packages=_uniq(held + pkgs),
        )
    return AptDiagnosis(
        "unmet dependencies",
        "apt cannot satisfy the packages' dependencies" + (f": {shown}" if shown else ""),
        "the repositories on the host do not carry a consistent set: a package's dependency at the required version "
        "is missing (a pin to a version the repository lacks, a repository missing from the sources), or dpkg "
        "left packages broken",
        "on the host, `apt-get install -s <the packages>` shows the conflict and `apt-get --fix-broken install` "
        "repairs broken packages; align the pinned versions in "
        f"{GROUP_DATA}; then run the deploy again",
        packages=pkgs,
    )


def _version(s: _Seen, waited) -> AptDiagnosis | None:
    hits = s.find(VERSION_RE)
    if not hits:
        return None
    s.mark(hits)
    pkgs = _uniq([m.group(3) for _, m in hits])
    by_version: dict[tuple[str, str], list[str]] = {}
    for _, m in hits:
        by_version.setdefault((m.group(1), m.group(2)), [])
        if m.group(3) not in by_version[(m.group(1), m.group(2))]:
            by_version[(m.group(1), m.group(2))].append(m.group(3))
    # one package: "p=v"; several at one version (a pinned set): "v of p1, p2, ..."
    asked = [
        (f"{names[0]}={v}" if kind == "Version" else f"{names[0]}/{v}")
        if len(names) == 1
        else f"{'release' if kind == 'Release' else 'version'} {v} of {joined(names)}"
        for (kind, v), names in by_version.items()
    ]
    return AptDiagnosis(
        "version not available",
        f"{'; '.join(asked)}: not in the host's package lists",
        "the version pinned for it is not in any repository the host reads: the repository no longer carries "
        "that version (or never did, for this distro), or apt-get update could not read the repository",
        "`apt-cache madison " + " ".join(pkgs) + "` on the host lists the versions there; set {setting} in "
        f"{GROUP_DATA} to one of them, then run the deploy again",
        packages=pkgs,
    )


def _unknown_package(s: _Seen, waited) -> AptDiagnosis | None:
    locate = s.find(LOCATE_RE) + s.find(GLOB_RE)
    nocand = s.find(NO_CANDIDATE_RE)
    if not locate and not nocand:
        return None
    s.mark(locate + nocand)
    missing = _uniq([m.group(1) for _, m in locate])
    nocands = _uniq([m.group(1) for _, m in nocand])
    parts = []
    if missing:
        parts.append(f"no repository of the host offers {joined(missing)}")
    if nocands:
        parts.append(
            f"{joined(nocands)} {'has' if len(nocands) == 1 else 'have'} no installation candidate "
            "(only other packages refer to it)"
        )
    return AptDiagnosis(
        "package not available",
        "; ".join(parts),
        "the repository that carries it is not in the host's sources, apt-get update could not read it, or the "
        "name is not right for this distro, architecture or driver branch",
        "on the host, `apt-cache policy " + " ".join(missing + nocands) + "` shows which repositories offer it and "
        "`apt-get update` whether every repository can be read; check the repository in the host's sources and "
        "{setting} in "
        f"{GROUP_DATA}; then run the deploy again",
        packages=missing + nocands,
    )


def _dpkg(s: _Seen, waited) -> AptDiagnosis | None:
    processing = s.find(DPKG_PROCESSING_RE)
    sub = [(i, m) for i, m in s.find(SUBPROCESS_RE) if "dpkg" in m.group(1)]
    errors = s.find(DPKG_ERROR_RE)
    if not processing and not sub and not errors:
        return None
    s.mark(processing + sub + errors)
    pkgs = _uniq([m.group(1) for _, m in processing])
    reasons = []
    for i, _ in processing:
        # the line after "dpkg: error processing ..." says why; the package's own words come before it
        if i + 1 < len(s.lines) and s.lines[i + 1].startswith(" "):
            s.key.append(i + 1)
            reasons.append(s.lines[i + 1].strip())
        j = i - 1
        own = []
        while (
            j >= 0
            and len(own) < 6
            and not NOISE_RE.search(s.lines[j])
            and not s.lines[j].startswith(("E: ", "W: ", "dpkg: "))
        ):
            if s.lines[j].strip():
                own.append(j)
            j -= 1
        s.key += own
    if pkgs:
        found = f"dpkg failed on {joined(pkgs)}" + (f": {reasons[0]}" if reasons else "")
    else:
        found = " ".join(s.lines[(processing + sub + errors)[0][0]].split())
    return AptDiagnosis(
        "dpkg error",
        found,
        "a package's maintainer script (or dpkg itself) failed: that package is unpacked but not configured, and "
        "apt refuses further installs until it is",
        "read the package's own words above (all of them: /var/log/dpkg.log and the apt output kept on the host); "
        "fix their cause, or remove the package (`dpkg --remove <package>`); the next deploy runs "
        "`dpkg --configure -a` first",
        changed=True,
        packages=pkgs,
    )


def _unknown(s: _Seen, rc: int) -> AptDiagnosis:
    errors = s.find(re.compile(r"^E: "))
    if errors:
        s.mark(errors[:1])
        first = s.lines[errors[0][0]][3:].strip()
    else:
        tail = [i for i, ln in enumerate(s.lines) if ln.strip() and not OWN_RE.search(ln)]
        s.key += tail[-3:]
        first = s.lines[tail[-1]].strip() if tail else f"exit status {rc}, no output"
    d = AptDiagnosis(
        "apt failed",
        first,
        "apt failed for a reason tritonfleet does not recognise; it may have changed packages before it stopped",
        "read apt's words above (all of its output is kept on the host, below); `dpkg --audit` and "
        "/var/log/apt/history.log on the host show what changed; fix the cause, then run the deploy again",
        changed=True,
    )
    d.lines = _words(s.lines, s.key)
    return d


# the order is the precedence: a lock or an interrupted dpkg hides everything else; a source that
# cannot be read comes before what apt would then fail to fetch, and so on
RULES = [
    _lock,
    _interrupted,
    _sources,
    _disk,
    _expired,
    _gpg,
    _missing_repository,
    _unreachable,
    _download,
    _held,
    _version,
    _unknown_package,
    _dpkg,
]

CAUSES = [
    "apt lock held",
    "dpkg interrupted",
    "apt sources unreadable",
    "disk full",
    "repository metadata out of date",
    "repository changed its release information",
    "repository signature",
    "repository not found",
    "repository unreachable",
    "package download failed",
    "downgrade refused",
    "held packages",
    "unmet dependencies",
    "version not available",
    "package not available",
    "dpkg error",
    "apt failed",
]
