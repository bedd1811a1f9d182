"""Take a host out of its load balancer before Triton restarts, and put it back once healthy.

Two implementations of one interface (:class:`Balancer`):

* :class:`HAProxy`: HAProxy's runtime API (the ``stats socket ... level admin`` of its global
  section; a unix socket path or ``host:port``, one or several HAProxy instances in front of the
  same servers). ``set server <backend>/<server> state drain`` stops new requests to the server
  while those in flight finish; its current sessions (``scur`` of ``show stat``) say when they
  have; ``set server ... state ready`` puts it back. Who took a server out is in its state: a
  deploy drains (``state drain``), the quarantine receiver and operators hold it
  (``state maint``: :meth:`Balancer.hold`, or a balancer made with ``hold=True``, whose drain
  holds). A deploy never readies a held server, and readies a drained one only when its own run,
  or a cut run whose marker is on the host (tritonfleet.serving.ops.lb), drained it.
* :class:`Hooks`: two commands run on the control machine (``lb_drain_command``,
  ``lb_ready_command``) with the host's name and address in the environment
  (``TRITONFLEET_HOST``, ``TRITONFLEET_ADDRESS``, ``TRITONFLEET_HTTP_PORT``). In-flight requests
  are read from Triton itself: its pending-request gauge is 0 and its request counters stay still
  for :data:`QUIET_SECONDS`.

The drain fails safe: requests in flight that cannot be read (Triton's metrics do not answer, answer
with an error, or not as Triton's; HAProxy's runtime API does not answer) never count as none. The
host counts as busy, the wait goes on (reading again) until ``lb_drain_timeout``, and then the
drain fails, saying why: Triton is not restarted, the host goes back in. Only a host whose Triton
does not run at all (its unit inactive or failed) has nothing in flight without its metrics.

Nothing here knows pyinfra: ``tritonfleet.serving.ops.lb`` runs these in a deploy (drain before a restart,
ready after the health gate), with the host's own ``run`` for Triton's metrics.

HAProxy's runtime API (management guide, "Unix Socket commands": ``set server <backend>/<server>
state [ ready | drain | maint ]``, ``show stat`` (CSV; ``scur``: current sessions, ``status``),
``show servers state [<backend>]`` (``srv_admin_state``: bit 0x01 forced maintenance, 0x08 forced
drain): https://docs.haproxy.org/2.6/management.html#9.3). Tested against Debian 12's haproxy
2.6 (tests/unit/serving/test_drain.py).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..core.errors import TritonfleetError
from ..core.shell import q
from ..settings.access import Settings
from .triton_http import parse

# Hooks: Triton's request counters must stay still this long (and its queue be empty) before the
# host counts as idle.
QUIET_SECONDS = 2.0
POLL_SECONDS = 0.25
KINDS = ("haproxy", "hooks")
# srv_admin_state bits (HAProxy's SRV_ADMF_*): forced maintenance, maintenance inherited from a
# tracked server, from the config; forced drain, drain inherited.
ADMIN_MAINT = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
ADMIN_DRAIN = 0x08


class DrainError(TritonfleetError, RuntimeError):
    """The load balancer could not be asked, or the host did not go idle in time."""


class InFlightUnknown(DrainError):
    """The requests in flight cannot be read: the host counts as busy (never as idle)."""


class TritonNotRunning(DrainError):
    """No Triton runs on the host (its unit is inactive or failed): nothing can be in flight."""


class RuntimeAPI:
    """One HAProxy runtime API endpoint: a unix socket path, or ``host:port`` (``ipv4@``/``ipv6@``
    prefixes as HAProxy writes them are accepted). Each command is one connection (HAProxy's
    non-interactive mode answers and closes)."""

    def __init__(self, address: str, timeout: float = 5.0):
        self.address = address
        self.timeout = timeout

    def _connect(self) -> socket.socket:
        addr = self.address
        for prefix in ("unix@", "ipv4@", "ipv6@", "tcp@"):
            if addr.startswith(prefix):
                addr = addr[len(prefix) :]
        if addr.startswith("/") or addr.startswith("."):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: object = addr
        else:
            host, _, port = addr.rpartition(":")
            if not host or not port.isdigit():
                raise DrainError(
                    f"HAProxy runtime API address {self.address!r} is neither a socket path nor "
                    "host:port (lb_haproxy_sockets)"
                )
            host = host.strip("[]")
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            target = (host, int(port))
        s.settimeout(self.timeout)
        try:
            s.connect(target)
        except OSError as e:
            s.close()
            raise DrainError(f"cannot reach HAProxy's runtime API at {self.address}: {e}") from e
        return s

    def command(self, line: str) -> str:
        if "\n" in line or ";" in line:
            raise DrainError(f"refusing a runtime API command with a newline or ';': {line!r}")
        s = self._connect()
        try:
            s.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except OSError as e:
            raise DrainError(f"HAProxy's runtime API at {self.address} did not answer {line.split()[0:2]}: {e}") from e
        finally:
            s.close()
        return b"".join(chunks).decode(errors="replace")


def parse_stat(text: str) -> list[dict[str, str]]:
    """``show stat`` CSV (first line ``# pxname,svname,...``) as one dict per line."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("# "):
        raise DrainError(f"unexpected answer to show stat: {text[:200]!r}")
    names = lines[0][2:].split(",")
    return [dict(zip(names, ln.split(","), strict=False)) for ln in lines[1:]]


def parse_servers_state(text: str) -> list[dict[str, str]]:
    """``show servers state`` (a version line, ``# be_id be_name ...`` header, one line a server)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if ln.startswith("# ")), None)
    if header is None:
        raise DrainError(f"unexpected answer to show servers state: {text[:200]!r}")
    names = header[2:].split()
    return [
        dict(zip(names, ln.split(), strict=False))
        for ln in lines
        if not ln.startswith("#") and len(ln.split()) >= len(names) // 2
    ]


@dataclass
class ServerState:
    """One server as HAProxy reports it (summed over every HAProxy instance)."""

    status: str  # show stat's status: UP, DOWN, DRAIN, MAINT, "no check", "UP 1/2", ...
    sessions: int  # current sessions (scur), summed
    admin: int  # srv_admin_state bits, or-ed

    @property
    def maintenance(self) -> bool:
        return bool(self.admin & ADMIN_MAINT)

    @property
    def drained(self) -> bool:
        return bool(self.admin & ADMIN_DRAIN)

    @property
    def serving(self) -> bool:
        """HAProxy sends it new requests: not drained, not in maintenance, up by its checks."""
        return not self.admin and (self.status.startswith("UP") or self.status == "no check")


def backend_states(apis: list[RuntimeAPI], backend: str) -> dict[str, ServerState]:
    """Every server of ``backend`` as ``HAProxy.state`` reads one, in two runtime API commands an
    instance (a receiver's round over hundreds of servers); a server any instance does not report
    whole is left out (its own ``state()`` says why)."""
    per: dict[str, list[tuple[str, dict, int, int]]] = {}
    for api in apis:
        stat = {r.get("svname", ""): r for r in parse_stat(api.command("show stat")) if r.get("pxname") == backend}
        for st in parse_servers_state(api.command(f"show servers state {backend}")):
            row = stat.get(st.get("srv_name", ""))
            admin_text = str(st.get("srv_admin_state", ""))
            if row is None or not admin_text.isdigit() or not str(row.get("scur", "")).isdigit():
                continue
            per.setdefault(st["srv_name"], []).append((api.address, row, int(admin_text), int(row["scur"])))
    out = {}
    for name, seen in per.items():
        if len(seen) != len(apis):
            continue
        status = [row.get("status", "") for _, row, _, _ in seen]
        admin = 0
        for _, _, adm, _ in seen:
            admin |= adm
        worst = next((s for s in status if not s.startswith("UP") and s != "no check"), status[0])
        out[name] = ServerState(worst, sum(n for *_, n in seen), admin)
    return out


class Balancer:
    """What a restart needs from a load balancer."""

    kind = ""
    #: the last drain() took the host out itself (it was serving); False when it found it out already
    took_out = False

    def describe(self) -> str:
        raise NotImplementedError

    def drain(self) -> str:
        """Stop new requests to the host; returns what was done (or why nothing was)."""
        raise NotImplementedError

    def in_flight(self) -> int:
        """Requests the host still works on (or a load balancer still has open to it)."""
        raise NotImplementedError

    def ready(self) -> str:
        """Put the host back; returns what was done."""
        raise NotImplementedError

    def hold(self) -> str:
        """Take the host out for the quarantine or an operator (a deploy never puts it back)."""
        return self.drain()

    def held(self) -> str:
        """Who holds the host out, where the balancer can tell ("" when none does)."""
        return ""

    def wait_serving(self, timeout: float) -> str:
        """After ready: wait until the load balancer sends the host requests again."""
        return ""

    def wait_idle(self, timeout: float, sleep=time.sleep, clock=time.monotonic, say=None) -> float:
        """Wait until :meth:`in_flight` is 0; returns the seconds it took. DrainError after
        ``timeout`` seconds, naming what is still in flight; InFlightUnknown when the last read
        could not tell (a read that fails counts as busy: it is read again until the timeout).
        ``say(text)``: told once when a read fails."""
        t0 = clock()
        unknown = ""
        while True:
            try:
                n: int | None = self.in_flight()
                unknown = ""
            except InFlightUnknown as e:
                if not unknown and say is not None:
                    say(
                        f"the requests in flight cannot be read ({e}): the host counts as busy, read again "
                        f"until lb_drain_timeout ({timeout:.0f}s); Triton is not restarted meanwhile"
                    )
                n, unknown = None, str(e)
            if n == 0:
                return clock() - t0
            if clock() - t0 >= timeout:
                if unknown:
                    raise InFlightUnknown(
                        f"the requests in flight could not be read for {timeout:.0f}s (lb_drain_timeout): {unknown}"
                    )
                raise DrainError(f"{n} request(s) still in flight after {timeout:.0f}s (lb_drain_timeout)")
            sleep(POLL_SECONDS)


class HAProxy(Balancer):
    kind = "haproxy"

    def __init__(self, sockets: list[str], backend: str, server: str, timeout: float = 5.0, hold: bool = False):
        """``hold``: this balancer is the quarantine's or an operator's: drain() holds the server
        (maintenance) and ready() ends the hold."""
        if not sockets:
            raise DrainError(
                "lb = 'haproxy' needs lb_haproxy_sockets (the runtime API: a unix socket path or "
                "host:port of `stats socket ... level admin`)"
            )
        for word in (backend, server):
            if not word or any(c.isspace() or c in "/;" for c in word):
                raise DrainError(
                    f"HAProxy backend and server names must be plain words, not {word!r} "
                    "(lb_haproxy_backend, lb_haproxy_server)"
                )
        self.apis = [RuntimeAPI(s, timeout) for s in sockets]
        self.backend, self.server = backend, server
        self.holding = hold

    def describe(self) -> str:
        return f"haproxy {self.backend}/{self.server}"

    def state(self) -> ServerState:
        status, sessions, admin = [], 0, 0
        for api in self.apis:
            rows = [
                r
                for r in parse_stat(api.command("show stat"))
                if r.get("pxname") == self.backend and r.get("svname") == self.server
            ]
            if not rows:
                raise DrainError(
                    f"HAProxy at {api.address} has no server {self.server!r} in backend "
                    f"{self.backend!r} (lb_haproxy_backend / lb_haproxy_server; servers are named "
                    "after the inventory host unless lb_haproxy_server says otherwise)"
                )
            row = rows[0]
            st = [
                r
                for r in parse_servers_state(api.command(f"show servers state {self.backend}"))
                if r.get("srv_name") == self.server
            ]
            # what cannot be read is said, never taken for "no sessions" or "no admin state"
            if not st or not str(st[0].get("srv_admin_state", "")).isdigit():
                raise DrainError(
                    f"HAProxy at {api.address}: `show servers state {self.backend}` gives no admin "
                    f"state for {self.server!r}: {st[0] if st else 'no such line'}"
                )
            if not str(row.get("scur", "")).isdigit():
                raise DrainError(
                    f"HAProxy at {api.address}: `show stat` gives no current sessions (scur) for "
                    f"{self.backend}/{self.server}: {row.get('scur')!r}"
                )
            adm = int(st[0]["srv_admin_state"])
            scur = int(row["scur"])
            status.append(row.get("status", ""))
            sessions += scur
            admin |= adm
        worst = next((s for s in status if not s.startswith("UP") and s != "no check"), status[0])
        return ServerState(worst, sessions, admin)

    def _set(self, state: str) -> None:
        for api in self.apis:
            answer = api.command(f"set server {self.backend}/{self.server} state {state}").strip()
            if answer:
                raise DrainError(
                    f"HAProxy at {api.address} refused `set server {self.backend}/{self.server} "
                    f"state {state}`: {answer}"
                )

    def drain(self) -> str:
        if self.holding:
            return self.hold()
        self.took_out = False
        st = self.state()
        if st.maintenance:
            return f"{self.describe()} is held in maintenance (the quarantine's or an operator's): left as it is"
        if st.drained:
            return f"{self.describe()} was already draining"
        self._set("drain")
        self.took_out = True
        return f"{self.describe()} set to drain"

    def hold(self) -> str:
        """``state maint``: out of rotation until the holder readies it; a deploy leaves it so."""
        self.took_out = False
        st = self.state()
        if st.maintenance:
            return f"{self.describe()} was already held in maintenance"
        self._set("maint")
        self.took_out = True
        return f"{self.describe()} held in maintenance"

    def held(self) -> str:
        st = self.state()
        if st.maintenance:
            return f"held out of rotation by the quarantine or an operator ({self.describe()} in MAINT)"
        return ""

    def in_flight(self) -> int:
        return self.state().sessions

    def ready(self) -> str:
        """Put the server back: a deploy's balancer only from its drain (never from maintenance);
        a holding one (``hold``) from its hold or a drain."""
        st = self.state()
        if st.maintenance and not self.holding:
            return ""
        if not st.drained and not st.maintenance:
            return ""
        self._set("ready")
        return f"{self.describe()} set to ready"

    def wait_serving(self, timeout: float, sleep=time.sleep, clock=time.monotonic) -> str:
        """HAProxy's own health checks must pass again (``rise``) before it sends requests: wait
        for UP (or ``no check``) on every instance."""
        t0 = clock()
        while True:
            st = self.state()
            if st.maintenance or st.serving:
                return f"{st.status} after {clock() - t0:.1f}s"
            if clock() - t0 >= timeout:
                raise DrainError(
                    f"{self.describe()} is ready but HAProxy reports it {st.status!r} after "
                    f"{timeout:.0f}s (lb_drain_timeout): its health check does not pass"
                )
            sleep(POLL_SECONDS)


_TRITON_FAMILY = re.compile(r"^(# (HELP|TYPE) )?nv_\w+", re.MULTILINE)


def triton_busy(metrics_text: str | list[str]) -> tuple[float, float]:
    """(requests queued in Triton, requests Triton finished so far) from its metrics text (one
    Triton's, or a list: one per Triton of the host): ``nv_inference_pending_request_count``
    summed, and ``nv_inference_request_success`` + ``nv_inference_request_failure`` summed over
    models. ValueError for an answer that is not Triton's metrics (no ``nv_`` family: another
    service on that port, an error page) or not Prometheus's text format."""
    pending = done = 0.0
    for text in [metrics_text] if isinstance(metrics_text, str) else metrics_text:
        if not _TRITON_FAMILY.search(text):
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "an empty answer")
            raise ValueError(f"the answer is not Triton's metrics (no nv_ metric): {first[:160]!r}")
        for s in parse(text):
            if s.name == "nv_inference_pending_request_count":
                pending += s.value
            elif s.name in ("nv_inference_request_success", "nv_inference_request_failure"):
                done += s.value
    return pending, done


METRICS_MARK = "@@tritonfleet-metrics"
#: a unit in these states runs no Triton: nothing can be in flight (systemctl is-active's words)
NOT_RUNNING = ("inactive", "failed")


def metrics_command(instances: list[tuple[str, str]]) -> str:
    """One shell command reading the metrics of every Triton of a host: ``instances`` is
    [(systemd service, metrics URL)]. curl fails on an HTTP error (``-f``); a read that fails says
    curl's exit status and whether the unit runs (``systemctl is-active``)."""
    parts = []
    for service, url in instances:
        parts.append(
            f"echo {q(f'{METRICS_MARK} {service} {url}')}; curl -sSf -m 5 {q(url)} 2>&1; rc=$?; "
            f'[ $rc = 0 ] || echo "{METRICS_MARK}-failed $rc $(systemctl is-active '
            f'{q(service + ".service")} 2>/dev/null)"'
        )
    return "; ".join(parts) + "; true"


def read_metrics(lines: list[str]) -> list[str]:
    """The metrics texts :func:`metrics_command` read, one per Triton that runs. TritonNotRunning
    when none runs; DrainError naming the URL and curl's words when one whose unit may run did not
    answer (it may be serving: its requests in flight are unknown)."""
    reads: list[dict] = []
    for line in lines:
        if line.startswith(METRICS_MARK + "-failed"):
            if reads:
                rc, _, state = line[len(METRICS_MARK) + len("-failed") :].strip().partition(" ")
                reads[-1]["failed"], reads[-1]["state"] = rc, state.strip() or "unknown"
        elif line.startswith(METRICS_MARK + " "):
            service, _, url = line[len(METRICS_MARK) + 1 :].partition(" ")
            reads.append({"service": service, "url": url, "lines": [], "failed": "", "state": ""})
        elif reads:
            reads[-1]["lines"].append(line)
    if not reads:
        raise DrainError(
            "Triton's metrics were not read (the command printed nothing it knows): "
            + " | ".join(ln.strip() for ln in lines if ln.strip())[:300]
        )
    texts, down = [], []
    for r in reads:
        if not r["failed"]:
            texts.append("\n".join(r["lines"]) + "\n")
            continue
        said = " ".join(ln.strip() for ln in r["lines"] if ln.strip())[:300] or f"curl exited {r['failed']}"
        if r["state"] in NOT_RUNNING:
            down.append(f"{r['service']}.service is {r['state']}")
            continue
        raise DrainError(
            f"Triton's metrics at {r['url']} do not answer ({said}) while {r['service']}.service is {r['state']}"
        )
    if not texts:
        raise TritonNotRunning(f"no Triton runs ({', '.join(down)}): no request can be in flight")
    return texts


class Hooks(Balancer):
    kind = "hooks"

    def __init__(
        self,
        drain_command: str | None,
        ready_command: str | None,
        env: dict[str, str],
        metrics: Callable[[], str | list[str]],
        timeout: float = 120.0,
    ):
        if not drain_command or not ready_command:
            raise DrainError("lb = 'hooks' needs both lb_drain_command and lb_ready_command")
        self.drain_command, self.ready_command = drain_command, ready_command
        self.env, self.metrics, self.timeout = env, metrics, timeout
        self._last: tuple[float, float] | None = None  # (counter value, when it last moved)
        #: why the last read found nothing in flight without reading Triton (no Triton runs)
        self.note = ""

    def describe(self) -> str:
        return "hooks"

    def _run(self, command: str, what: str) -> str:
        try:
            res = subprocess.run(
                command,
                shell=True,
                env={**os.environ, **self.env},
                capture_output=True,
                text=True,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            raise DrainError(f"{what} did not finish within {self.timeout:.0f}s: {command}") from e
        out = (res.stdout + res.stderr).strip()
        if res.returncode != 0:
            raise DrainError(f"{what} failed (exit {res.returncode}): {command}" + (f": {out[-500:]}" if out else ""))
        return out

    def drain(self) -> str:
        self.took_out = False
        out = self._run(self.drain_command, "lb_drain_command")
        self.took_out = True
        return "lb_drain_command ran" + (f": {out.splitlines()[-1][:200]}" if out else "")

    def in_flight(self, clock=time.monotonic) -> int:
        """Pending requests; while the request counters still move, at least 1. No Triton running:
        0 (``note`` says so). Metrics that cannot be read: InFlightUnknown (never 0)."""
        try:
            pending, done = triton_busy(self.metrics())
        except TritonNotRunning as e:
            self.note = str(e)
            return 0
        except (DrainError, ValueError, OSError) as e:  # OSError: the host could not be asked
            raise InFlightUnknown(str(e)) from e
        self.note = ""
        now = clock()
        if self._last is None or self._last[0] != done:
            self._last = (done, now)
        still = now - self._last[1] >= QUIET_SECONDS
        return int(pending) if pending else (0 if still else 1)

    def ready(self) -> str:
        out = self._run(self.ready_command, "lb_ready_command")
        return "lb_ready_command ran" + (f": {out.splitlines()[-1][:200]}" if out else "")


def from_settings(
    settings: Settings, host_name: str, address: str, metrics: Callable[[], str], hold: bool = False
) -> Balancer | None:
    """The host's balancer from its tunables (``settings``), or None when ``lb`` is not set.
    ``hold``: the quarantine's (HAProxy: its drain holds the server in maintenance)."""
    kind = settings.get("lb")
    if not kind:
        return None
    if kind not in KINDS:
        raise DrainError(f"lb must be one of {', '.join(KINDS)} or None, not {kind!r} (group data)")
    if kind == "haproxy":
        sockets = settings.get("lb_haproxy_sockets") or []
        if isinstance(sockets, str):
            sockets = [sockets]
        return HAProxy(
            list(sockets), settings.get("lb_haproxy_backend"), settings.get("lb_haproxy_server") or host_name, hold=hold
        )
    env = {
        "TRITONFLEET_HOST": host_name,
        "TRITONFLEET_ADDRESS": address,
        "TRITONFLEET_HTTP_PORT": str(settings.get("triton_http_port")),
    }
    return Hooks(
        settings.get("lb_drain_command"),
        settings.get("lb_ready_command"),
        env,
        metrics,
        float(settings.get("lb_drain_timeout")),
    )


def stop_timeouts(exit_timeout: int | float) -> dict[str, int]:
    """Triton's ``--exit-timeout-secs``, ``docker stop -t`` and systemd's ``TimeoutStopSec`` from
    one tunable (``triton_stop_timeout``): Triton waits that long for in-flight requests, Docker
    gives it 10 s more to unload models and exit before SIGKILL, systemd 20 s more than Docker
    before it kills the unit."""
    t = int(exit_timeout)
    if t < 0:
        raise ValueError("triton_stop_timeout must be >= 0")
    return {"exit_timeout_secs": t, "docker_stop": t + 10, "systemd_stop": t + 30}
