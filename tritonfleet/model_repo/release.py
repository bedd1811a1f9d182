"""Model repository releases on a host: what to send, what to hard link, and the shell that
builds a release and switches to it. Pure functions; the operation is tritonfleet.model_repo.ops.

On the host (``base`` = triton_base_dir)::

    releases/<id>/                  a complete release (never changed once complete)
    releases/<id>/.tritonfleet-release   marker: {"release": id, "files": {path: [size, sha256]}}
    releases/<id>/.tritonfleet-stat      "size mtime path" of every file, taken when it completed
    releases/.incoming-<id>.<run>/  a release being built by one run (tritonfleet.core.runid); a later
                                    run takes over what an interrupted one left (renamed to its own)
    model_repository -> releases/<id>    switched atomically (rename of model_repository.new-<run>)
    releases.log                    release ids in switch order (pruning keeps the newest)

A no-op run compares the live release's ``find -printf '%s %T@ %P'`` with its stat record: no
file is read. A new release gets each file from, in order: the interrupted transfer of the same
release (right size), a hard link to any complete release holding the same content (same size
and sha256, whatever its path: renamed files are not sent again), or the transfer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..core.runid import RUN_ID
from ..core.shell import q
from .render import MARKER, is_dir_entry

STAT = ".tritonfleet-stat"
EXPECT = ".tritonfleet-expect"
FOUND = ".tritonfleet-found"
INCOMING = ".incoming-"
REPAIR = ".repair-"
# every file of ours is at the top of a release and starts with this; find skips them when it
# lists a release's model files (a model's own hidden files, at any depth, are listed)
OWN_PREFIX = ".tritonfleet-"
LIST_FILES = f"find . -type f ! -path './{OWN_PREFIX}*' -printf"


def _listing(file_format: str, dir_format: str) -> str:
    """find over a release directory: its model files and its empty directories (an ensemble's
    version directory holds nothing and must exist all the same)."""
    return (
        f"find . -mindepth 1 \\( -type d -empty -printf '{dir_format}' \\) -o "
        f"\\( -type f ! -path './{OWN_PREFIX}*' -printf '{file_format}' \\)"
    )


def incoming_dir(release: str, run: str) -> str:
    """The directory (below releases/) in which ``run`` builds ``release``."""
    return f"{INCOMING}{release}.{run}"


def _leftovers(rel_dir: str, release: str) -> str:
    """Shell words: directories interrupted runs left for ``release`` (in glob order: the index
    and the take-over pick the same one)."""
    d = q(f"{rel_dir}/{INCOMING}{release}")
    return f"{d} {d}.*"


def stat_listing_command() -> str:
    """Run inside a release directory: 'size mtime path' lines ('d - dir/' for an empty
    directory), sorted bytewise."""
    return _listing("%s %T@ %P\\n", "d - %P/\\n") + " | LC_ALL=C sort"


def state_command(base: str) -> str:
    """The no-op check (one command): the live release, the complete releases, and the live
    release's files whose size or mtime differ from its stat record (no file is read)."""
    b = q(base)
    return (
        f'cur=$(readlink {b}/model_repository 2>/dev/null); echo "current=$cur"; '
        f'for d in {b}/releases/*/; do [ -f "$d{MARKER}" ] && echo "release=$(basename "$d")"; '
        "done 2>/dev/null; "
        f'for d in {b}/releases/{INCOMING}*/; do [ -d "$d" ] && echo "incoming=$(basename "$d")"; '
        "done 2>/dev/null; "
        f'if [ -n "$cur" ] && [ -f {b}/"$cur"/{STAT} ]; then cd {b}/"$cur" && echo verified=1 && '
        f"{stat_listing_command()} | LC_ALL=C comm -3 - {STAT} | sed 's/^\\t*/drift=/' | head -n 200; "
        "fi; true"
    )


def parse_state(lines) -> dict:
    current, releases, drift, verified, incoming = None, [], [], False, []
    for line in lines:
        key, _, value = line.rstrip("\n").partition("=")
        if key == "current" and value:
            current = value.rstrip("/").rsplit("/", 1)[-1]
        elif key == "release" and value:
            releases.append(value)
        elif key == "incoming" and value.startswith(INCOMING):
            incoming.append(value[len(INCOMING) :].split(".", 1)[0])
        elif key == "verified":
            verified = True
        elif key == "drift" and value:
            drift.append(_path_of_stat_line(value))
    return {
        "current": current,
        "releases": sorted(releases),
        "verified": verified,
        "drift": sorted(set(drift)),
        "incoming": sorted(set(incoming)),
    }


def _path_of_stat_line(line: str) -> str:
    parts = line.split(" ", 2)
    return parts[2] if len(parts) == 3 else line


def index_command(base: str, release: str) -> str:
    """What building ``release`` can reuse: every complete release's marker and drifted files,
    and what an interrupted transfer of ``release`` left ('size path')."""
    b = q(base)
    return (
        f'for d in {b}/releases/*/; do r=$(basename "$d"); [ -f "$d{MARKER}" ] || continue; '
        f"printf 'marker %s ' \"$r\"; tr -d '\\n' < \"$d{MARKER}\"; echo; "
        f'if [ -f "$d{STAT}" ]; then (cd "$d" && {stat_listing_command()} | LC_ALL=C comm -3 - {STAT} '
        '| sed "s/^\\t*/drift $r /"); fi; done 2>/dev/null; '
        f'for d in {_leftovers(base + "/releases", release)}; do [ -d "$d" ] || continue; '
        f"(cd \"$d\" && {LIST_FILES} 'incoming %s %P\\n'); break; done; true"
    )


def parse_index(lines) -> dict:
    """{"releases": {id: {path: [size, sha256]}}, "drift": {id: [path]}, "incoming": {path: size}}"""
    releases: dict[str, dict] = {}
    drift: dict[str, set] = {}
    incoming: dict[str, int] = {}
    for line in lines:
        line = line.rstrip("\n")
        kind, _, rest = line.partition(" ")
        if kind == "marker":
            rid, _, text = rest.partition(" ")
            try:
                files = json.loads(text).get("files", {})
            except ValueError:
                continue  # a marker we cannot read: that release is not a source
            if isinstance(files, dict):
                releases[rid] = files
        elif kind == "drift":
            rid, _, stat_line = rest.partition(" ")
            drift.setdefault(rid, set()).add(_path_of_stat_line(stat_line))
        elif kind == "incoming":
            size, _, path = rest.partition(" ")
            if size.isdigit() and path:
                incoming[path] = int(size)
    return {"releases": releases, "drift": {k: sorted(v) for k, v in drift.items()}, "incoming": incoming}


@dataclass
class Plan:
    release: str
    keep: list[str] = field(default_factory=list)  # complete in the interrupted transfer
    link: dict[str, str] = field(default_factory=dict)  # path -> "<release id>/<path>" to hard link
    send: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)  # left in the incoming dir, not wanted
    send_bytes: int = 0
    repair: bool = False  # the release exists but its files drifted: rebuild it beside itself

    def summary(self) -> str:
        return (
            f"{len(self.send)} files to send ({self.send_bytes / 1e6:.1f} MB), "
            f"{len(self.link)} hard-linked from earlier releases, "
            f"{len(self.keep)} kept from an interrupted transfer"
        )


def make_plan(release: str, manifest: dict[str, list], index: dict) -> Plan:
    """Where each file of ``manifest`` comes from. Files whose size or mtime changed on the host
    since their release completed (drift) are never reused: that content is suspect, and every
    release sharing the inode drifted with it."""
    plan = Plan(release)
    suspect = set()
    for rid, paths in index["drift"].items():
        files = index["releases"].get(rid, {})
        suspect |= {tuple(files[p]) for p in paths if p in files}
    plan.repair = release in index["releases"]
    sources: dict[tuple, str] = {}
    for rid in sorted(index["releases"]):
        bad = set(index["drift"].get(rid, []))
        for path, value in sorted(index["releases"][rid].items()):
            key = tuple(value)
            if path in bad or key in suspect or is_dir_entry(path):
                continue
            sources.setdefault(key, f"{rid}/{path}")
    incoming = index["incoming"]
    for path, value in sorted(manifest.items()):
        if is_dir_entry(path):
            continue  # made by the prepare script
        size = int(value[0])
        key = tuple(value)
        if incoming.get(path) == size and key not in suspect:
            plan.keep.append(path)
        elif key in sources:
            plan.link[path] = sources[key]
        else:
            plan.send.append(path)
            plan.send_bytes += size
    plan.remove = sorted(p for p in incoming if p not in plan.keep)
    return plan


def expect_listing(manifest: dict[str, list]) -> str:
    """'size path' lines of every file ('d dir/' of every empty directory), sorted the way the
    host's `LC_ALL=C sort` sorts them."""
    lines = [f"d {p}" if is_dir_entry(p) else f"{int(v[0])} {p}" for p, v in manifest.items()]
    lines.sort(key=lambda s: s.encode())
    return "".join(f"{line}\n" for line in lines)


def marker_text(release: str, manifest: dict[str, list]) -> str:
    return json.dumps({"release": release, "files": manifest}, sort_keys=True)


def _heredoc(path: str, text: str, tag: str) -> str:
    if f"\n{tag}\n" in f"\n{text}":  # the here-document would end early (checked under python -O too)
        raise ValueError(f"the text for {path} holds a line {tag!r}, the end of its here-document")
    if not text:
        return f": > {q(path)}\n"  # a here-document always ends with a line break
    return f"cat > {q(path)} <<'{tag}'\n{text}{'' if text.endswith(chr(10)) else chr(10)}{tag}\n"


def prepare_script(base: str, plan: Plan, manifest: dict[str, list], run: str = RUN_ID) -> str:
    """Shell (run with sh) that makes releases/.incoming-<id>.<run> hold everything but the files
    to send: what an interrupted run left taken over, leftovers removed, hard links made, the
    marker and the expected listing written."""
    rel = f"{base}/releases"
    inc = f"{rel}/{incoming_dir(plan.release, run)}"
    out = [
        "set -e",
        f"mkdir -p {q(rel)}",
        # the interrupted transfer the plan counted on (the one index_command listed)
        f"if [ ! -d {q(inc)} ]; then for d in {_leftovers(rel, plan.release)}; do "
        f'[ -d "$d" ] && [ "$d" != {q(inc)} ] || continue; mv -T "$d" {q(inc)}; break; done; fi',
        f"mkdir -p {q(inc)}",
        f"cd {q(inc)}",
    ]
    out += [f"rm -f -- {q(p)}" for p in plan.remove]
    # the marker of an earlier release must never be mistaken for this one's before it completes
    out.append(f"rm -f {MARKER} {STAT} {EXPECT} {FOUND}")
    dirs = sorted(
        {p.rsplit("/", 1)[0] for p in list(plan.link) + plan.send if "/" in p}
        | {p.rstrip("/") for p in manifest if is_dir_entry(p)}
    )
    if dirs:
        out.append("mkdir -p -- " + " ".join(q(d) for d in dirs))
    out += [f"ln -f -- {q(rel + '/' + src)} {q(p)}" for p, src in sorted(plan.link.items())]
    # a file about to be sent is never written through a hard link into another release
    out += [f"rm -f -- {q(p)}" for p in plan.send]
    out.append(_heredoc(EXPECT, expect_listing(manifest), "TRITONFLEET_EXPECT_EOF").rstrip("\n"))
    out.append(_heredoc(MARKER, marker_text(plan.release, manifest), "TRITONFLEET_MARKER_EOF").rstrip("\n"))
    return "\n".join(out) + "\n"


def discard_incoming_script(base: str, releases: list[str]) -> str:
    """Remove what interrupted transfers of ``releases`` left (never a complete release)."""
    return "rm -rf -- " + " ".join(_leftovers(f"{base}/releases", r) for r in releases)


def receive_command(base: str, release: str, run: str = RUN_ID) -> str:
    """The remote end of the transfer: unpack a tar stream into this run's incoming directory."""
    inc = q(f"{base}/releases/{incoming_dir(release, run)}")
    return f"mkdir -p {inc} && tar -x -f - -C {inc} --no-same-owner"


def finish_script(
    base: str, release: str, keep: int, manifest: dict[str, list] | None = None, run: str = RUN_ID, switch: bool = True
) -> str:
    """Shell that checks the incoming release is complete (every file, at its size), records its
    stat listing, makes it a release and switches the live link to it. Triton only ever sees a
    complete release: the link moves by rename, and a drifted release is rebuilt beside itself.
    ``switch`` False (staging, never for the live release): the release is made complete and the
    live link is left as it is; a later run's switch finds it complete."""
    b = q(base)
    rid = release
    inc = f"releases/{incoming_dir(rid, run)}"
    rep = f"releases/{REPAIR}{rid}.{run}"
    done = f"releases/{rid}"
    new = f"model_repository.new-{run}"
    empty = [p for p in (manifest or {}) if is_dir_entry(p)]
    return (
        "\n".join(
            [
                "set -e",
                f"cd {b}",
                f'[ -d {q(inc)} ] || {{ echo {q(inc + " is missing on")} "$(hostname)": the release was not prepared >&2; exit 1; }}',
                f"cd {q(inc)}",
                # directories left empty by files removed from an interrupted transfer go; the
                # release's own empty directories are made again (the listing below checks both)
                "find . -mindepth 1 -type d -empty -delete",
                *([f"mkdir -p -- {' '.join(q(p.rstrip('/')) for p in sorted(empty))}"] if empty else []),
                _listing("%s %P\\n", "d %P/\\n") + f" | LC_ALL=C sort > {FOUND}",
                f"if ! cmp -s {FOUND} {EXPECT}; then",
                f'  echo {q(f"release {rid} on")} "$(hostname)" {q(f"is incomplete in {base}/{inc} (missing or wrong-size")} '
                "'files below; the live release is unchanged): run the deploy again' >&2",
                f"  diff {EXPECT} {FOUND} | sed -n 's/^[<>] //p' | head -n 20 >&2",
                "  exit 1",
                "fi",
                f"rm -f {FOUND} {EXPECT}",
                "chmod -R a+rX .",
                f"{stat_listing_command()} > {STAT}",
                # staging: the release is written to disk before it is called complete. Its batch then
                # does not pay the writeback (measured on the test hosts: a staged batch 1.12x one whose
                # release was on the hosts, with 200 MB of the staged release still dirty), and a host
                # that loses power between staging and its batch has no "complete" release of lost pages
                *(["find . -type f -exec sync -- {} +"] if not switch else []),
                f"cd {b}",
                *([f"rm -rf {q(done)} && mv -T {q(inc)} {q(done)}"] if not switch else []),
                *(_finish_switch(base, rid, keep, inc, rep, done, new, run) if switch else []),
            ]
        )
        + "\n"
    )


def _finish_switch(base: str, rid: str, keep: int, inc: str, rep: str, done: str, new: str, run: str) -> list[str]:
    return [
        f"if [ -e {q(done)} ]; then",
        # rebuild of a drifted release: the link always points at a complete release
        f"  rm -rf {q(rep)} && mv -T {q(inc)} {q(rep)}",
        f"  ln -sfn {q(rep)} {new} && mv -T {new} model_repository",
        f"  rm -rf {q(done)} && cp -al {q(rep)} {q(done)}",
        "else",
        f"  mv -T {q(inc)} {q(done)}",
        "fi",
        switch_script(base, rid, keep, run),
        f"rm -rf {q(rep)}",
    ]


def switch_script(base: str, release: str, keep: int, run: str = RUN_ID) -> str:
    """Point the live link at releases/<release> (atomic rename), log it, prune old releases."""
    b = q(base)
    rid = release
    return (
        f"{link_script(base, f'releases/{rid}', run)} && "
        f"echo {q(rid)} >> {b}/releases.log && "
        # what interrupted transfers of other releases left is of no use any more
        f"rm -rf {b}/releases/{INCOMING}* {b}/releases/{OWN_PREFIX}plan-* && "
        # prune: keep the newest `keep` releases by switch order, never the live one
        f"{{ tac {b}/releases.log | awk '!seen[$0]++' | tail -n +{keep + 1} | "
        # (only names that are release ids: a damaged log line never removes anything else)
        f'while read -r r; do case "$r" in \'\'|{q(rid)}|*[!0-9a-f]*) ;; *) rm -rf {b}/releases/"$r";; esac; '
        "done; }"
    )


def switch_back_script(base: str, release: str, run: str = RUN_ID) -> str:
    """The rollback's switch: point the live link back at releases/<release> (atomic rename) and
    log it. Unlike ``switch_script`` it prunes nothing: what a rollback leaves is the history that
    a later rollback may need."""
    return f"{link_script(base, f'releases/{release}', run)} && echo {q(release)} >> {q(base)}/releases.log"


def link_script(base: str, target: str, run: str = RUN_ID) -> str:
    """Point ``base``/model_repository at ``target`` by renaming a new link over it (the new
    link's name is this run's own)."""
    b = q(base)
    new = f"{b}/model_repository.new-{run}"
    return f"ln -sfn {q(target)} {new} && mv -T {new} {b}/model_repository"
