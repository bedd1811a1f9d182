"""The reboot of a quarantined host whose GPU fault a reset did not clear, or whose fault's
recommended action is a reboot (NVIDIA's Xid catalog: ``RESTART_BM``): deploys/reboot.py, which the
quarantine receiver runs as a pyinfra process of its own for that one host
(tritonfleet.fleet.quarantine.remediation; the receiver, a reader of the fleet, imports no step).

The host is out of its load balancer already (the receiver drained it); the reboot is the
driver step's own operation (tritonfleet.host.ops.reboot): the kernel that will boot is checked
for the NVIDIA module first (no module, no reboot), then the host must answer with a new boot id
within ``nvidia_reboot_timeout``. Triton's unit starts with the host; the receiver's warm gate
decides when it returns.
"""

from __future__ import annotations

from ..host.ops import aptlock
from ..host.ops.reboot import reboot
from ..pyinfra_ext.install import tritonfleet_step
from ..settings import access


@tritonfleet_step("GPU fault reboot")
def gpu_fault_reboot():
    """Reboot the host for a GPU fault (the quarantine receiver runs it for one host, out of its
    load balancer already), with the kernel that will boot checked for the NVIDIA module first.

    Changes: reboots the host.

    Tunables: ``nvidia_reboot_timeout``, ``nvidia_kernel_packages``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.fault_reboot import gpu_fault_reboot

        gpu_fault_reboot()
    """
    reboot(
        name="reboot for a GPU fault a reset did not clear (the quarantine receiver)",
        reboot_timeout=access.get("nvidia_reboot_timeout"),
        header_packages=[p for p in access.get("nvidia_kernel_packages") if "{kernel}" in p],
        install_template=aptlock.wrap("DEBIAN_FRONTEND=noninteractive apt-get install -y -q @WORDS@").get_raw_value(),
    )
