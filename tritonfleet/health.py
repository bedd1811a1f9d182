"""The health gate: Triton answers live, ready, every model ready, and serves metrics.

Runs on the control machine with requests, either straight to the host's ports or through a
tunnel over the host's own SSH connection (for firewalls that open 8000-8002 only to the load
balancer and Prometheus).
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import threading
import time
from dataclasses import dataclass, field

import requests
from paramiko import SSHException

from . import pergpu
from .failure import Failure, HostFailure, trim
from .shell import q


class HealthError(HostFailure):
    pass


@dataclass
class Check:
    endpoint: str
    ok: bool
    detail: str


@dataclass
class Verdict:
    """A definitive cause seen while waiting: the host will not become healthy by waiting longer."""

    cause: str
    words: list[str] = field(default_factory=list)  # Triton's (or Docker's) own lines
    short: str = ""  # the cause first, for a table cell


@dataclass
class HealthResult:
    ok: bool
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    verdict: Verdict | None = None

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)


def _get(session: requests.Session, url: str, timeout: float) -> tuple[bool, str]:
    try:
        r = session.get(url, timeout=timeout)
    except requests.RequestException as e:
        return False, f"no answer ({type(e).__name__}: {e})"
    body = r.text.strip().replace("\n", " ")[:200]
    return r.status_code == 200, f"HTTP {r.status_code} {body}".strip()


def check_once(http_url: str, metrics_url: str, models: list[str], timeout: float = 5) -> HealthResult:
    with requests.Session() as s:
        return _check(s, http_url, metrics_url, models, timeout)


def _check(s: requests.Session, http_url: str, metrics_url: str, models: list[str], timeout: float) -> HealthResult:
    checks = []
    for path in ("/v2/health/live", "/v2/health/ready"):
        ok, detail = _get(s, http_url + path, timeout)
        checks.append(Check(http_url + path, ok, detail))
        if not ok:
            return HealthResult(False, checks)
    for m in models:
        url = f"{http_url}/v2/models/{m}/ready"
        ok, detail = _get(s, url, timeout)
        checks.append(Check(url, ok, detail))
    url = metrics_url + "/metrics"
    try:
        r = s.get(url, timeout=timeout)
        ok = r.status_code == 200 and "nv_inference_request_success" in r.text
        detail = f"HTTP {r.status_code}" + ("" if ok else ", no nv_inference_request_success")
    except requests.RequestException as e:
        ok, detail = False, f"no answer ({type(e).__name__})"
    checks.append(Check(url, ok, detail))
    return HealthResult(all(c.ok for c in checks), checks)


def wait_healthy(http_url: str, metrics_url: str, models: list[str], timeout: float = 180,
                 request_timeout: float = 5, interval: float = 1.0, watch=None,
                 watch_every: float = 2.0) -> HealthResult:
    """Retry until everything answers or ``timeout`` seconds pass. ``watch()`` (the unit and the
    container, see UnitWatch) is asked every ``watch_every`` seconds meanwhile; a Verdict from it
    ends the wait at once (a start that only takes long never gives one)."""
    t0 = time.monotonic()
    last_watch = None
    while True:
        res = check_once(http_url, metrics_url, models, request_timeout)
        res.seconds = time.monotonic() - t0
        if res.ok or res.seconds >= timeout:
            return res
        if watch is not None and (last_watch is None or time.monotonic() - last_watch >= watch_every):
            last_watch = time.monotonic()
            verdict = watch()
            if verdict is not None:
                res.verdict, res.seconds = verdict, time.monotonic() - t0
                return res
        time.sleep(interval)


class SSHTunnel:
    """Forward 127.0.0.1:<random> to ``remote_port`` on the host over an open paramiko transport.
    ``channel_timeout``: seconds opening a channel, or sending into one, may wait for the host
    (its dead-link bound); a request through a dead tunnel then fails instead of hanging."""

    def __init__(self, transport, remote_port: int, remote_host: str = "127.0.0.1",
                 channel_timeout: float = 30):
        self.transport, self.remote = transport, (remote_host, remote_port)
        self.channel_timeout = channel_timeout
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._open: list = []
        #: why the last channel could not be opened (the client's connection was closed): said in
        #: the gate's report next to the request that failed, instead of a bare closed connection
        self.error = ""
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, addr = self.sock.accept()
            except OSError:
                continue
            try:
                chan = self.transport.open_channel("direct-tcpip", self.remote, addr,
                                                   timeout=self.channel_timeout)
                chan.settimeout(self.channel_timeout)
            except (SSHException, OSError, EOFError) as e:  # the host refused or the link is gone
                self.error = (f"the SSH tunnel to {self.remote[0]}:{self.remote[1]} on the host could not open "
                              f"a channel: {type(e).__name__}: {e}")
                client.close()
                continue
            self.error = ""
            self._open += [client, chan]
            threading.Thread(target=self._pipe, args=(client, chan), daemon=True).start()

    def _pipe(self, client, chan):
        with contextlib.suppress(OSError, EOFError, ValueError):
            self._pump(client, chan)

    def _pump(self, client, chan):
        with contextlib.closing(client), contextlib.closing(chan):
            while not self._stop.is_set():
                r, _, _ = select.select([client, chan], [], [], 0.5)
                if client in r:
                    data = client.recv(65536)
                    if not data:
                        return
                    chan.sendall(data)
                if chan in r:
                    data = chan.recv(65536)
                    if not data:
                        return
                    client.sendall(data)

    def close(self):
        self._stop.set()
        self.sock.close()
        for s in self._open:
            with contextlib.suppress(OSError, EOFError):
                s.close()


def journal_excerpt(lines: list[str], keep: int = 15) -> list[str]:
    """The unit journal's error lines (Triton's E-level log lines, failures), else its tail."""
    import re

    bad = [ln for ln in lines if re.search(r"\]: E\d{4} |\bE\d{4} \d|error|failed|unavailable", ln, re.I)
           and "| " not in ln]
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


# --- watching the unit and the container while the gate waits ---------------------------------

SECTION = "@@tritonfleet-watch@@"
SHOW_PROPS = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus", "InvocationID")
# Docker's words for causes no restart can cure
DOCKER_DEFINITIVE = (
    (r"Unable to find image .* locally|No such image|pull access denied|manifest unknown|"
     r"repository does not exist", "the image is not on the host (and cannot be pulled)"),
    (r"port is already allocated|address already in use|bind: .*in use", "a port Triton publishes is already bound"),
)
TRITON_LINE = re.compile(r"\b[IWE]\d{4} [\d:.]+\s+\d+ \S+\] ")
ERROR_LINE = re.compile(r"\bE\d{4} [\d:.]+\s+\d+ \S+\] (.*)")


def watch_command(service: str, container: str, base: str, lines: int = 300) -> str:
    """One remote command: the unit's state, its journal (JSON, with each entry's start of the
    unit), the container, the live release and the last healthy deployment."""
    unit = q(f"{service}.service")
    props = " ".join(f"-p {p}" for p in SHOW_PROPS)
    return "; ".join([
        f"systemctl show {props} {unit} 2>/dev/null", "echo Now=$(date +%s%6N)", f"echo {SECTION}",
        f"journalctl -u {unit} -n {lines} --no-pager -o json "
        "--output-fields=MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID 2>/dev/null", f"echo {SECTION}",
        f"docker inspect --format '{{{{.Config.Image}}}} {{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {q(container)} "
        "2>/dev/null", f"echo {SECTION}",
        f"readlink {q(base)}/model_repository", f"echo {SECTION}",
        f"tail -n 1 {q(base)}/history.jsonl 2>/dev/null", "true",
    ])


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
        return self.show.get("SubState") in ("auto-restart", "failed", "dead", "exited") or \
            self.show.get("ActiveState") in ("failed", "inactive")

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
        starts = self.starts[-(self.restarts + 1):] if self.starts else []
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
    for ln in lines[first + 1:]:  # a message written over several journal lines
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
        return Verdict(why + (f"; {last.cause}" if last.cause else ""), error_words(last.lines),
                       f"{last.cause} ({why})" if last.cause else why)
    for s in ended:
        line, meaning = docker_cause(s.lines)
        if line:
            return Verdict(f"{meaning}: {line}", trim([line]), f"{meaning}: {line}")
    if len(ended) >= 2:
        a, b = ended[-2], ended[-1]
        if a.cause and a.cause == b.cause:
            return Verdict(f"{service}.service stopped with the same error on two consecutive starts "
                           f"(restart counter {snap.restarts}): {b.cause}", error_words(b.lines),
                           f"{b.cause} (the same error on two starts)")
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
        read the host decides nothing, and the gate goes on waiting on Triton's own answers."""
        from .connection import CONNECTION_ERRORS
        from .fleet import FleetError

        try:
            self.last = parse_watch(self.run(self.command))
        except (FleetError, *CONNECTION_ERRORS) as e:
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
    what = (f"{service}.service is {st}"
            + (f", systemd restarted it {snap.restarts} time{'s' if snap.restarts != 1 else ''}"
               if snap.restarts else "")
            + ("; Triton runs but does not pass the gate" if running and not failing
               else "; tritonserver failed this start too and exits: nothing is served" if running
               else "; nothing is served"))
    what += f"; live model release {snap.release or 'none'}"
    last = snap.last or {}
    if last.get("release"):
        what += (f"; last healthy deployment: release {last['release']}, {last.get('image', '?')} "
                 f"({last.get('time', '?')}, {last.get('action', 'deploy')})")
        differs = last["release"] != snap.release
        if rollout:
            fix = "the rollout rolls this host back to what it served before"
        else:
            from .failure import rollback_command

            fix = (("the host served before this deploy; put that deployment back with: "
                    if differs else "to return to the last healthy deployment: ") + rollback_command(host_name))
    elif snap.last_error:
        what += f"; the last healthy deployment cannot be told ({snap.last_error})"
        fix = ""
    else:
        what += "; no healthy deployment was ever recorded on this host"
        fix = ""
    return what, fix


def gate(get, address: str, models: list[str], transport=None, timeout: float | None = None,
         watch=None, warm=None) -> HealthResult:
    """Wait until the host whose tunables ``get`` reads is healthy (or ``timeout`` passes, or
    ``watch`` finds a definitive cause). ``address``: its SSH address; ``transport``: its open
    paramiko transport (health_via ssh). ``warm(http_url)``: run once healthy (the warm inference
    gate, tritonfleet.warmup); a Verdict it returns fails the gate."""
    from . import config
    from .connection import dead_after

    via = get("health_via")
    tunnels: list[SSHTunnel] = []
    http_port, metrics_port = get("triton_http_port"), get("triton_metrics_port")
    if via == "ssh":
        if transport is None:
            raise config.ConfigError("health_via = 'ssh' needs the host's SSH connection")
        try:
            bound = dead_after({k: get(k) for k in ("ssh_keepalive_interval", "ssh_keepalive_count")})
        except ValueError as e:
            raise config.ConfigError(str(e)) from e
        tunnels = [SSHTunnel(transport, http_port, channel_timeout=bound),
                   SSHTunnel(transport, metrics_port, channel_timeout=bound)]
        http_url = f"http://127.0.0.1:{tunnels[0].port}"
        metrics_url = f"http://127.0.0.1:{tunnels[1].port}"
    elif via == "direct":
        addr = get("health_host") or address
        http_url, metrics_url = f"http://{addr}:{http_port}", f"http://{addr}:{metrics_port}"
    else:
        raise config.ConfigError(f"health_via must be 'direct' or 'ssh', not {via!r}")
    try:
        res = wait_healthy(http_url, metrics_url, models, get("health_timeout") if timeout is None else timeout,
                           get("health_request_timeout"), watch=watch)
        said = [t.error for t in tunnels if t.error]
        if not res.ok and said and res.first_failure is not None:  # why the tunnel's requests failed
            res.first_failure.detail += f" ({said[0]})"
        if res.ok and warm is not None:
            verdict = warm(http_url)
            if verdict is not None:
                res.ok, res.verdict = False, verdict
                res.checks.append(Check(f"{http_url}/v2/models/.../infer", False, verdict.short))
        return res
    finally:
        for t in tunnels:
            t.close()


def instance_failure(failure: Failure, get) -> Failure:
    """A failed gate's report naming the per-GPU instance (tritonfleet.pergpu) it was of."""
    name = pergpu.label(get)
    if name:
        failure.expected = f"{name}: {failure.expected}"
        failure.found = f"{name}: {failure.found}"
        failure.cause = f"{name}: {failure.cause}"
    return failure


def unit_watch(get, run) -> UnitWatch:
    return UnitWatch(run, get("triton_service"), get("triton_container_name"), get("triton_base_dir"))


def failure_of(res: HealthResult, host_name: str, models: list[str], watch: UnitWatch, timeout: float,
               rollout: bool = False) -> Failure:
    """The report of a failed gate."""
    service = watch.service
    snap = watch.last if res.verdict else (watch.read() or watch.last)
    bad = res.first_failure
    answer = f"{bad.endpoint} -> {bad.detail}" if bad else "no answer"
    if res.verdict:
        found = f"after {res.seconds:.0f}s, without waiting out health_timeout ({timeout:.0f}s): {res.verdict.cause}"
        cause, words = res.verdict.short or res.verdict.cause, res.verdict.words
    else:
        window = (snap.window(watch.since or 0) or snap.starts[-1:]) if snap else []
        start = window[-1] if window else None
        triton = start.cause if start else ""
        found = f"not healthy after {res.seconds:.0f}s (health_timeout): {answer}" + (
            f"; Triton's first error: {triton}" if triton else "")
        cause = (f"Triton: {triton}" if triton else answer)
        words = error_words(start.lines) if start else []
    now, fix = serving_now(snap, service, host_name, rollout)
    if snap is None and watch.error:
        now = f"unknown (the host could not be read: {watch.error[:200]})"
    if not fix:
        fix = "fix the cause above (the model: tritonfleet validate; the unit: journalctl -u " \
              f"{service}), then run the deploy again"
    else:
        fix += f"; then fix the cause above and run the deploy again (journalctl -u {service} shows the whole log)"
    return Failure(host_name, "health gate",
                   f"Triton live and ready, models {', '.join(models) or '(none)'} ready, metrics served, "
                   f"within health_timeout ({timeout:.0f}s)",
                   found, words, f"Triton's own words (journal of {service}.service, its last start)", now, fix,
                   cause=f"{cause}, after {res.seconds:.0f}s")


# host name -> {model: milliseconds} of the first inferences its gate sent in this run (the deploy
# records them with the healthy deployment in the host's history)
WARM_LATENCY: dict[str, dict[str, float]] = {}


def warm_check(repo: str, models: list[str], timeout: float, say, keep=None):
    """The warm inference gate as gate()'s ``warm``: one inference per model (tritonfleet.warmup);
    a Verdict with Triton's answer when one fails. ``keep(latencies)`` when all passed."""
    from pathlib import Path

    from .warmup import warm

    def run(http_url: str) -> Verdict | None:
        res = warm(http_url, Path(repo), models, timeout)
        if res.ok:
            done = ", ".join(f"{m} {ms:.0f} ms" for m, ms in res.latency_ms.items())
            skipped = "; ".join(f"{m} not warmed: {why}" for m, why in res.skipped.items())
            say(f"first inference: {done or 'none'}" + (f" ({skipped})" if skipped else ""))
            if keep is not None:
                keep(dict(res.latency_ms))
            return None
        cause = f"model {res.model} is ready but {res.cause}"
        return Verdict(cause, [res.answer], short=f"{cause}: {res.answer[:160]}")

    return run


def gate_current_host(models: list[str], clear_failure: bool = False, repo: str | None = None) -> HealthResult:
    """pyinfra callback: health-gate the host being deployed; fail it with the report. Once
    healthy, ``clear_failure`` removes the report an earlier failed run left on the host (for
    `tritonfleet status`): part of the check, so a healthy re-run still changes nothing. With
    ``repo`` (the rendered repository the deploy sent) and health_warm_inference, each model then
    answers one real inference (tritonfleet.warmup)."""
    from pyinfra import host, logger

    from . import config
    from .failure import in_rollout

    transport = None
    if config.get("health_via") == "ssh":
        transport = host.connector.client.get_transport()

    def run(command: str) -> str:
        _, out = host.run_shell_command(command, print_output=False, print_input=False)
        return "\n".join(out.stdout_lines)

    from .facts.gpu import instance_gets

    timeout = float(config.get("health_timeout"))
    gets = instance_gets()
    seconds = 0.0
    for i, g in enumerate(gets):
        watch = unit_watch(g, run)
        warm = None
        if repo and config.get("health_warm_inference"):
            who = ": ".join(filter(None, (host.name, pergpu.label(g))))
            warm = warm_check(repo, models, max(float(config.get("health_request_timeout")), 30.0),
                              lambda text, who=who: logger.info(f"{who}: {text}"),
                              (lambda ms: WARM_LATENCY.__setitem__(host.name, ms)) if i == 0 else None)
        try:
            res = gate(g, host.data.get("ssh_hostname") or host.name, models, transport, timeout, watch, warm)
        except config.ConfigError as e:
            raise config.ConfigError(f"{host.name}: {e}") from e
        if not res.ok:
            raise HealthError(instance_failure(failure_of(res, host.name, models, watch, timeout,
                                                          rollout=in_rollout()), g))
        seconds += res.seconds
    res.seconds = seconds
    logger.info(f"{host.name}: healthy in {res.seconds:.1f}s ({len(models)} models ready, metrics served"
                + (f", {len(gets)} Triton instances, one per GPU)" if pergpu.enabled(config.get) else ")"))
    if clear_failure:
        from .failure import HOST_RECORD

        run(f"rm -f {HOST_RECORD}")
    return res
