"""What a model repository may contain: one definition, for ``tritonfleet validate`` and the deploy.

The validator reports every entry refused here as a problem of its rule (tritonfleet.model_repo.validate);
the deploy walks the repository with :func:`scan` to build a release and refuses the first one,
before any host is touched (tritonfleet.model_repo.render.walk, called by pre-flight and by every release).
So the two agree on every case: tests/unit/model_repo/test_contents.py checks it on generated trees.

Symlinks inside the repository are followed, as Triton reads through them (the host gets the
file or directory a link points to). Refused, each with the path and the fix:

* a symlink to an absolute path (another checkout or machine has another one), or one that
  leads out of the repository (a release carries the repository only);
* a broken symlink, a symlink loop, a symlink to a directory that holds it (a cycle: the walk,
  Triton's and the release's, would never end);
* a FIFO, socket or device: nothing a release can carry (a FIFO also blocks whoever reads it);
* a name that is not UTF-8 or holds a line break (the release manifest and the host-side
  commands are text, one path a line);
* a top-level name starting with ``.tritonfleet-`` (kept by the host for the release record);
* a directory that cannot be read.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

#: top-level names the host's release directory keeps for itself (the marker, the stat record)
RESERVED_PREFIX = ".tritonfleet-"

#: rule id -> what it checks (tritonfleet.model_repo.validate.tables.RULES holds these too)
RULES = {
    "unsafe-path": "no symlink out of the repository or to an absolute path; plain file names only",
    "broken-symlink": "every symlink points to something",
    "symlink-cycle": "no symlink loop, no symlink to a directory that holds it",
    "special-file": "only files and directories: no FIFO, socket or device",
    "file-name": "names are UTF-8 without line breaks; no top-level name starting with .tritonfleet-",
    "unreadable": "every directory can be read",
}


@dataclass(frozen=True)
class Entry:
    """Something a release reproduces: ``kind`` "file", or "dir" for a directory that holds
    nothing (an ensemble's ``1/``; ``rel`` then ends with '/'); ``path`` where it is read."""

    kind: str
    rel: str
    path: Path


@dataclass(frozen=True)
class Refusal:
    """An entry the repository may not hold: ``rel`` its path in the repository (posix),
    ``rule`` one of :data:`RULES`, ``message`` what is wrong and the fix."""

    rel: str
    rule: str
    message: str


def _sort_key(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def scan(repo: str | os.PathLike) -> tuple[list[Entry], list[Refusal]]:
    """Every entry of ``repo`` a release reproduces (sorted, byte order), and every refusal.
    Hidden names are entries like any other (Triton reads them too). A refused entry is not
    entered: nothing below it is read."""
    repo = Path(repo)
    root = Path(os.path.realpath(repo))
    entries: list[Entry] = []
    refusals: list[Refusal] = []

    def refuse(rel: str, rule: str, message: str) -> None:
        refusals.append(Refusal(rel, rule, message))

    def visit(dirpath: Path, rel: str, ancestors: frozenset) -> None:
        try:
            names = sorted(os.listdir(dirpath), key=_sort_key)
        except OSError as e:
            refuse(rel.rstrip("/") or ".", "unreadable", f"cannot read the directory: {e.strerror}")
            return
        if not names and rel:
            entries.append(Entry("dir", rel, dirpath))
            return
        for name in names:
            path = dirpath / name
            here = f"{rel}{name}"
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                refuse(
                    here.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                    "file-name",
                    "the name is not UTF-8: rename it",
                )
                continue
            if "\n" in name or "\r" in name:
                refuse(
                    here.replace("\n", "\\n").replace("\r", "\\r"),
                    "file-name",
                    "the name holds a line break: rename it",
                )
                continue
            if not rel and name.startswith(RESERVED_PREFIX):
                refuse(
                    here,
                    "file-name",
                    f"names starting with {RESERVED_PREFIX} at the top of the repository "
                    "are kept for the release record on the host: rename it",
                )
                continue
            if path.is_symlink():
                target = os.readlink(path)
                if os.path.isabs(target):
                    refuse(
                        here,
                        "unsafe-path",
                        f"symlink to the absolute path {target}: on another machine or checkout it points "
                        "elsewhere; use a relative link inside the repository, or a copy",
                    )
                    continue
                real = Path(os.path.realpath(path))
                if real != root and root not in real.parents:
                    refuse(
                        here,
                        "unsafe-path",
                        f"symlink {target} points outside the repository ({real}): copy the file in",
                    )
                    continue
            try:
                st = path.stat()  # follows symlinks
            except FileNotFoundError:
                if path.is_symlink():
                    refuse(
                        here,
                        "broken-symlink",
                        f"symlink to {os.readlink(path)}, which does not exist: fix or remove it",
                    )
                else:  # removed while it was read
                    refuse(here, "unreadable", "it went away while the repository was read: run again")
                continue
            except OSError as e:
                if e.errno == errno.ELOOP:
                    refuse(here, "symlink-cycle", "symlink loop: fix or remove it")
                else:
                    refuse(here, "unreadable", f"cannot read it: {e.strerror}")
                continue
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    refuse(
                        here, "symlink-cycle", "symlink to a directory that holds it (a cycle): replace it by a copy"
                    )
                    continue
                visit(path, f"{here}/", ancestors | {key})
            elif stat.S_ISREG(st.st_mode):
                entries.append(Entry("file", here, path))
            else:
                refuse(here, "special-file", "not a regular file or directory (a FIFO, socket or device): remove it")

    top = repo.stat()
    visit(repo, "", frozenset({(top.st_dev, top.st_ino)}))
    return entries, refusals
