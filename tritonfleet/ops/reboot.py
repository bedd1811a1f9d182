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

from .. import failure, hostlock

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def _boot_id(host) -> str | None:
    ok, out = host.run_shell_command(BOOT_ID)
    return "".join(out.stdout_lines).strip() if ok else None


@operation(is_idempotent=False)
def reboot(delay: float = 5, interval: float = 1, reboot_timeout: float = 600):
    """Reboot; wait (up to ``reboot_timeout`` seconds) until the host answers with a new boot id."""
    before: list[str | None] = []

    def capture(state, host):
        remove_any_sudo_askpass_file(host)
        before.append(_boot_id(host))

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
                    # the reboot ended the deploy lock's holder: take it again (tritonfleet.hostlock)
                    hostlock.reacquire(host, say=logger.warning)
                    return
                host.disconnect()  # still the old boot: shutting down
            if time.monotonic() > deadline:
                failure.emit(host, failure.Failure(
                    host.name, "NVIDIA driver (reboot)",
                    f"the host answers SSH with a new boot id within {reboot_timeout:.0f}s (nvidia_reboot_timeout)",
                    f"no answer with a new boot id after {reboot_timeout:.0f}s (boot id before: {before[0]})",
                    now="unknown: the host was rebooted to load the new driver and has not answered since; no later "
                        "step ran on it (Triton was not touched by this run)",
                    fix="look at the host's console (a kernel without the NVIDIA module? a stuck boot?); once it "
                        "answers, run the deploy again (a longer boot: nvidia_reboot_timeout in group data)",
                    cause=f"did not come back from the reboot within {reboot_timeout:.0f}s"))
                return False
            time.sleep(interval)

    yield FunctionCommand(wait_and_reconnect, (), {})
