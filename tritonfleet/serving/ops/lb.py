"""The load-balancer drain inside a deploy (tritonfleet.serving.drain), run on the control machine.

``drain`` is added right before any operation that restarts Triton (only then: a converged host
plans no change): the host is taken out of its load balancer and the operation waits until no
request is in flight. ``ready`` runs after the health gate passed: the host goes back in (HAProxy:
only a server tritonfleet's drain left in drain state; hooks: the ready command, every healthy
run). A host that fails between the two stays out of the load balancer.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.context import state

from ...core.report import fail, reported
from ...core.shell import q
from ...settings import access as config
from .. import drain

_DRAINS: set[tuple[int, str]] = set()  # (pyinfra state, host) planned to be drained in this run


def enabled() -> bool:
    return bool(config.get("lb"))


def note_drain() -> None:
    _DRAINS.add((id(state._get_module()), host.name))


def drains() -> bool:
    """A drain is planned for the current host in this run."""
    return (id(state._get_module()), host.name) in _DRAINS


def drain_command(why: str) -> FunctionCommand:
    """The drain as a command of another operation (the reboot)."""
    note_drain()
    return FunctionCommand(reported, (drain_now, (why,), {}), {})


def _metrics() -> str:
    """Triton's metrics, read on the host (works whatever the binds and health_via are)."""
    bind = config.get("triton_metrics_bind")
    addr = bind if bind and bind not in ("0.0.0.0", "::") else "127.0.0.1"
    url = f"http://{addr}:{int(config.get('triton_metrics_port'))}/metrics"
    ok, out = host.run_shell_command(f"curl -sS -m 5 {q(url)}", print_output=False, print_input=False)
    if not ok:
        raise drain.DrainError("Triton's metrics do not answer")
    return "\n".join(out.stdout_lines)


def balancer() -> drain.Balancer | None:
    try:
        return drain.from_settings(config.current(), host.name, host.data.get("ssh_hostname") or host.name, _metrics)
    except drain.DrainError as e:
        raise config.ConfigError(f"{host.name}: {e}") from e


def drain_now(why: str) -> None:
    lb = balancer()
    if lb is None:
        return
    timeout = float(config.get("lb_drain_timeout"))
    drained = False
    try:
        did = lb.drain()
        drained = True
        logger.info(f"{host.print_prefix}{did} ({why})")
        waited = lb.wait_idle(timeout)
        logger.info(f"{host.print_prefix}no request in flight ({lb.describe()}) after {waited:.1f}s")
    except drain.DrainError as e:
        back = ""
        try:  # Triton is not touched: the host goes back in (HAProxy: only what this drain set)
            back = lb.ready() if (lb.kind == "haproxy" or drained) else ""
        except drain.DrainError as e2:
            back = f"putting it back failed too: {e2}"
        fail(f"{host.name} out of the load balancer ({lb.describe()}) and idle within lb_drain_timeout "
             f"({timeout:.0f}s) before Triton restarts ({why})", str(e),
             now="Triton was not restarted and serves as before" + (f"; {back}" if back else ""),
             fix="check the load balancer (HAProxy: `show stat`, `show servers state`; hooks: run lb_drain_command "
                 "by hand) or raise lb_drain_timeout for long requests, then run the deploy again",
             step="load balancer drain")


def gate_and_ready() -> None:
    """Where no health gate step follows a restart (deploys/host.py): Triton live and ready, then
    back in the load balancer."""
    from ..health import gate_current_host

    gate_current_host([])
    ready_now()


def ready_now() -> None:
    lb = balancer()
    if lb is None:
        return
    timeout = float(config.get("lb_drain_timeout"))
    try:
        did = lb.ready()
        if did:
            logger.info(f"{host.print_prefix}{did}")
            seen = lb.wait_serving(timeout)
            if seen:
                logger.info(f"{host.print_prefix}{lb.describe()} serves again ({seen})")
    except drain.DrainError as e:
        fail(f"{host.name} back in the load balancer ({lb.describe()}) after a healthy start", str(e),
             now="Triton is healthy but the load balancer sends it no requests",
             fix="put the host back by hand (HAProxy: `set server <backend>/<server> state ready`; hooks: run "
                 "lb_ready_command) once the cause is fixed, or run the deploy again",
             step="load balancer ready")


@operation(is_idempotent=False)
def drain_host(why: str):
    """Take the host out of its load balancer and wait until no request is in flight (runs on the
    control machine when the operations execute; planned as a change: it is only added before a
    restart that will happen)."""
    yield drain_command(why)
