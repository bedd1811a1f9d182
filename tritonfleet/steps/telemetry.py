"""GPU health on every host: the node exporter, the GPU fault collector and the inference probe
(deploys/telemetry.py; docs/operations.md, "GPU health after the deploy").

* the distro's ``prometheus-node-exporter`` (no recommends; ``telemetry_node_exporter``), running
  and enabled: its textfile collector serves what the two services below write;
* ``tritonfleet-gpu-telemetry.service``: tritonfleet/gpu/telemetry.py (driver query every
  ``telemetry_interval`` seconds, Xid reports from ``telemetry_kmsg_path`` as they come);
* ``tritonfleet-inference-probe.service``: tritonfleet/observability/inference_probe.py (one real
  inference per ready model every ``probe_interval`` seconds, on every Triton instance's port).

The scripts are the package's own files, copied as they are, with the health-signal spec both
read their metric names from (tritonfleet/gpu/signals.py, as gpu_signals.py next to them) and the
collector's Xid ledger with NVIDIA's Xid catalog (gpu_xids.py, xid_catalog.json); a service
restarts only when its script, a file it reads or its unit changed, and systemd is reloaded only when a unit file changed (noted for the
GPU-loss guard, which deploys/telemetry.py runs after this step). ``gpu_telemetry = False``
stops, disables and removes both services, their files and their textfiles (the node exporter
package stays: it may serve other collectors).
"""

from __future__ import annotations

import posixpath
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.operations import files, server, systemd

from ..core.shell import q
from ..gpu.fault_push import host_token
from ..gpu.telemetry import TEXTFILE as COLLECTOR_TEXTFILE
from ..host.facts import FileState, UnitState
from ..host.ops import converged
from ..observability import telemetry_units as tu
from ..observability.inference_probe import TEXTFILE as PROBE_TEXTFILE
from ..pyinfra_ext import memo
from ..pyinfra_ext.check import will_change
from ..pyinfra_ext.install import tritonfleet_step
from ..serving.ops import gpu_guard as guard_ops
from ..serving.per_gpu import host_instance_gets as instance_gets
from ..settings import access
from ..settings.access import Settings

NODE_EXPORTER = "prometheus-node-exporter"
#: the files the step puts under /usr/local/lib/tritonfleet, and what each script reads of them
SHIPPED = (tu.COLLECTOR, tu.PROBE, tu.SIGNALS, tu.XIDS, tu.XID_CATALOG, tu.PUSH)
READS = {tu.COLLECTOR: (tu.SIGNALS, tu.XIDS, tu.XID_CATALOG, tu.PUSH), tu.PROBE: (tu.SIGNALS,)}


def enabled(settings: Settings) -> bool:
    value = settings.get("gpu_telemetry")
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def http_ports() -> list[int]:
    """Every Triton instance's HTTP port on the current host (one per GPU with triton_per_gpu)."""
    return [int(g.get("triton_http_port")) for g in instance_gets(access.current())]


def wanted_files() -> dict[str, str]:
    try:
        return tu.files(access.current(), http_ports(), host.name)
    except tu.UnitError as e:
        raise access.ConfigError(f"{host.name}: {e}") from e


def push_token() -> str | None:
    """This host's token of the collector's direct path (``quarantine_push_url``): the HMAC of its
    name under the receiver's push secret, read on the control machine; None when there is no
    direct path."""
    if not access.get("quarantine_push_url"):
        return None
    path = access.get("quarantine_push_secret_file")
    try:
        secret = Path(path).read_text().strip()
    except OSError as e:
        raise access.ConfigError(
            f"{host.name}: quarantine_push_secret_file {path}: {e.strerror} (write one with "
            "`tritonfleet quarantine token --out PATH`, or unset quarantine_push_url)"
        ) from e
    if not secret:
        raise access.ConfigError(
            f"{host.name}: quarantine_push_secret_file {path} is empty (write one with "
            "`tritonfleet quarantine token --out PATH`)"
        )
    return host_token(secret, host.name)


def _services() -> list[tuple[str, str]]:
    """(unit name, its script) of the two services."""
    return [(tu.COLLECTOR_UNIT, tu.COLLECTOR), (tu.PROBE_UNIT, tu.PROBE)]


@tritonfleet_step("GPU telemetry")
def gpu_telemetry():
    """GPU health on the host: the node exporter, the GPU fault collector and the
    inference probe as services (or, with ``gpu_telemetry = False``, all of it removed).

    Changes: the packages (node exporter, python3), the textfile directory, the two scripts, the
    health-signal spec, the collector's Xid ledger and NVIDIA's Xid catalog under
    /usr/local/lib/tritonfleet, their units; a service restarts only when its unit, its script or a
    file it reads changed.

    Tunables: ``gpu_telemetry``, ``telemetry_node_exporter``, ``telemetry_textfile_dir``,
    ``telemetry_interval``, ``telemetry_smi_timeout``, ``telemetry_kmsg_path``, ``probe_interval``,
    ``probe_timeout``; the collector's direct path to the quarantine receiver:
    ``quarantine_push_url``, ``quarantine_push_secret_file``, ``quarantine_push_token_path``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.telemetry import gpu_telemetry

        gpu_telemetry()
    """
    units = [f"{name}.service" for name, _ in _services()]
    paths = [*SHIPPED] + [tu.unit_path(name) for name, _ in _services()]
    # what a converged host is asked, in one remote command
    memo.prefetch(
        *[(FileState, {"path": p}) for p in paths],
        *[(UnitState, {"unit": u}) for u in units],
        *([(UnitState, {"unit": f"{NODE_EXPORTER}.service"})] if access.get("telemetry_node_exporter") else []),
    )
    if not enabled(access.current()):
        return remove()
    want = wanted_files()
    token = push_token()
    packages = [NODE_EXPORTER, "python3"] if access.get("telemetry_node_exporter") else ["python3"]
    converged.packages(
        name=f"{' and '.join(packages)} (no recommends)",
        packages=packages,
        no_recommends=True,
        setting="telemetry_node_exporter",
    )
    textfiles = access.get("telemetry_textfile_dir")
    files.directory(name=f"node exporter textfile directory {textfiles}", path=textfiles, present=True)
    scripts = {
        p: converged.put(name=f"{p} (tritonfleet's own file)", src=StringIO(want[p]), dest=p, mode="644")
        for p in SHIPPED
    }
    if token is not None:  # the direct path: this host's own token, root's only
        token_path = access.get("quarantine_push_token_path")
        files.directory(
            name=f"{posixpath.dirname(token_path)} (the push token's)", path=posixpath.dirname(token_path), present=True
        )
        scripts[token_path] = converged.put(
            name=f"{token_path} (this host's push token)", src=StringIO(token + "\n"), dest=token_path, mode="600"
        )
    unit_ops = {
        name: converged.put(
            name=f"systemd unit {name}.service",
            src=StringIO(want[tu.unit_path(name)]),
            dest=tu.unit_path(name),
            mode="644",
        )
        for name, _ in _services()
    }
    # daemon-reload only when a unit file really changed (it can cost running GPU containers their
    # devices with the systemd cgroup driver: the GPU-loss guard checks after this step)
    if will_change(*unit_ops.values()):
        systemd.daemon_reload(name="systemd daemon-reload (telemetry units changed)")
        guard_ops.note("telemetry units changed", *unit_ops.values())
    for name, script in _services():
        reads = [
            *READS[script],
            *([access.get("quarantine_push_token_path")] if token and script == tu.COLLECTOR else []),
        ]
        if will_change(unit_ops[name], scripts[script], *[scripts[p] for p in reads]):
            systemd.service(
                name=f"restart {name} (its unit or script changed)",
                service=f"{name}.service",
                running=True,
                restarted=True,
                enabled=True,
            )
        else:
            converged.service(name=f"{name} running and enabled", service=f"{name}.service", running=True, enabled=True)
    if access.get("telemetry_node_exporter"):
        converged.service(
            name=f"{NODE_EXPORTER} running and enabled", service=f"{NODE_EXPORTER}.service", running=True, enabled=True
        )


def remove() -> None:
    """gpu_telemetry = False: stop, disable and remove what the step put on the host, when it is
    there (a host that never had it changes nothing)."""
    textfiles = access.get("telemetry_textfile_dir")
    present = [
        name
        for name, script in _services()
        if memo.fact(FileState, path=tu.unit_path(name))
        or memo.fact(FileState, path=script)
        or memo.fact(UnitState, unit=f"{name}.service")["running"]
    ]
    if not present:
        host.noop("GPU telemetry is off and not on the host")
        return
    commands = [f"systemctl disable --now {q(name + '.service')} 2>/dev/null || true" for name in present]
    commands.append(
        "rm -f "
        + " ".join(
            q(p)
            for p in (
                *[tu.unit_path(n) for n, _ in _services()],
                *SHIPPED,
                access.get("quarantine_push_token_path"),
                f"{textfiles}/{COLLECTOR_TEXTFILE}",
                f"{textfiles}/{PROBE_TEXTFILE}",
            )
        )
    )
    commands.append(f"rmdir {q(tu.LIB_DIR)} 2>/dev/null || true")
    gone = server.shell(name=f"stop, disable and remove {', '.join(present)} (gpu_telemetry is off)", commands=commands)
    systemd.daemon_reload(name="systemd daemon-reload (telemetry units removed)")
    guard_ops.note("telemetry units removed", gone)
