"""The control machine's limits for a fleet: open files.

Every host of a run holds an SSH connection (a socket) for the whole run, and a status or a
rollout's probe holds one per host it is reading; pyinfra sizes its parallelism from the
open-file limit it finds when it is imported (``pyinfra.api.state.MAX_PARALLEL``: (soft - 10)
/ 3). Debian's default soft limit is 1024 (hard 524288 under systemd), so without raising it a
fleet of a few hundred hosts runs out of descriptors in the middle of connecting: paramiko then
fails with "Too many open files" on whichever host came next.

``raise_nofile()`` raises the soft limit to the hard one (no privilege needed) at the start of
every run: the ``tritonfleet`` command, the inventories (pyinfra loads them before it sizes its
pools and connects) and the deploy files (``pyinfra_patches.install``). ``check_nofile(n)``
then refuses a fleet that still would not fit, naming the limit and the fix, before a single
host is connected. See docs/scale.md.
"""

from __future__ import annotations

import resource
import sys

from .errors import TritonfleetError

#: descriptors a host costs during a run: its SSH socket, plus headroom for a transfer's pipes
#: and a health tunnel (pyinfra's own estimate is 3)
FDS_PER_HOST = 3
#: descriptors the control process needs besides the hosts (Python's files, logs, pipes)
RESERVE = 64


class LimitError(TritonfleetError):
    pass


def raise_nofile() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit; (soft, hard) afterwards. Tells an
    already imported pyinfra about the new limit, so its parallelism follows it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    state = sys.modules.get("pyinfra.api.state")
    if state is not None and hasattr(state, "MAX_PARALLEL"):
        state.nofile_limit = soft
        state.MAX_PARALLEL = max(1, round((soft - 10) / 3))
    return soft, hard


def needed(hosts: int) -> int:
    return hosts * FDS_PER_HOST + RESERVE


def check_nofile(hosts: int, what: str = "this run") -> None:
    """Raise LimitError when ``hosts`` hosts would not fit in the open-file limit (after raising
    it as far as it goes)."""
    soft, hard = raise_nofile()
    if needed(hosts) > soft:
        raise LimitError(
            f"{what} would hold {hosts} SSH connections, about {needed(hosts)} open files, but this control "
            f"machine's open-file limit is {soft} (hard limit {hard}): raise the hard limit (`ulimit -Hn "
            f"{needed(hosts)}` as root, LimitNOFILE= in a systemd unit, or nofile in "
            f"/etc/security/limits.conf), or run it on fewer hosts at once (--limit, or split the inventory "
            f"across control machines: docs/scale.md)"
        )
