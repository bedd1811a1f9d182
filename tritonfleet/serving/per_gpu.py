"""One Triton per GPU (``triton_per_gpu``): the instances a host runs, their units, containers
and ports.

With ``triton_per_gpu = True`` a host with N GPUs runs N Triton containers instead of one: instance
``i`` is the systemd unit ``<triton_service>-gpu<i>.service`` running the container
``<triton_container_name>-gpu<i>`` with ``--gpus device=<i>``, its ports those of the single unit
plus ``i * triton_per_gpu_port_step`` (HTTP, gRPC and metrics alike). Every instance serves the same
model repository; inside its container the one GPU it gets is GPU 0, so the instance groups are
rendered as written (``gpus: [ 0 ]``), not spread.

Pure (but ``host_instance_gets``, the current host's): shared by the Triton service step (writes
the units), the health gate, ``tritonfleet status``, ``tritonfleet prometheus`` and ``tritonfleet
rollout``. Every helper takes a host's settings (tritonfleet.settings.access.Settings) and returns
the settings of one instance: the same tunables with the service, container, ports and
``triton_gpus`` of that instance, so code written for the single unit serves each one.
"""

from __future__ import annotations

import re

from pyinfra import host

from ..core.errors import UsageError
from ..core.shell import q
from ..gpu.facts import host_gpus
from ..gpu.placement import per_gpu_enabled as enabled
from ..settings.access import Overlay, Settings
from ..settings.table import whole_number

#: tunables an instance overrides (everything else is the host's)
PORT_KEYS = ("triton_http_port", "triton_grpc_port", "triton_metrics_port")
#: the most instances a host runs (nvidia-smi lists at most 16 GPUs in the probe)
MAX_INSTANCES = 16


class PerGpuError(UsageError, ValueError):
    """A per-GPU layout that cannot work (ports that collide)."""


def service_name(settings: Settings, index: int) -> str:
    return f"{settings.get('triton_service')}-gpu{int(index)}"


def container_name(settings: Settings, index: int) -> str:
    return f"{settings.get('triton_container_name')}-gpu{int(index)}"


def port_step(settings: Settings) -> int:
    try:
        return whole_number(settings.get("triton_per_gpu_port_step", 10), "triton_per_gpu_port_step")
    except ValueError as e:
        raise PerGpuError(str(e)) from None


def ports(settings: Settings, index: int) -> dict[str, int]:
    """{tunable: port} of instance ``index``."""
    step = port_step(settings)
    return {k: int(settings.get(k)) + step * int(index) for k in PORT_KEYS}


def instance_get(settings: Settings, index: int) -> Overlay:
    """The settings of instance ``index``: the host's, with its unit, container, ports and GPU."""
    return Overlay(
        settings,
        {
            "triton_service": service_name(settings, index),
            "triton_container_name": container_name(settings, index),
            "triton_gpus": f"device={int(index)}",
            "triton_per_gpu_index": int(index),
            **ports(settings, index),
        },
    )


def instance_gets(settings: Settings, count: int) -> list[Settings]:
    """The settings of each instance of a host with ``count`` GPUs (ports checked); [settings]
    when triton_per_gpu is off: the single unit."""
    if not enabled(settings):
        return [settings]
    check_layout(settings, count)
    return [instance_get(settings, i) for i in range(count)]


def label(settings: Settings) -> str:
    """'GPU 2 (triton-gpu2.service, HTTP 8020)' for an instance's settings; '' for the single unit."""
    index = settings.get("triton_per_gpu_index", None)
    if index is None:
        return ""
    return f"GPU {index} ({settings.get('triton_service')}.service, HTTP {settings.get('triton_http_port')})"


def check_layout(settings: Settings, count: int) -> None:
    """Refuse a layout whose ports collide: every instance's HTTP, gRPC and metrics port distinct
    and within 1..65535."""
    if count < 1 or count > MAX_INSTANCES:
        raise PerGpuError(f"triton_per_gpu: {count} GPUs; one Triton per GPU needs 1..{MAX_INSTANCES}")
    seen: dict[int, str] = {}
    for i in range(count):
        for key, port in ports(settings, i).items():
            if not 1 <= port <= 65535:
                raise PerGpuError(
                    f"triton_per_gpu: GPU {i}'s {key} would be {port}, outside 1..65535 "
                    "(lower the ports or triton_per_gpu_port_step in group data)"
                )
            if port in seen:
                raise PerGpuError(
                    f"triton_per_gpu: GPU {i}'s {key} {port} is also {seen[port]} (raise "
                    "triton_per_gpu_port_step above the spread of triton_http_port, "
                    "triton_grpc_port and triton_metrics_port in group data)"
                )
            seen[port] = f"GPU {i}'s {key}"


def unit_file_re(settings: Settings) -> re.Pattern:
    """Matches the file name of an instance's unit, group 1 its index."""
    return re.compile(rf"^{re.escape(str(settings.get('triton_service')))}-gpu([0-9]+)\.service$")


def list_units_command(settings: Settings) -> str:
    """Lists the per-GPU unit files on the host, one name a line, by index."""
    return f"ls -1 /etc/systemd/system 2>/dev/null | grep -E {q(unit_file_re(settings).pattern)} | sort -V; true"


def indexes(settings: Settings, names) -> list[int]:
    """The instance indexes of the unit file names ``names`` (others skipped), sorted."""
    pat = unit_file_re(settings)
    return sorted({int(m.group(1)) for n in names if (m := pat.match(str(n).strip()))})


def host_instance_gets(settings: Settings) -> list[Settings]:
    """The settings of each Triton instance of the current host (pyinfra's), whose settings are
    ``settings``: [settings] (the single unit), or with triton_per_gpu one per GPU (the count from
    tritonfleet.gpu.facts.host_gpus). A layout that cannot work is a ConfigError naming the host."""

    from ..settings.access import ConfigError

    if not enabled(settings):
        return [settings]
    try:
        return instance_gets(settings, host_gpus(settings))
    except PerGpuError as e:
        raise ConfigError(f"{host.name}: {e}") from e
