"""What the unit and its container show while the health gate waits, read in one SSH command.

``UnitWatch`` reads the unit's state, its journal (each entry with the start it belongs to), the
container, the live model release and the last healthy deployment; ``assess`` finds a cause no
waiting can cure (systemd gave up, Docker cannot run the image or bind a port, the same Triton
error on two starts); ``error_words`` and ``serving_now`` give a failed gate's report Triton's own
words, what the host runs now and the command that puts the last healthy deployment back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..core.connection_errors import CONNECTION_ERRORS
from ..core.errors import TritonfleetError
from ..core.report import rollback_command, trim
from ..core.shell import q
from ..settings.access import Settings


@dataclass
class Verdict:
    """A definitive cause seen while waiting: the host will not become healthy by waiting longer."""

    cause: str
    words: list[str] = field(default_factory=list)  # Triton's (or Docker's) own lines
    short: str = ""  # the cause first, for a table cell


def journal_excerpt(lines: list[str], keep: int = 15) -> list[str]:
    """The unit journal's error lines (Triton's E-level log lines, failures), else its tail."""
    bad = [
        ln
        for ln in lines
        if re.search(r"\]: E\d{4} |\bE\d{4} \d|error|failed|unavailable", ln, re.I) and "| " not in ln
    ]
    return (bad or lines)[-keep:]


def unquote(message: str) -> str:
    """A Triton log message as it was meant: Triton (2.51) writes each message as one quoted line
    with its newlines escaped (``"failed to load ...\\n\\nAt:\\n  .../model.py(3): initialize\\n"``)."""
    text = message.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            return json.loads(text)
        except ValueError:
            return text[1:-1].replace("\\n", "\n").replace('\\"', '"')
    return text


def triton_cause(lines: list[str]) -> str:
    """Triton's own first error in the unit's journal, one line (its first): a model that failed
    to load first, else the first E-level line ("" when there is none)."""
    errors = []
    for ln in lines:
        m = ERROR_LINE.search(ln)
        if m:
            errors.append(unquote(m.group(1)).strip().split("\n", 1)[0].strip())
    loads = [e for e in errors if "failed to load" in e]
    return ((loads or errors or [""])[0])[:240]


SECTION = "@@tritonfleet-watch@@"


SHOW_PROPS = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus", "InvocationID")


# Docker's words for causes no restart can cure
DOCKER_DEFINITIVE = (
    (
        r"Unable to find image .* locally|No such image|pull access denied|manifest unknown|"
        r"repository does not exist",
        "the image is not on the host (and cannot be pulled)",
    ),
    (r"port is already allocated|address already in use|bind: .*in use", "a port Triton publishes is already bound"),
)


TRITON_LINE = re.compile(r"\b[IWE]\d{4} [\d:.]+\s+\d+ \S+\] ")


ERROR_LINE = re.compile(r"\bE\d{4} [\d:.]+\s+\d+ \S+\] (.*)")


def watch_command(service: str, container: str, base: str, lines: int = 300) -> str:
    """One remote command: the unit's state, its journal (JSON, with each entry's start of the
    unit), the container, the live release and the last healthy deployment."""
    unit = q(f"{service}.service")
    props = " ".join(f"-p {p}" for p in SHOW_PROPS)
    return "; ".join(
        [
            f"systemctl show {props} {unit} 2>/dev/null",
            "echo Now=$(date +%s%6N)",
            f"echo {SECTION}",
            f"journalctl -u {unit} -n {lines} --no-pager -o json "
            "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID 2>/dev/null",
            f"echo {SECTION}",
            f"docker inspect --format '{{{{.Config.Image}}}} {{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {q(container)} "
            "2>/dev/null",
            f"echo {SECTION}",
            f"readlink {q(base)}/model_repository",
            f"echo {SECTION}",
            f"tail -n 1 {q(base)}/history.jsonl 2>/dev/null",
            "true",
        ]
    )


@dataclass
class Start:
    """One start of the unit (a systemd invocation) and the journal lines it wrote."""

    invocation: str
    lines: list[str] = field(default_factory=list)
    began: int = 0  # its first journal entry (microseconds since the epoch)

    @property
    def exiting(self) -> bool:
        return any(ln.startswith("error: creating server") for ln in self.lines)

    @property
    def cause(self) -> str:
        """Why this start ended, in Triton's words: a model that failed to load, else the line
        tritonserver exits with ("error: creating server: ..."); "" when it said neither (other
        E-level lines, such as a CPU host's CUDA warnings, appear in healthy starts too)."""
        first = triton_cause(self.lines)
        if "failed to load" in first:
            return first
        return next((ln.strip()[:240] for ln in self.lines if ln.startswith("error: creating server")), "")


@dataclass
class UnitSnapshot:
    show: dict[str, str] = field(default_factory=dict)
    starts: list[Start] = field(default_factory=list)
    container: str = ""
    release: str = ""
    last: dict | None = None
    last_error: str = ""  # the history's last line that is not a record (not "never recorded")

    @property
    def restarts(self) -> int:
        try:
            return int(self.show.get("NRestarts") or 0)
        except ValueError:
            return 0

    def ended(self, start: Start) -> bool:
        """The start is over: a later one exists, the unit is not running it any more, or it
        cannot end well any more: a model failed to load (tritonserver then finishes loading the
        others and exits; with --exit-on-error=false it serves without that model) or tritonserver
        wrote the line it exits with (it then only shuts down, for seconds)."""
        if start.invocation != self.show.get("InvocationID") or start.exiting:
            return True
        if "failed to load" in start.cause:
            return True
        return self.show.get("SubState") in ("auto-restart", "failed", "dead", "exited") or self.show.get(
            "ActiveState"
        ) in ("failed", "inactive")

    @property
    def now(self) -> int:
        try:
            return int(self.show.get("Now") or 0)
        except ValueError:
            return 0

    def window(self, since: int = 0) -> list[Start]:
        """The starts since the unit was last started by hand (a deploy's restart): systemd's
        restart counter (NRestarts) counts the automatic ones after it, but a restart by hand
        during systemd's wait between two automatic ones does not reset it; so only starts that
        began at ``since`` or later count as well."""
        starts = self.starts[-(self.restarts + 1) :] if self.starts else []
        return [s for s in starts if s.began >= since]


def _message(value) -> str:
    if isinstance(value, list):  # journald's non-UTF-8 messages: a list of bytes
        value = bytes(v for v in value if isinstance(v, int) and 0 <= v < 256).decode("utf-8", "replace")
    return str(value or "")


def parse_watch(text: str) -> UnitSnapshot:
    parts = text.split(SECTION + "\n")
    parts += [""] * (5 - len(parts))
    snap = UnitSnapshot()
    for ln in parts[0].splitlines():
        k, sep, v = ln.partition("=")
        if sep:
            snap.show[k.strip()] = v.strip()
    current: Start | None = None
    for ln in parts[1].splitlines():
        try:
            entry = json.loads(ln)
        except ValueError:
            continue
        inv = entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID") or ""
        if inv and (current is None or current.invocation != inv):
            # systemd writes a start's last lines (its exit) with that start's id: a later
            # entry of an earlier id continues it
            known = [s for s in snap.starts if s.invocation == inv]
            current = known[-1] if known else Start(inv, began=int(entry.get("__REALTIME_TIMESTAMP") or 0))
            if not known:
                snap.starts.append(current)
        if current is not None:
            current.lines.append(_message(entry.get("MESSAGE")))
    snap.container = parts[2].strip()
    rel = parts[3].strip()
    snap.release = rel.rstrip("/").rsplit("/", 1)[-1] if rel else ""
    if parts[4].strip():
        try:
            snap.last = json.loads(parts[4].strip())
        except ValueError:
            snap.last_error = f"the last line of history.jsonl is not a record: {parts[4].strip()[:120]!r}"
    return snap


def docker_cause(lines: list[str]) -> tuple[str, str]:
    """(Docker's line, what it means) for a cause no restart can cure, else ("", "")."""
    for pattern, meaning in DOCKER_DEFINITIVE:
        for ln in lines:
            if re.search(pattern, ln):
                return ln.strip()[:240], meaning
    return "", ""


def error_words(lines: list[str], keep: int = 12) -> list[str]:
    """Triton's first error of a start with the lines that continue it (a Python traceback's
    "At:" block), as written; else the start's last lines."""
    first = next((i for i, ln in enumerate(lines) if "failed to load" in ln and ERROR_LINE.search(ln)), None)
    if first is None:
        first = next((i for i, ln in enumerate(lines) if ERROR_LINE.search(ln)), None)
    if first is None:
        return trim(journal_excerpt(lines, keep), keep)
    m = ERROR_LINE.search(lines[first])
    said = unquote(m.group(1)).splitlines() or [""]
    out = [f"{lines[first][: m.start(1)].strip()} {said[0]}", *said[1:]]
    for ln in lines[first + 1 :]:  # a message written over several journal lines
        if TRITON_LINE.search(ln) or len(out) >= keep:
            break
        out.append(ln)
    return trim(out, keep)


def assess(snap: UnitSnapshot, service: str = "triton", since: int = 0) -> Verdict | None:
    """A definitive cause in what the unit shows, or None (keep waiting): systemd gave up on the
    unit; Docker says the image is missing or a port is bound; or Triton stopped twice in a row
    with the same error. A start that is still running is never one; starts that began before
    ``since`` (microseconds since the epoch, the host's clock) do not count."""
    window = snap.window(since)
    ended = [s for s in window if snap.ended(s)]
    if snap.show.get("ActiveState") == "failed":
        last = window[-1] if window else Start("")
        why = f"systemd gave up on {service}.service (result: {snap.show.get('Result') or '?'})"
        return Verdict(
            why + (f"; {last.cause}" if last.cause else ""),
            error_words(last.lines),
            f"{last.cause} ({why})" if last.cause else why,
        )
    for s in ended:
        line, meaning = docker_cause(s.lines)
        if line:
            return Verdict(f"{meaning}: {line}", trim([line]), f"{meaning}: {line}")
    if len(ended) >= 2:
        a, b = ended[-2], ended[-1]
        if a.cause and a.cause == b.cause:
            return Verdict(
                f"{service}.service stopped with the same error on two consecutive starts "
                f"(restart counter {snap.restarts}): {b.cause}",
                error_words(b.lines),
                f"{b.cause} (the same error on two starts)",
            )
    return None


class UnitWatch:
    """Asked while the gate waits: reads the unit (one remote command through ``run``, which
    returns its output) and returns a Verdict once one is definitive. ``last`` keeps the latest
    snapshot for the report."""

    # the starts that count began at most this long before the gate first read the unit: the
    # deploy's restart comes just before the gate, and systemd waits RestartSec (5 s in the
    # unit) between two automatic starts, so at most one start of an earlier run can count
    SLACK_US = 4_000_000

    def __init__(self, run, service: str, container: str, base: str):
        self.run, self.service = run, service
        self.command = watch_command(service, container, base)
        self.last: UnitSnapshot | None = None
        self.since: int | None = None
        #: why the last read of the host failed ("" after a read that worked): the report says it
        self.error = ""

    def read(self) -> UnitSnapshot | None:
        """The unit now; None when the host cannot be read (``error`` says why): a watch that cannot
        read the host decides nothing, and the gate goes on waiting on Triton's own answers. ``run``
        fails with a connection's error, or a TritonfleetError (the fleet commands' FleetError)."""
        try:
            self.last = parse_watch(self.run(self.command))
        except (TritonfleetError, *CONNECTION_ERRORS) as e:
            self.error = f"{type(e).__name__}: {e}"
            return None
        self.error = ""
        return self.last

    def __call__(self) -> Verdict | None:
        snap = self.read()
        if snap is None:
            return None
        if self.since is None:
            self.since = max(0, snap.now - self.SLACK_US) if snap.now else 0
        return assess(snap, self.service, self.since)


def serving_now(snap: UnitSnapshot | None, service: str, host_name: str, rollout: bool = False) -> tuple[str, str]:
    """(what the host runs now, the command that puts the previous deployment back)."""
    if snap is None:
        return "unknown (the host could not be read)", ""
    st = f"{snap.show.get('ActiveState', '?')} ({snap.show.get('SubState', '?')})"
    running = snap.show.get("ActiveState") == "active" and snap.show.get("SubState") == "running"
    last_start = snap.starts[-1] if snap.starts else None
    failing = bool(last_start) and (last_start.exiting or "failed to load" in last_start.cause)
    what = (
        f"{service}.service is {st}"
        + (f", systemd restarted it {snap.restarts} time{'s' if snap.restarts != 1 else ''}" if snap.restarts else "")
        + (
            "; Triton runs but does not pass the gate"
            if running and not failing
            else "; tritonserver failed this start too and exits: nothing is served"
            if running
            else "; nothing is served"
        )
    )
    what += f"; live model release {snap.release or 'none'}"
    last = snap.last or {}
    if last.get("release"):
        what += (
            f"; last healthy deployment: release {last['release']}, {last.get('image', '?')} "
            f"({last.get('time', '?')}, {last.get('action', 'deploy')})"
        )
        differs = last["release"] != snap.release
        if rollout:
            fix = "the rollout rolls this host back to what it served before"
        else:
            fix = (
                "the host served before this deploy; put that deployment back with: "
                if differs
                else "to return to the last healthy deployment: "
            ) + rollback_command(host_name)
    elif snap.last_error:
        what += f"; the last healthy deployment cannot be told ({snap.last_error})"
        fix = ""
    else:
        what += "; no healthy deployment was ever recorded on this host"
        fix = ""
    return what, fix


def watch_instance(settings: Settings, run) -> UnitWatch:
    """The UnitWatch of a host's (or one per-GPU instance's) unit, reading it through ``run``."""
    return UnitWatch(
        run, settings.get("triton_service"), settings.get("triton_container_name"), settings.get("triton_base_dir")
    )
