"""This run's identity: names of its temporary files and directories (locally and on the hosts),
and what the deploy lock says about its holder."""

from __future__ import annotations

import getpass
import os
import secrets
import shlex
import socket
import sys
import time

STARTED = time.time()
# letters, digits and '-' only: safe in shell words and file names
RUN_ID = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(STARTED))}-{os.getpid()}-{secrets.token_hex(3)}"


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in this environment (no passwd entry, no LOGNAME)
        return str(os.getuid())


def holder() -> str:
    """One line naming this run: user, control machine, pid, start time, command."""
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(STARTED))
    command = shlex.join([os.path.basename(sys.argv[0] or "python")] + sys.argv[1:])[:300]
    line = f"{_user()}@{socket.gethostname()} pid {os.getpid()}, started {started}, run {RUN_ID}: {command}"
    return line.replace("\n", " ")
