"""Every setting of every host, checked once when the inventory is loaded.

A fleet command (status, rollout, prometheus, loadtest, tune) checks the whole inventory right
after loading it (``tritonfleet.inventory.roster.load_inventory``); a deploy checks each host first thing in
its pre-flight (``tritonfleet.preflight.check_settings``), before it reads a fact. What is
refused, with the host, the setting, its value and where it was set (``--data``, the host's data
in the inventory, ``group_data/<group>.py``, an inventory group, ``group_data/all.py``):

* a name that is neither a tunable (tritonfleet/settings/defaults.py), ``gpu_class``, a pyinfra connection
  setting nor a pyinfra global argument, nor listed in ``extra_host_data``: a misspelling, shown
  with the nearest known name (difflib);
* a value of the wrong type: a word where a number belongs ("eighty"), a number written as text
  ("8000" in quotes), a boolean where a number belongs, a list where a name belongs;
* a value out of range: a port outside 1-65535, a negative timeout, a ratio outside 0-1;
* a value outside a fixed set of choices (``health_via``, ``lb``, ...);
* a GPU class tritonfleet has no rules for (the known classes come from the caller:
  ``tritonfleet.gpu.rules.GPU_CLASSES``).

Each tunable has exactly one rule in :data:`RULES`; a test keeps RULES and the defaults in step,
and checks each default passes its own rule. Values the rules cannot judge alone (the per-GPU
port layout, a driver branch against the Triton image, model_overrides against Triton's schema)
stay with the checks that have what they need (pre-flight, tritonfleet.serving.per_gpu, validate).

This module imports nothing of tritonfleet but the defaults and the error base: it sits under
every domain (settings layer).
"""

from __future__ import annotations

import ast
import difflib
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra.api.arguments import all_global_arguments
from pyinfra.api.connectors import get_all_connectors

from ..core.errors import UsageError
from . import origin_stores
from .defaults import DEFAULTS
from .rules import (
    Rule,
    absolute_path,
    budget,
    capacity_limit,
    choice,
    dict_of_dicts,
    flag,
    http_url,
    is_int,
    listen_address,
    login_name,
    mapping,
    name_list,
    named_address,
    number,
    origin_url,
    seconds,
    text,
    text_list,
    url,
    whole,
    xid_list,
)

__all__ = ["RULES", "SettingsError", "check_hosts", "known_names", "problems"]


class SettingsError(UsageError):
    """One or more settings are refused; the message has a line for each."""


# ---- rules ---------------------------------------------------------------------------------

PORT = whole(1, 65535)

#: One rule for every tunable of tritonfleet/settings/defaults.py, in its order. Choices are written here
#: again for the domains that own them; tests/unit/settings/test_check.py keeps them equal
#: (tritonfleet.pyinfra_ext.transfer.TRANSPORTS, tritonfleet.serving.drain.KINDS, ...).
RULES: dict[str, Rule] = {
    # SSH
    "ssh_strict_host_key_checking": choice("yes", "accept-new", "ask", "no", "off"),
    "ssh_keepalive_interval": whole(1, unit="seconds"),
    "ssh_keepalive_count": whole(1),
    "deploy_lock_timeout": seconds(lo_open=False),
    # target OS
    "cuda_distro": choice(None, "ubuntu2204", "ubuntu2404", "ubuntu2604", "debian12"),
    "apt_lock_timeout": seconds(lo_open=False),
    # NVIDIA driver
    "cuda_repo_url": text(empty=False),
    "cuda_repo_key_name": text(empty=False),
    "cuda_repo_key_fingerprint": text(empty=False),
    "nvidia_driver_source": choice("cuda", "debian"),
    "nvidia_driver_migrate": flag(),
    "nvidia_driver_branch": text(none=True, empty=False, digits_ok=True),
    "nvidia_driver_branch_default": mapping(text(empty=False, digits_ok=True)),
    "nvidia_driver_version": text(none=True, empty=False),
    "nvidia_driver_packages": text_list(none=True),
    "nvidia_kernel_module": choice(None, "open", "proprietary"),
    "nvidia_kernel_packages": text_list(),
    "nvidia_hold_packages": flag(),
    "nvidia_persistenced": flag(),
    "ssh_user_linger": flag(),
    "nvidia_secure_boot_ok": flag(),
    "nvidia_secure_boot_unknown_ok": flag(),
    "nvidia_reboot_if_needed": flag(),
    "nvidia_reboot_timeout": seconds(),
    "nvidia_smi_command": text(empty=False),
    # Docker Engine
    "docker_source": choice("docker", "distro"),
    "docker_repo_url": text(empty=False),
    "docker_repo_key_fingerprint": text(empty=False),
    "docker_version": text(none=True, empty=False),
    # NVIDIA Container Toolkit
    "container_toolkit_repo_url": text(empty=False),
    "container_toolkit_key_url": text(empty=False),
    "container_toolkit_key_fingerprint": text(empty=False),
    "container_toolkit_version": text(empty=False),
    # GPU verification
    "cuda_test_image": text(empty=False),
    "gpu_min_compute_capability": text(empty=False),
    "gpu_min_cuda_version": text(empty=False),
    "gpu_verify_container": choice("changes", "always"),
    "gpu_count": whole(1, none=True),
    # Triton images
    "bulk_transfer": choice("auto", "ssh", "connection"),
    "triton_image": text(empty=False, padded=False),
    "image_archives": mapping(text(empty=False), "an archive path"),
    "registry_user": text(none=True, empty=False),
    "registry_password_env": text(empty=False),
    "registry_host": text(none=True, empty=False),
    # model repository
    "model_repository": text(empty=False),
    "model_overrides": mapping(dict_of_dicts(), "a dict of config fields"),
    "gpu_placement": choice("spread", "as-written"),
    "gpu_placement_models": mapping(choice("spread", "as-written")),
    "triton_base_dir": text(empty=False),
    "triton_keep_releases": whole(0),
    # model origin (tritonfleet.model_repo.origin: AUTHS)
    "model_origin": origin_url(none=True),  # schemes and URL rules: origin_stores.STORES
    "model_origin_endpoint": url("http", "https", none=True),
    "model_origin_region": text(none=True, empty=False),
    "model_origin_auth": choice("presigned", "host"),
    "model_origin_url_expiry": whole(60, 7 * 24 * 3600, unit="seconds"),
    "model_origin_credentials_file": absolute_path(),
    "model_origin_upload_url": url("http", "https", none=True),
    "model_origin_upload_user": text(none=True, empty=False),
    "model_origin_upload_password_env": text(empty=False),
    "model_origin_parallel": whole(1),
    "model_origin_retries": whole(0),
    # model fan-out
    "model_fanout": flag(),
    "model_fanout_tracker": url("http", "https", none=True),
    "model_fanout_port": PORT,
    "model_fanout_piece_kb": choice(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    "model_fanout_seed_minutes": whole(0),
    "model_fanout_stall_seconds": whole(1),
    "model_fanout_wait_seconds": whole(1),
    "image_fanout": flag(),
    "image_fanout_port": PORT,
    "image_fanout_local_port": PORT,
    "fanout_zone": text(none=True, empty=False),
    "fanout_seed": choice(None, True, False),
    # image mirror
    "image_mirror": text(none=True, empty=False),
    "image_mirror_upstream": url("http", "https"),
    "image_mirror_group": text(empty=False),
    "image_mirror_port": PORT,
    "image_mirror_listen": named_address(),
    "image_mirror_tls_cert": text(none=True, empty=False),
    "image_mirror_tls_key": text(none=True, empty=False),
    "image_mirror_ca": text(none=True, empty=False),
    "image_mirror_storage": text(empty=False),
    "image_mirror_auth": flag(),
    "mirror_client_user": login_name(),
    "mirror_client_password_env": text(empty=False),
    # Triton service
    "triton_service": text(empty=False),
    "triton_container_name": text(empty=False),
    "triton_http_port": PORT,
    "triton_grpc_port": PORT,
    "triton_metrics_port": PORT,
    "triton_http_bind": text(),
    "triton_grpc_bind": text(),
    "triton_metrics_bind": text(),
    "triton_gpus": text(none=True, empty=False),
    "triton_shm_size": text(none=True, empty=False),
    "triton_ulimit_memlock": text(none=True, empty=False, digits_ok=True),
    "triton_ulimit_stack": text(none=True, empty=False, digits_ok=True),
    "triton_strict_model_config": flag(),
    "triton_model_control_mode": choice("none", "explicit"),
    "triton_extra_args": text_list(),
    "triton_restricted_apis": text_list(),
    "triton_api_key_file": text(empty=False),
    "triton_container_user": text(),
    "triton_start_timeout": seconds(),
    "triton_stop_timeout": seconds(lo_open=False),
    "triton_per_gpu": flag(),
    "triton_per_gpu_port_step": whole(1, 65535),
    # rollout and rollback
    "rollback_to": mapping(dict_of_dicts(), '{"release": ..., "unit": ...}'),
    "fleet_parallel": whole(1),
    "fleet_workers": whole(0),
    # rollout: capacity, traffic canary, host states
    "rollout_max_unavailable": capacity_limit(),
    "rollout_min_available": capacity_limit(),
    "rollout_min_available_models": mapping(capacity_limit(none=False), 'hosts or "P%"'),
    "rollout_capacity_wait": seconds(lo_open=False),
    "rollout_metrics_listen": listen_address(none=True),
    "canary_weight": number(0, 100, lo_open=True, none=True, unit="percent"),
    "canary_prometheus_url": http_url(none=True),
    "canary_prometheus_job": text(empty=False),
    "canary_model": text(none=True, empty=False),
    "canary_analysis_seconds": seconds(),
    "canary_step_seconds": seconds(),
    "canary_max_extensions": whole(0),
    "canary_min_requests": whole(1),
    "canary_alpha": number(0, 0.5, lo_open=True),
    "canary_max_error_increase": number(0, 1),
    "canary_max_latency_rise": number(0),
    "canary_watchdog_ttl": seconds(),
    # load balancer drain
    "lb": choice(None, "haproxy", "hooks"),
    "lb_haproxy_sockets": text_list(),
    "lb_haproxy_backend": text(empty=False),
    "lb_haproxy_server": text(none=True, empty=False),
    "lb_drain_command": text(none=True, empty=False),
    "lb_ready_command": text(none=True, empty=False),
    "lb_drain_timeout": seconds(),
    # health gate
    "health_via": choice("direct", "ssh"),
    "health_host": text(none=True, empty=False),
    "health_timeout": seconds(),
    "health_request_timeout": seconds(),
    "health_warm_inference": flag(),
    "auto_rollback": flag(),
    # monitoring
    "monitor_latency_ms": number(0, lo_open=True, unit="milliseconds"),
    "monitor_failure_ratio": number(0, 1),
    "monitor_queue_compute_ratio": number(0),
    "monitor_low_utilization": number(0, 1),
    "monitor_busy_utilization": number(0, 1),
    "monitor_gpu_memory_ratio": number(0, 1),
    # performance gate
    "perf_gate_model": text(none=True, empty=False),
    "perf_gate_concurrency": whole(1),
    "perf_gate_duration": seconds(),
    "perf_gate_max_throughput_drop": number(0, 1),
    "perf_gate_max_p95_rise": number(0),
    # GPU health: telemetry, inference probe, quarantine
    "gpu_telemetry": flag(),
    "telemetry_node_exporter": flag(),
    "telemetry_node_exporter_port": PORT,
    "telemetry_textfile_dir": text(empty=False),
    "telemetry_interval": seconds(),
    "telemetry_smi_timeout": seconds(),
    "telemetry_kmsg_path": text(empty=False),
    "probe_interval": seconds(),
    "probe_timeout": seconds(),
    "monitor_probe_failures": whole(1),
    "monitor_gpu_temperature_c": number(0, unit="degrees C"),
    "quarantine_xids": xid_list(),
    "quarantine_budget": budget(),
    "quarantine_url": http_url(none=True),
    "quarantine_check_interval": seconds(),
    "quarantine_gate_timeout": seconds(),
    "quarantine_token_file": text(empty=False),
    "quarantine_resolve_grace": seconds(lo_open=False),
    "quarantine_breaker_fraction": number(0, 1, lo_open=True),
    "quarantine_breaker_window": seconds(),
    "quarantine_refault_window": seconds(),
    "quarantine_remediate": flag(),
    "quarantine_push_url": http_url(none=True),
    "quarantine_push_secret_file": text(empty=False),
    "quarantine_push_token_path": text(empty=False),
    "quarantine_push_ttl": seconds(),
    # the settings check itself
    "extra_host_data": name_list(),
    # pull mode
    "pull_poll_interval": seconds(),
    "pull_converge_interval": seconds(),
    "pull_report_timeout": seconds(),
    "pull_pointer_ttl": seconds(),
    "pull_download_limit": whole(1, unit="bytes"),
    "pull_textfile": text(),
}

#: Settings that are no tunable but that tritonfleet reads: the host's GPU class (its group's
#: group data sets it), and the pyinfra connection settings whose values tritonfleet uses itself.
OTHER_RULES: dict[str, Rule] = {
    "ssh_hostname": text(empty=False),
    "ssh_user": text(empty=False),
    "ssh_port": PORT,
}


@functools.cache
def _pyinfra_names() -> frozenset[str]:
    """Names pyinfra itself reads from host data: every installed connector's settings
    (``data_meta``: ssh_hostname, ssh_port, ...) and the global arguments (_sudo, _env, ...).
    Once a process: a deploy's pre-flight asks for every host."""
    names = {name for name, _ in all_global_arguments() if name.startswith("_")}
    for connector in get_all_connectors().values():
        names |= set(getattr(connector, "data_meta", {}) or {})
    return frozenset(names)


def known_names() -> set[str]:
    """Every name host data may hold without being listed in ``extra_host_data``."""
    return set(DEFAULTS) | set(RULES) | set(OTHER_RULES) | {"gpu_class"} | _pyinfra_names()


# ---- where a value was set -----------------------------------------------------------------


def _assigns(path: Path, key: str) -> bool:
    """Whether the Python file ``path`` assigns ``key`` at its top level."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        for t in targets:
            names = t.elts if isinstance(t, ast.Tuple) else [t]
            if any(isinstance(n, ast.Name) and n.id == key for n in names):
                return True
    return False


class ValueSources:
    """Where each value of an inventory's hosts was set, in pyinfra's precedence: --data, host
    data, group data (the host's last group first), the inventory's ``all`` data. ``group_dirs``:
    the group_data directories pyinfra read (the working directory's and the inventory's)."""

    def __init__(self, inventory: Any, inventory_file: str | None, group_dirs: Iterable[Path]):
        self.inventory = inventory
        self.file = inventory_file or "the inventory"
        self.group_dirs = [Path(d) for d in group_dirs]

    def _group_file(self, group: str, key: str) -> str | None:
        for d in self.group_dirs:
            path = d / f"{group}.py"
            if path.is_file() and _assigns(path, key):
                return _shown(path)
        return None

    def __call__(self, host: Any, key: str) -> str:
        inv = self.inventory
        if key in (inv.get_override_data() or {}):
            return "--data"
        if key in (inv.get_host_data(host.name) or {}):
            return f"host data of {host.name} in {self.file}"
        for group in reversed(list(host.groups)):
            if key in (inv.get_group_data(group) or {}):
                return self._group_file(group, key) or f"group {group} in {self.file}"
        if key in (inv.get_data() or {}):
            return self._group_file("all", key) or f"the all group in {self.file}"
        return "tritonfleet's default"


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def group_dirs(inventory_file: str | None = None, cwd: str | Path | None = None) -> list[Path]:
    """The group_data directories pyinfra reads for ``inventory_file`` run from ``cwd``
    (pyinfra_cli.inventory.make_inventory_from_files: <cwd>/group_data, then
    <inventory's directory>/group_data). Without the inventory's path (a deploy),
    <cwd>/inventories/group_data stands for the usual layout (tritonfleet init)."""
    base = Path(cwd) if cwd else Path.cwd()
    out = [base / "group_data"]
    if inventory_file:
        out.append(Path(inventory_file).resolve().parent / "group_data")
    else:
        out.append(base / "inventories" / "group_data")
    return [d for i, d in enumerate(out) if d not in out[:i]]


# ---- the check -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingProblem:
    host: str
    key: str
    value: Any
    where: str
    why: str

    def line(self, hosts: list[str] | None = None) -> str:
        who = ", ".join(hosts or [self.host])
        return f"{who}: {self.key} = {_short(self.value)} ({self.where}): {self.why}"


def _short(value: Any) -> str:
    text_ = repr(value)
    return text_ if len(text_) <= 80 else text_[:77] + "..."


def problems(
    name: str,
    data: Mapping[str, Any],
    where: Callable[[str], str],
    gpu_classes: Iterable[str],
    known: set[str] | None = None,
) -> list[SettingProblem]:
    """Every refused setting of one host (``data``: its merged host data, without the package's
    defaults; ``where(key)``: where the value was set)."""
    known = known_names() if known is None else known
    out: list[SettingProblem] = []
    extra = data.get("extra_host_data", [])
    extra_ok = RULES["extra_host_data"].problem(extra) is None
    own = set(extra) if extra_ok else set()
    for key in data:
        value = data[key]
        if key in own and key not in known:
            continue
        if key == "gpu_class":
            why = _gpu_class_problem(value, gpu_classes)
        elif key in RULES:
            why = RULES[key].problem(value)
        elif key in OTHER_RULES:
            why = OTHER_RULES[key].problem(value)
        elif key in known:
            why = None
        else:
            near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            why = (
                "is no setting of tritonfleet or pyinfra"
                + (f": did you mean {near[0]}?" if near else "")
                + " (`python -m tritonfleet.tunables` lists every tunable; data your own deploy "
                "code reads goes into extra_host_data)"
            )
        if why:
            out.append(SettingProblem(name, key, value, where(key), why))
    clear = origin_stores.login_problem(data)
    if clear:
        key, upload = clear
        out.append(
            SettingProblem(
                name,
                key,
                upload,
                where(key),
                f"uploads with model_origin_upload_user {data.get('model_origin_upload_user')!r}, whose "
                "password would cross the network in clear over http://: upload over https://",
            )
        )
    ports = [
        k for k in ("triton_http_port", "triton_grpc_port", "triton_metrics_port") if is_int(data.get(k, DEFAULTS[k]))
    ]
    values = [data.get(k, DEFAULTS[k]) for k in ports]
    if len(ports) == 3 and len(set(values)) < 3:
        k = next(k for k in ports if k in data and values.count(data[k]) > 1)
        out.append(
            SettingProblem(
                name,
                k,
                data[k],
                where(k),
                "triton_http_port, triton_grpc_port and triton_metrics_port must differ "
                f"(they are {', '.join(str(v) for v in values)})",
            )
        )
    return out


def _gpu_class_problem(value: Any, gpu_classes: Iterable[str]) -> str | None:
    classes = sorted(str(c).upper() for c in gpu_classes)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        return f"must be the name of a GPU class: one of {', '.join(classes)}"
    if value.upper() in classes:
        return None
    near = difflib.get_close_matches(value.upper(), classes, n=1, cutoff=0.5)
    return (
        f"is a GPU class tritonfleet has no rules for (known: {', '.join(classes)})"
        + (f": did you mean {near[0]}?" if near else "")
        + "; put the host in one of those groups, or add the class to tritonfleet/gpu/rules.py "
        "GPU_CLASSES"
    )


def check_hosts(hosts: Iterable[Any], origins: ValueSources, gpu_classes: Iterable[str]) -> None:
    """Check every pyinfra host of an inventory (their data as pyinfra merged it, without the
    package's defaults); raise SettingsError with one line per refused setting, hosts that share
    one (group data) on one line."""
    known = known_names()
    found: dict[tuple, list[str]] = {}
    first: dict[tuple, SettingProblem] = {}
    for h in hosts:

        def where(key: str, h: Any = h) -> str:
            return origins(h, key)

        for p in problems(h.name, h.data.dict(), where, gpu_classes, known):
            k = (p.key, repr(p.value), p.where, p.why)
            found.setdefault(k, []).append(p.host)
            first.setdefault(k, p)
    if found:
        lines = [first[k].line(names) for k, names in found.items()]
        raise SettingsError("settings refused, nothing was run:\n" + "\n".join(f"  {line}" for line in lines))
