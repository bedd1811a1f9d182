"""``tritonfleet init DIR``: an operator's own repository, with tritonfleet as a dependency.

Writes the package's skeleton (tritonfleet/skeleton, shipped as package data): the inventory with
its t4/l4 groups and their group data (only what differs from tritonfleet/settings/defaults.py, the rest
as comments), the entry points (deploys/*.py: the runbook's lines importing the package's
steps), the runbook's model repository and a README. An empty or missing DIR gets all of it; a
DIR that already holds exactly these files is left alone (nothing to do); anything else is
refused unless --force, which writes the skeleton's files and keeps every other file there; a
file of the skeleton that was edited there is kept beside it as ``<file>.orig`` (``.orig.1``, ...
when that exists) before it is overwritten, so --force never loses an edited inventory. (The
backup's name does not end in .py: pyinfra reads every .py file of group_data/ as a group.)
"""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import click

from .. import SKELETON
from ..core.errors import TritonfleetError, UsageError

SKIP = {"__pycache__"}
#: what may be in DIR before init without making it "not empty": a version-control directory
IGNORED = {".git", ".hg"}


class ScaffoldError(UsageError):
    """The directory cannot take the skeleton as asked (exit status 2)."""


def backup_name(target: Path) -> Path:
    """Where an edited file is kept before --force overwrites it: <file>.orig, else .orig.N."""
    candidate = target.with_name(target.name + ".orig")
    n = 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = target.with_name(f"{target.name}.orig.{n}")
    return candidate


def _rglob_following_links(root: Path) -> list[Path]:
    """Every file below ``root``, through symlinked directories too (a checkout's skeleton links
    to the repository's own deploys/, inventories/ and files/)."""
    out = []
    for entry in sorted(root.iterdir()):
        if entry.name in SKIP:
            continue
        if entry.is_dir():
            out += _rglob_following_links(entry)
        elif entry.is_file() and entry.suffix != ".pyc":
            out.append(entry)
    return out


def plan(dest: Path, root: Path = SKELETON) -> tuple[list[str], list[str], list[str]]:
    """(files to add, files that differ, files already the same) for ``dest``."""
    add, differ, same = [], [], []
    for src in _rglob_following_links(root):
        rel = src.relative_to(root).as_posix()
        target = dest / rel
        if not target.exists():
            add.append(rel)
        elif target.is_file() and filecmp.cmp(src, target, shallow=False):
            same.append(rel)
        else:
            differ.append(rel)
    return add, differ, same


def scaffold(
    dest: Path, force: bool = False, root: Path = SKELETON, backups: dict[str, Path] | None = None
) -> tuple[list[str], list[str], list[str]]:
    """Write the skeleton into ``dest``; returns (added, overwritten, unchanged). Checks first
    and writes nothing when it refuses. Each overwritten file's previous content is kept first
    (:func:`backup_name`); ``backups`` gets {relative path: where it was kept}."""
    if dest.exists() and not dest.is_dir():
        raise ScaffoldError(f"{dest} is a file, not a directory: pick a directory for the new repository")
    add, differ, same = plan(dest, root)
    existing = sorted(p.name for p in dest.iterdir() if p.name not in IGNORED) if dest.is_dir() else []
    if existing and (add or differ) and not force:
        shown = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
        what = (
            f"its {shown} {'differs' if len(differ) == 1 else 'differ'} from tritonfleet's skeleton"
            if differ
            else f"it holds {', '.join(existing[:5])}{' ...' if len(existing) > 5 else ''}"
        )
        raise ScaffoldError(
            f"{dest} is not empty ({what}): nothing was written. Pick an empty or new "
            "directory, or run `tritonfleet init --force` to write the skeleton's files "
            "there (other files are kept, and each file of it you edited is kept as "
            "<file>.orig)"
        )
    for rel in add + differ:
        target = dest / rel
        if target.is_dir() or target.is_symlink():  # --force: a directory or link in a file's place
            raise ScaffoldError(
                f"{target} is in the way of the skeleton's file {rel}: move it away, then "
                "run init again (nothing was written)"
            )
    for rel in differ:  # every edited file kept before anything is overwritten
        kept = backup_name(dest / rel)
        shutil.copy2(dest / rel, kept)
        if backups is not None:
            backups[rel] = kept
    for rel in add + differ:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
    return add, differ, same


@click.command("init", short_help="Write a new operator repository: inventory, group data, entry points, models.")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--force",
    is_flag=True,
    help="Write the skeleton into a directory that is not empty "
    "(its files that the skeleton has are overwritten, each edited one kept as <file>.orig "
    "first; others are left alone).",
)
def init(directory: Path, force: bool) -> None:
    """Write an operator's repository into DIRECTORY: inventories/prod.py (t4, l4 groups) and its
    group data, deploys/*.py, the runbook's model repository, a README.

    DIRECTORY must be empty or new (or already hold exactly these files); --force writes into
    one that is not; an edited file it overwrites is kept as <file>.orig first."""
    backups: dict[str, Path] = {}
    try:
        added, overwritten, same = scaffold(directory, force, backups=backups)
    except OSError as e:
        raise TritonfleetError(f"{directory}: {e.strerror}: {e.filename or ''}".rstrip(": ")) from None
    if not added and not overwritten:
        click.echo(f"{directory} already holds tritonfleet's skeleton ({len(same)} files, unchanged): nothing to do")
        return
    for rel in added:
        click.echo(f"  wrote      {rel}")
    for rel in overwritten:
        click.echo(f"  overwrote  {rel} (yours kept as {backups[rel].relative_to(directory).as_posix()})")
    click.echo(
        f"{directory}: {len(added)} file(s) written, {len(overwritten)} overwritten, {len(same)} "
        f"unchanged. Next: put your hosts into {directory}/inventories/prod.py, then see "
        f"{directory}/README.md (first deploy: pyinfra inventories/prod.py deploys/triton.py, "
        "run from that directory)"
    )
