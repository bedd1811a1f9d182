"""The load-balancer drain inside a deploy (tritonfleet.serving.drain), run on the control machine.

``drain`` is added right before any operation that restarts Triton (only then: a converged host
plans no change): the host is taken out of its load balancer and the operation waits until no
request is in flight. ``ready`` runs after the health gate passed: the host goes back in only
when a deploy took it out: this run (its drain set the drain), or a run that was cut before its
ready (its marker, :data:`MARKER`, is on the host). A server held in maintenance (the quarantine
receiver, an operator) or drained by anyone else stays out, and the run says who holds it. With
hooks the balancer's state cannot be read: the ready command runs after this run's own drain or
over a cut run's marker, never otherwise. A host that fails between the two stays out.

The marker (root, 0600, naming the run) is written when the drain takes the host out and removed
when ready puts it back. A converged run sends nothing for it: HAProxy's state is read first on
the control machine, and the marker is read only for a server in drain that this run did not
drain (hooks: every healthy run that did not drain, as there is no state to read).
"""

from __future__ import annotations

from typing import cast

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.context import state

from ...core import runid
from ...core.connection_errors import CONNECTION_ERRORS
from ...core.report import fail, reported
from ...core.shell import q
from ...settings import access
from ...settings.access import Settings
from .. import drain, per_gpu
from ..health import gate_current_host

_DRAINS: set[tuple[int, str]] = set()  # (pyinfra state, host) planned to be drained in this run
_TOOK_OUT: set[tuple[int, str]] = set()  # (pyinfra state, host) this run's drain took out of the balancer
#: on the host: a deploy's drain took the host out and its ready has not put it back yet
MARKER = "/var/lib/tritonfleet/lb-drained"


def enabled() -> bool:
    return bool(access.get("lb"))


def note_drain() -> None:
    _DRAINS.add((id(state._get_module()), host.name))


def drains() -> bool:
    """A drain is planned for the current host in this run."""
    return (id(state._get_module()), host.name) in _DRAINS


def drain_command(why: str) -> FunctionCommand:
    """The drain as a command of another operation (the reboot)."""
    note_drain()
    return FunctionCommand(reported, (drain_now, (why,), {}), {})


def _metrics_url(settings: Settings) -> str:
    bind = settings.get("triton_metrics_bind")
    addr = bind if bind and bind not in ("0.0.0.0", "::") else "127.0.0.1"
    return f"http://{addr}:{int(settings.get('triton_metrics_port'))}/metrics"


def _instances() -> list[tuple[str, str]]:
    """(systemd service, metrics URL) of every Triton on the host: the single unit, or with
    triton_per_gpu each per-GPU unit the host has (listed on the host: the drain runs when the
    operations execute, after the units were written)."""
    settings = access.current()
    if not per_gpu.enabled(settings):
        return [(settings.get("triton_service"), _metrics_url(settings))]
    _, out = host.run_shell_command(per_gpu.list_units_command(settings), print_output=False, print_input=False)
    instances = [per_gpu.instance_get(settings, i) for i in per_gpu.indexes(settings, out.stdout_lines)]
    return [(i.get("triton_service"), _metrics_url(i)) for i in instances] or [
        (settings.get("triton_service"), _metrics_url(settings))
    ]


def _metrics_reader():
    """Triton's metrics, read on the host (works whatever the binds and health_via are): every
    Triton of the host in one command (tritonfleet.serving.drain.read_metrics says what a failed read
    means). The host's instances are listed once, on the first read."""
    command: list[str] = []

    def read() -> list[str]:
        if not command:
            command.append(drain.metrics_command(_instances()))
        try:
            _, out = host.run_shell_command(command[0], print_output=False, print_input=False)
        except CONNECTION_ERRORS as e:
            raise drain.DrainError(f"the host did not answer ({type(e).__name__}: {e})") from e
        return drain.read_metrics(out.stdout_lines + out.stderr_lines)

    return read


def _host_shell(command: str) -> str:
    """``command`` on the current host (as root where the host's data says _sudo); its output."""
    try:
        ok, out = host.run_shell_command(
            command, _sudo=bool(host.data.get("_sudo")), print_output=False, print_input=False
        )
    except CONNECTION_ERRORS as e:
        raise drain.DrainError(f"the host did not answer ({type(e).__name__}: {e})") from e
    if not ok:
        raise drain.DrainError(f"`{command}` failed on the host: {' '.join(out.stderr_lines)[:200]}")
    return "\n".join(out.stdout_lines)


def marker_write_command(run: str) -> str:
    d = q(MARKER.rsplit("/", 1)[0])
    return (
        f"umask 077 && mkdir -p {d} && printf '%s\\n' {q(run)} > {q(MARKER + '.tmp')} && "
        f"mv -f {q(MARKER + '.tmp')} {q(MARKER)}"
    )


def marker_read_command() -> str:
    return f"cat {q(MARKER)} 2>/dev/null || true"


def marker_remove_command() -> str:
    return f"rm -f {q(MARKER)}"


def _key() -> tuple[int, str]:
    return (id(state._get_module()), host.name)


def balancer() -> drain.Balancer | None:
    try:
        return drain.from_settings(
            access.current(), host.name, host.data.get("ssh_hostname") or host.name, _metrics_reader()
        )
    except drain.DrainError as e:
        raise access.ConfigError(f"{host.name}: {e}") from e


def drain_now(why: str) -> None:
    lb = balancer()
    if lb is None:
        return
    timeout = float(access.get("lb_drain_timeout"))
    drained = False
    try:
        did = lb.drain()
        drained = True
        if lb.took_out:  # this run's: its ready (or the next run's, if this one is cut) puts it back
            _TOOK_OUT.add(_key())
            _host_shell(marker_write_command(f"{runid.RUN_ID} {runid.holder()}"))
        logger.info(f"{host.print_prefix}{did} ({why})")
        waited = lb.wait_idle(timeout, say=lambda text: logger.warning(f"{host.print_prefix}{text}"))
        note = getattr(lb, "note", "")
        logger.info(
            f"{host.print_prefix}no request in flight ({lb.describe()}) after {waited:.1f}s"
            + (f": {note}" if note else "")
        )
    except drain.DrainError as e:
        back = ""
        try:  # Triton is not touched: the host goes back in (only what this drain took out)
            back = _ready_own(lb) if drained and lb.took_out else ""
        except drain.DrainError as e2:
            back = f"putting it back failed too: {e2}"
        if isinstance(e, drain.InFlightUnknown):
            fix = (
                "make Triton's metrics readable on the host (`curl -sf " + _metrics_url(access.current()) + "`: "
                "triton_metrics_port, triton_metrics_bind), then run the deploy again; a host whose requests in "
                "flight cannot be read is never restarted under them"
            )
        else:
            fix = (
                "check the load balancer (HAProxy: `show stat`, `show servers state`; hooks: run lb_drain_command "
                "by hand) or raise lb_drain_timeout for long requests, then run the deploy again"
            )
        fail(
            f"{host.name} out of the load balancer ({lb.describe()}) and idle within lb_drain_timeout "
            f"({timeout:.0f}s) before Triton restarts ({why})",
            str(e),
            now="Triton was not restarted and serves as before" + (f"; {back}" if back else ""),
            fix=fix,
            step="load balancer drain",
        )


def gate_and_ready() -> None:
    """Where no health gate step follows a restart (deploys/host.py): Triton live and ready, then
    back in the load balancer."""

    gate_current_host(access.current(), [])
    ready_now()


def _ready_own(lb: drain.Balancer) -> str:
    did = lb.ready()
    _TOOK_OUT.discard(_key())
    _host_shell(marker_remove_command())
    return did


def _readiable(lb: drain.Balancer) -> tuple[bool, str]:
    """(whether a deploy's drain took the host out, so this run puts it back; why not when not).
    HAProxy's state is read first: a serving server needs nothing (no command to the host)."""
    if lb.kind == "haproxy":
        st = cast(drain.HAProxy, lb).state()
        if st.maintenance:
            if _key() in _TOOK_OUT:  # held since this run drained it: the holder's ready ends both
                _TOOK_OUT.discard(_key())
                _host_shell(marker_remove_command())
            return False, (
                f"{lb.held()}: not readied (the holder puts it back: `tritonfleet quarantine release`, "
                f"or `set server {lb.backend}/{lb.server} state ready`)"
            )
        if not st.drained:
            return False, ""
    if _key() in _TOOK_OUT:
        return True, ""
    mark = _host_shell(marker_read_command()).strip()
    if mark:
        return True, f"drained by a deploy that was cut before it put it back ({mark[:160]})"
    if lb.kind == "haproxy":
        return False, (
            f"{lb.describe()} is drained, not by a deploy (no {MARKER} on the host): an operator's "
            "drain, left as it is: not readied"
        )
    return False, ""


def ready_now() -> None:
    lb = balancer()
    if lb is None:
        return
    timeout = float(access.get("lb_drain_timeout"))
    try:
        ours, why = _readiable(lb)
        if not ours:
            if why:
                logger.warning(f"{host.print_prefix}{why}")
            return
        if why:
            logger.info(f"{host.print_prefix}{why}")
        did = _ready_own(lb)
        if did:
            logger.info(f"{host.print_prefix}{did}")
            seen = lb.wait_serving(timeout)
            if seen:
                logger.info(f"{host.print_prefix}{lb.describe()} serves again ({seen})")
    except drain.DrainError as e:
        fail(
            f"{host.name} back in the load balancer ({lb.describe()}) after a healthy start",
            str(e),
            now="Triton is healthy but the load balancer sends it no requests",
            fix="put the host back by hand (HAProxy: `set server <backend>/<server> state ready`; hooks: run "
            "lb_ready_command) once the cause is fixed, or run the deploy again",
            step="load balancer ready",
        )


@operation(is_idempotent=False)
def drain_host(why: str):
    """Take the host out of its load balancer and wait until no request is in flight (runs on the control
    machine when the operations execute; planned as a change: it is only added before a restart that
    will happen).

    + why: why the host is drained (said in the log)

    Changes: the host's weight in its load balancer (out, until the health gate puts it back).

    Tunables: ``lb``, ``lb_drain_timeout``.

    **Example:**

    .. code:: python

        drain_host(name="drain before the restart", why="image changed")
    """
    yield drain_command(why)
