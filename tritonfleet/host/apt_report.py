"""The report of a failed apt command (tritonfleet.core.report's Failure): what the command was
meant to do in words, the command as shown, and apt's diagnosis (tritonfleet.host.apt_diagnosis);
and the commands that read the host's candidates (``apt-cache madison``) and sources for it."""

from __future__ import annotations

import shlex

from ..core.report import LINE_WIDTH, Failure, trim
from ..core.shell import q
from .apt_diagnosis import APT_LOG, AptDiagnosis, joined, output_lines


def describe(command: str) -> str:
    """What the command was to achieve (a report's "expected"), from the apt command line."""
    words = _split(command)
    if "apt-get" in words or "apt" in words:
        verb, args = _verb_args(words[words.index("apt-get" if "apt-get" in words else "apt") + 1 :])
        if verb == "update":
            return "apt-get update reads every repository in the host's sources"
        if verb in ("install", "remove", "purge") and args:
            done = {"install": "installed", "remove": "removed", "purge": "removed"}[verb]
            return f"packages {joined(args, 6)} {done} (apt-get {verb})"
        if verb:
            return f"apt-get {verb} to succeed"
    if "apt-mark" in words:
        verb, args = _verb_args(words[words.index("apt-mark") + 1 :])
        return f"apt-mark {verb} on {joined(args, 6)}" if args else f"apt-mark {verb} on the driver's packages"
    if "dpkg" in words and "--configure" in words:
        return "dpkg --configure -a finishes the interrupted dpkg run"
    return "the package manager command to succeed"


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def _verb_args(words: list[str]) -> tuple[str, list[str]]:
    verb, args, skip = "", [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("-o", "-c", "-t", "--option", "--config-file", "--target-release"):
            skip = True
            continue
        if w.startswith("-"):
            continue
        if w in ("&&", "||", ";", "|") or w.startswith((";", "|", "&")):
            break
        if not verb:
            verb = w
        else:
            args.append(w)
    return verb, args


# what every apt-get command of pyinfra's carries: left out of the command the report shows
BOILERPLATE = (
    "DEBIAN_FRONTEND=noninteractive ",
    '-o Dpkg::Options::="--force-confdef" ',
    '-o Dpkg::Options::="--force-confold" ',
)


def shown_command(command: str, width: int = LINE_WIDTH) -> str:
    """The command as the report shows it, on one line: the apt command without the options every
    apt-get command of the deploy carries (non-interactive, keep changed configuration files)."""
    line = " ".join(command.split())
    for b in BOILERPLATE:
        line = line.replace(b, "")
    return line if len(line) <= width else line[: width - 3] + "..."


def failure(
    d: AptDiagnosis,
    *,
    host: str,
    step: str,
    command: str,
    setting: str = "",
    available: dict[str, list[str]] | None = None,
    sources: list[str] | None = None,
) -> Failure:
    """The report of a failed apt command. ``setting``: the group-data setting that chose the
    packages or versions (named in the fix); ``available``: versions the host's lists carry, per
    package (apt-cache madison), for a version that is not there; ``sources``: the sources files
    that name the repository in question."""
    found = d.found
    if available:

        def shown(versions: list[str]) -> str:
            return ", ".join(versions[:6]) + (" ..." if len(versions) > 6 else "") if versions else "none"

        lists = {tuple(v) for v in available.values()}
        if len(available) > 1 and len(lists) == 1:
            found += f" (the host's lists carry {shown(list(lists.pop()))} of each)"
        else:
            found += " (the host's lists carry " + "; ".join(f"{p}: {shown(v)}" for p, v in available.items()) + ")"
    fix = d.fix.replace("{setting}", setting or "the setting that names the package or its version")
    if sources:
        fix += f"; the repository is listed in {', '.join(sources)} on the host"
    now = (
        "apt changed no package (it stopped before installing or removing anything); no later step ran, so "
        "Triton is as it was before this run"
        if not d.changed
        else "packages may have changed before apt stopped (dpkg --audit on the host lists any left half installed); "
        "no later step ran, so Triton is as it was before this run"
    )
    return Failure(
        host=host,
        step=step,
        expected=describe(command),
        found=found,
        words=trim(d.lines),
        source=f"apt's own words (key lines; all of them: {APT_LOG} on the host)",
        now=now,
        fix=fix,
        cause=f"{d.cause}: {d.found}",
        command=shown_command(command),
        meaning=d.meaning,
    )


def madison_command(packages: list[str]) -> str:
    return "apt-cache madison " + " ".join(q(p) for p in packages[:6]) + " 2>/dev/null | head -n 40"


def parse_madison(output) -> dict[str, list[str]]:
    """``apt-cache madison`` lines ("pkg | version | source") -> versions per package, newest first."""
    out: dict[str, list[str]] = {}
    for ln in output_lines(output):
        parts = [p.strip() for p in ln.split("|")]
        if len(parts) >= 3 and parts[0] and parts[1]:
            out.setdefault(parts[0], [])
            if parts[1] not in out[parts[0]]:
                out[parts[0]].append(parts[1])
    return out


def sources_command(urls: list[str]) -> str:
    """The sources files on the host that name any of ``urls``."""
    pats = " ".join(f"-e {q(u)}" for u in urls[:6] if u)
    return (
        f"grep -lsF {pats} /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources "
        "2>/dev/null; true"
    )
