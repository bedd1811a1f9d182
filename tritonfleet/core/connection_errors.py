"""What reaching a host over SSH raises, in one tuple: every place that treats a host it cannot
reach as an explicit state (unreachable, unknown, a failed gate) catches exactly these, so a bug
keeps its traceback instead of reading as a host that did not answer.
"""

from __future__ import annotations

from paramiko import SSHException
from pyinfra.api.exceptions import ConnectError

#: pyinfra's refusal to connect (ConnectError), a socket's error (a command past its timeout too:
#: pyinfra raises TimeoutError, an OSError), paramiko's errors, and a stream closed under a read
#: (EOFError). Anything else is a bug.
CONNECTION_ERRORS = (ConnectError, OSError, SSHException, EOFError)
