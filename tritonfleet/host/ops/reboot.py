"""Reboot a host and wait until it is back, confirmed by a new boot id.

pyinfra's ``server.reboot`` confirms the reboot by /proc/uptime dropping. A host in a container
(systemd-nspawn, LXC) shares the machine's kernel and its uptime, so that reboot is never
confirmed there; the kernel's boot id (/proc/sys/kernel/random/boot_id) is new after every boot
of a machine or of a container's init. Everything else is as pyinfra does it: the reboot is
detached from the SSH session, the connection is dropped and re-made until the host answers.
"""

from __future__ import annotations

import time

from pyinfra import logger
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.connectors.util import clear_askpass_cache, remove_any_sudo_askpass_file

from ...core import report
from ...pyinfra_ext import hostlock
from .. import boot_kernel

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def _boot_id(host) -> str | None:
    ok, out = host.run_shell_command(BOOT_ID)
    return "".join(out.stdout_lines).strip() if ok else None


def kernel_ready(state, host, header_packages: list[str], install_template: str) -> bool:
    """Before the reboot: the kernel that will boot must have the NVIDIA module (built now when it
    can be: tritonfleet.host.boot_kernel). False (the host fails, not rebooted) when it cannot."""
    _, out = host.run_shell_command(
        boot_kernel.ensure_command(header_packages, install_template), print_output=False, print_input=False
    )
    st = boot_kernel.parse(out.stdout_lines)
    if st.module == "built":
        logger.info(
            f"{host.print_prefix}NVIDIA module built for {st.boot}, the kernel that will boot ({'; '.join(st.steps)})"
        )
    if st.has_module:
        return True
    found, now, fix = boot_kernel.refusal(st, header_packages)
    if not st.boot:  # the check itself gave no answer
        found = "could not tell which kernel will boot: " + (" / ".join(out.stderr_lines[-3:]) or "no answer")
    report.emit(
        host,
        report.Failure(
            host.name,
            "NVIDIA driver (reboot)",
            f"an NVIDIA module for the kernel that will boot ({st.boot})",
            found,
            words=st.output,
            source="what was tried (" + ("; ".join(st.steps) or "nothing could be") + ")",
            now=now,
            fix=fix,
            cause=f"reboot refused: kernel {st.boot} has no NVIDIA module",
        ),
    )
    return False


@operation(is_idempotent=False)
def reboot(
    delay: float = 5,
    interval: float = 1,
    reboot_timeout: float = 600,
    header_packages: list | None = None,
    install_template: str | None = None,
    before_reboot: FunctionCommand | None = None,
):
    """Reboot; wait (up to ``reboot_timeout`` seconds) until the host answers with a new boot id. With
    ``install_template`` (an apt-get install command with ``@WORDS@`` for the packages), the kernel that
    will boot is checked first (``kernel_ready``): no NVIDIA module, no reboot. ``before_reboot``: runs
    after that check, right before the reboot (the driver step passes the load balancer's drain: a
    reboot restarts Triton).

    + delay: seconds before the reboot
    + interval: seconds between tries to reconnect
    + reboot_timeout: seconds to wait for the host to answer with a new boot id
    + header_packages: the kernel header packages the driver's module needs for the kernel that will boot
    + install_template: an apt-get install command with ``@WORDS@`` for those packages (checks the kernel first)
    + before_reboot: run right before the reboot (the load balancer's drain)

    Changes: reboots the host.

    Tunables: none (the driver step passes ``nvidia_reboot_timeout``).

    **Example:**

    .. code:: python

        reboot(name="reboot into the new driver", reboot_timeout=600)
    """
    before: list[str | None] = []

    if install_template is not None:
        yield FunctionCommand(kernel_ready, (list(header_packages or []), install_template), {})
    if before_reboot is not None:
        yield before_reboot

    def capture(state, host):
        remove_any_sudo_askpass_file(host)
        before.append(_boot_id(host))
        hostlock.rebooting(host)  # the reboot ends the lock's holder: taken again after it

    yield FunctionCommand(capture, (), {})
    yield StringCommand("( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &")

    def wait_and_reconnect(state, host):
        time.sleep(delay)
        clear_askpass_cache(host)
        host.disconnect()
        deadline = time.monotonic() + reboot_timeout
        while True:
            host.connect(show_errors=False)
            if host.connected:
                now = _boot_id(host)
                if now and now != before[0]:
                    logger.info(f"{host.print_prefix}rebooted (boot id {now})")
                    # the reboot ended the deploy lock's holder: take it again (tritonfleet.pyinfra_ext.hostlock)
                    hostlock.reacquire(host, say=logger.warning)
                    return
                host.disconnect()  # still the old boot: shutting down
            if time.monotonic() > deadline:
                report.emit(
                    host,
                    report.Failure(
                        host.name,
                        "NVIDIA driver (reboot)",
                        f"the host answers SSH with a new boot id within {reboot_timeout:.0f}s (nvidia_reboot_timeout)",
                        f"no answer with a new boot id after {reboot_timeout:.0f}s (boot id before: {before[0]})",
                        now="unknown: the host was rebooted to load the new driver and has not answered since; no later "
                        "step ran on it (Triton was not touched by this run)",
                        fix="look at the host's console (a kernel without the NVIDIA module? a stuck boot?); once it "
                        "answers, run the deploy again (a longer boot: nvidia_reboot_timeout in group data)",
                        cause=f"did not come back from the reboot within {reboot_timeout:.0f}s",
                    ),
                )
                return False
            time.sleep(interval)

    yield FunctionCommand(wait_and_reconnect, (), {})
