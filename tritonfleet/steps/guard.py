"""The GPU-loss guard as a step of its own, for deploys without the Triton service step
(deploys/host.py): after a run that reloaded systemd, a running Triton container must still see
the host's GPUs (tritonfleet.gpu.guard). deploys/triton.py runs it inside the Triton service step,
where it is skipped when Triton restarts anyway."""

from __future__ import annotations

from ..pyinfra_ext.check import check
from ..pyinfra_ext.install import tritonfleet_step
from ..serving.ops import gpu_guard as guard_ops
from ..serving.ops import lb


@tritonfleet_step("GPU-loss guard")
def gpu_guard():
    """The GPU-loss guard as a step of its own: after a run that reloaded systemd, the
    running Triton container must still see the host's GPUs.

    Changes: nothing, or one Triton restart when its container lost its GPUs (drained first).

    Tunables: none.

    **Example:**

    .. code:: python

        from tritonfleet.steps.guard import gpu_guard

        gpu_guard()  # last step of deploys/host.py
    """
    reasons = guard_ops.pending()
    if reasons:
        guard_ops.guard(name="Triton's container still sees the host's GPUs after daemon-reload", reasons=reasons)
    if lb.enabled() and lb.drains():  # drained for a reboot: no health gate step follows here
        check(name="check: Triton live and ready again, back in the load balancer", function=lb.gate_and_ready)
