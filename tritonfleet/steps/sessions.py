"""The SSH sessions a deploy opens: the login user's systemd manager kept between them.

The first step of the host layer (deploys/triton.py, deploys/host.py): it makes the next run's
connections quicker and changes nothing else on the host.
"""

from __future__ import annotations

from pyinfra.facts.server import Command
from pyinfra.operations import server

from ..core.shell import q
from ..host.layer import LINGER_COMMAND, keeps_sessions, linger_state, session_facts
from ..pyinfra_ext import memo
from ..pyinfra_ext.install import tritonfleet_step
from ..settings import access


@tritonfleet_step("SSH sessions")
def ssh_sessions():
    """The SSH login user's systemd manager kept running between sessions (``loginctl
    enable-linger``), so that the next run's SSH sessions do not wait for it to start.

    Why: logind stops a user's manager 10 s after the user's last session ends
    (``UserStopDelaySec=``, logind.conf(5)) and pam_systemd starts it again for the next one, which
    waits for it. On the test hosts an ``ssh host true`` after 13 s without a session took
    328-392 ms, and 252-269 ms with linger; in a full deploy after such a pause the one read took
    0.14 s against 0.11 s, the lock's holder 0.28 s against 0.26 s (docs/scale.md). A host
    without logind (no ``loginctl``, or logind not running) has no manager to keep, and a run on
    the host itself (pyinfra's @local connector, pull mode) opens no session: nothing is done there.

    Changes: ``/var/lib/systemd/linger/<user>`` (through ``loginctl enable-linger <user>``, which
    also starts the manager), for the user the deploy logs in as (the one sudo was run by).

    Tunables: ``ssh_user_linger``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.sessions import ssh_sessions

        ssh_sessions()
    """
    if not keeps_sessions(access.current()):
        return
    memo.prefetch(*session_facts(access.current()))
    state, user = linger_state(memo.fact(Command, command=LINGER_COMMAND))
    if state == "none":
        server.shell(
            name=f"keep {user}'s systemd manager between SSH sessions (loginctl enable-linger)",
            commands=[f"loginctl enable-linger {q(user)}"],
        )
