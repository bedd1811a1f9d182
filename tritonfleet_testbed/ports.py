"""Free loopback ports for the servers the tests and benchmarks start.

A port that ``bind(port 0)`` hands out is free only until someone binds it, and the server that
asked for it binds it a moment later. Linux hands out bind(0) ports at random from the ephemeral
range (about 28,000 ports), so the 48 ports that 16 tritonservers started at once ask for
repeat with a probability of a few percent (the birthday bound): two servers of one process then
share a port, and one of them answers the other's requests. So this process never hands out a
port twice within ``HOLD_S``. A port another process takes in that moment is still possible:
the starters retry on new ports when their server says its address is in use.
"""

from __future__ import annotations

import socket
import threading
import time

# How long a port handed out stays reserved for its caller in this process: far longer than
# any server here takes to bind (tritonserver binds once its models load, seconds).
HOLD_S = 600.0

_lock = threading.Lock()
_issued: dict[int, float] = {}  # port -> time.monotonic() when handed out


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on ``address`` now, not handed out by this process in the last HOLD_S."""
    with _lock:
        now = time.monotonic()
        for port, since in list(_issued.items()):
            if now - since > HOLD_S:
                del _issued[port]
        for _ in range(1000):
            with socket.socket() as s:
                s.bind((address, 0))
                port = s.getsockname()[1]
            if port not in _issued:
                _issued[port] = now
                return port
    raise RuntimeError(f"no free port on {address} that this process has not handed out")
