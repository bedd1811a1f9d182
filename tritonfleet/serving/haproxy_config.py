"""The HAProxy backend lines tritonfleet recommends in front of Triton, each with its reason: the
one text docs/operations.md ("The HAProxy backend") shows operators and the tests' HAProxy runs
(tests/support/haproxy.py), so what is measured is what is recommended.

They keep a model that fails while Triton stays ready (its health check answers 200) from costing
clients requests: HAProxy sends a request Triton answered with an error again, to another server,
until the quarantine holds the failing one in maintenance. Only for stateless models: docs/operations.md says when not (``sequence_batching``)."""

from __future__ import annotations

#: (line, why): the lines added to a Triton backend that already has ``option httpchk GET
#: /v2/health/ready`` and ``default-server check ...`` (HAProxy 2.6's configuration.txt)
TRAFFIC_LINES: tuple[tuple[str, str], ...] = (
    (
        "http-request wait-for-body time 1s",
        "the request's body is in HAProxy's buffer before it is sent, so it can be sent again "
        "(without it HAProxy 2.6 passed Triton's 500s to the clients: docs/operations.md)",
    ),
    (
        "retry-on conn-failure 500 503",
        "send a request again when its connection failed, or when Triton answered 500 (an internal "
        "error: a failed run, a CUDA or ONNX Runtime error) or 503 (unavailable: a model not ready, "
        "its queue full)",
    ),
    ("retries 3", "at most 3 more tries (HAProxy's default, written out)"),
    ("option redispatch 1", "every try goes to another server than the one that failed"),
    (
        "default-server observe layer7 error-limit 2 on-error mark-down",
        "a request that could not be sent again (a body over tune.bufsize, its tries spent) is "
        "watched: 2 such errors in a row mark the server down until its health check passes `rise` "
        "times",
    ),
)


def traffic_lines() -> list[str]:
    """The recommended lines, as they are written in the backend."""
    return [line for line, _ in TRAFFIC_LINES]
