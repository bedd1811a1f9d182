"""The GPU-loss guard in a deploy (tritonfleet.gpu.guard): the steps note each operation that
reloads systemd (``note``); once the Triton service step knows Triton is not restarted anyway, it
adds ``guard``, which compares the running container's GPUs with the host's and restarts it once
if it lost them."""

from __future__ import annotations

import time

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.context import state

from ...core.report import fail, reported
from ...core.shell import q
from ...gpu.guard import compare_command, parse, verdict
from ...host.layer import smi_command
from ...pyinfra_ext.check import will_change
from ...settings import access
from ..health import gate_current_host
from . import lb

_RELOADS: dict[tuple[int, str], list[str]] = {}  # (pyinfra state, host) -> why


def note(why: str, *ops) -> None:
    """Record that ``ops`` (when they change) reload systemd on the current host."""
    if will_change(*ops):
        _RELOADS.setdefault((id(state._get_module()), host.name), []).append(why)


def pending() -> list[str]:
    """Why systemd is reloaded on the current host in this run (empty: it is not)."""
    return list(_RELOADS.get((id(state._get_module()), host.name), []))


def _read() -> dict:
    _, out = host.run_shell_command(
        compare_command(access.get("triton_container_name"), smi=smi_command(access.current())),
        print_output=False,
        print_input=False,
    )
    return parse("\n".join(out.stdout_lines))


def guard_now(reasons: list[str]) -> None:
    kind, say = verdict(_read())
    why = "; ".join(reasons)
    if kind in ("ok", "not-running"):
        logger.info(f"{host.print_prefix}after daemon-reload ({why}): {say}")
        return
    service = access.get("triton_service")
    expected = "the running Triton container sees the host's GPUs (docker exec ... nvidia-smi -L)"
    if kind == "host-failed":
        fail(
            expected,
            say,
            fix="look at the driver on the host (nvidia-smi, dmesg), then run the deploy again",
            step="GPU-loss guard",
        )
    logger.warning(f"{host.print_prefix}GPUs lost after daemon-reload ({why}): {say}; restarting {service} once")
    if lb.enabled():
        lb.drain_now("its container lost the GPUs after a daemon-reload")
    ok, out = host.run_shell_command(
        f"systemctl restart {q(service + '.service')}", print_output=False, print_input=False
    )
    if not ok:
        fail(
            expected,
            f"systemctl restart {service} failed: " + " / ".join(out.stderr_lines[-3:]),
            fix=f"journalctl -u {service} on the host",
            step="GPU-loss guard",
        )
    deadline = time.monotonic() + float(access.get("health_timeout"))
    while True:
        kind, say = verdict(_read())
        if kind == "ok" or time.monotonic() > deadline:
            break
        time.sleep(1)
    if kind != "ok":
        fail(
            f"{expected} after one restart",
            say,
            now=f"{service} was restarted once and its container still does not see the GPUs",
            fix="check the /dev/char symlinks (nvidia-ctk system create-dev-char-symlinks --create-all) and the "
            "driver, then restart the container by hand or run the deploy again",
            step="GPU-loss guard",
        )
    logger.warning(f"{host.print_prefix}{service} restarted: {say}")
    if lb.enabled():
        gate_current_host(access.current(), [])
        lb.ready_now()


@operation(is_idempotent=False)
def guard(reasons: list[str]):
    """Compare the running container's GPUs with the host's after a daemon-reload; restart once if they
    differ (runs with the operations; planned only when a reload is).

    + reasons: what reloaded systemd in this run (named in the restart's reason)

    Changes: one Triton restart when its container lost its GPUs.

    Tunables: ``health_timeout``, ``triton_service``, ``triton_container_name``.

    **Example:**

    .. code:: python

        guard(name="Triton still sees the GPUs", reasons=["driver installed"])
    """
    yield FunctionCommand(reported, (guard_now, (reasons,), {}), {})
