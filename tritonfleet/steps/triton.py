"""Triton service: images, model repository releases, the systemd unit, the health gate."""

from __future__ import annotations

from functools import cache
from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import server, systemd

from ..core.errors import UsageError
from ..core.report import HostFailure, in_rollout
from ..core.shell import q
from ..host.facts import DockerImageId, FileState
from ..host.ops import converged
from ..model_repo import release, render
from ..model_repo.facts import ReleaseManifest, ReleaseState
from ..model_repo.ops import model_release
from ..model_repo.render import current_host_repository
from ..pyinfra_ext import memo
from ..pyinfra_ext.check import check, check_with_steps, will_change
from ..pyinfra_ext.install import tritonfleet_step
from ..pyinfra_ext.stream import docker_load, docker_pull
from ..pyinfra_ext.transfer import TransferError
from ..pyinfra_ext.transfer import choose as choose_transport
from ..serving import apikey, per_gpu
from ..serving.facts import DeployHistory, PerGpuUnits, TritonContainer
from ..serving.health import HealthError, gate_current_host
from ..serving.images import image_id, login_registry, needs_login, needs_mirror_login
from ..serving.ops import gpu_guard as guard_ops
from ..serving.ops import lb
from ..serving.ops.history import append_record
from ..serving.ops.registry import docker_login
from ..serving.per_gpu import host_instance_gets as instance_gets
from ..serving.reads import container_fact_args, triton_facts
from ..serving.repository_api import model_diff, repository_api_commands
from ..serving.unit import render_unit, restricted_apis, unit_context, unit_path, units_digest
from ..settings import access
from ..settings.access import Settings


@cache
def _archive_image_id(path: str) -> str:
    return image_id(Path(path))


def ensure_image(image: str, before_pull=None) -> list:
    """Make ``image`` present: `docker load` of a configured archive, or a pull. Returns the ops
    that changed something (for restart gating). Runs before any restart, so a failed pull or load
    leaves the running container serving. ``before_pull()``: the operations that bring the image's
    layers another way first (staging's image fan-out), after the logins, before the pull."""
    archives = access.get("image_archives") or {}
    have = memo.fact(DockerImageId, image=image)
    if image in archives:
        archive = archives[image]
        if not Path(archive).is_file():
            raise access.ConfigError(f"{host.name}: image archive for {image} not found: {archive}")
        want = _archive_image_id(archive)
        if have == want:
            return []
        # streamed into `docker load` on the host (bulk_transfer): no copy on the host's disk
        transport = access.get("bulk_transfer")
        _check_transport(transport)
        return [
            docker_load(
                name=f"docker load {image} from {Path(archive).name}", archive=str(archive), transport=transport
            )
        ]
    if have:
        return []
    ops = []
    if needs_login(access.current(), image):
        ops.append(
            docker_login(
                name=f"docker login {login_registry(access.current())} as {access.get('registry_user')} "
                f"(secret from ${access.get('registry_password_env')}, on stdin)",
                registry=login_registry(access.current()),
                user=access.get("registry_user"),
                secret_env=access.get("registry_password_env"),
            )
        )
    if needs_mirror_login(access.current(), image):
        ops.append(
            docker_login(
                name=f"docker login {access.get('image_mirror')} (the image mirror) as "
                f"{access.get('mirror_client_user')} (secret from "
                f"${access.get('mirror_client_password_env')}, on stdin)",
                registry=access.get("image_mirror"),
                user=access.get("mirror_client_user"),
                secret_env=access.get("mirror_client_password_env"),
            )
        )
    if before_pull is not None:
        ops += before_pull()
    ops.append(docker_pull(name=f"docker pull {image}", image=image))
    return ops


def _check_transport(transport: str) -> None:
    """Refuse a transport that cannot work before any host is touched."""
    try:
        choose_transport(host, transport)
    except TransferError as e:
        raise access.ConfigError(str(e)) from e


def sync_models() -> list:
    """Make this host's repository the live release (tritonfleet.model_repo.release): one remote command
    when it already is (no file on the host is read: sizes and mtimes are compared with the
    release's stat record). Otherwise only files no release on the host holds travel, in one
    stream; Triton only ever sees a complete release."""
    base = access.get("triton_base_dir")
    local, man, rid = current_host_repository(access.current())
    live = memo.fact(ReleaseState, base=base)
    if live["current"] == rid and not live["drift"]:
        host.noop(f"model release {rid} is live" + ("" if live["verified"] else " (no stat record)"))
        stale = live.get("incoming") or []
        if stale:
            # a transfer of another release was cut (Ctrl-C, lost link, halted rollout) and the
            # host went back to this one: what it left only takes disk space
            server.shell(
                name=f"remove interrupted transfers of other releases ({', '.join(stale)})",
                commands=[release.discard_incoming_script(base, stale)],
            )
        return []
    why = (
        f"{len(live['drift'])} files changed on the host: {', '.join(live['drift'][:5])}"
        if live["current"] == rid
        else f"live: {live['current'] or 'none'}"
    )
    origin = model_origin()
    if origin is not None:
        # the hosts fetch from the model origin (tritonfleet.model_repo): every host stages the
        # release (complete, not live) before any host switches to it
        args = {
            "base": base,
            "release": rid,
            "local": str(local),
            "manifest": man,
            "keep": int(access.get("triton_keep_releases")),
            "origin": origin,
        }
        return [
            model_release(name=f"stage model release {rid} from {origin.url} ({why})", switch=False, **args),
            model_release(name=f"model release {rid} ({why})", **args),
        ]
    transport = access.get("bulk_transfer")
    _check_transport(transport)
    return [
        model_release(
            name=f"model release {rid} ({why})",
            base=base,
            release=rid,
            local=str(local),
            manifest=man,
            keep=int(access.get("triton_keep_releases")),
            transport=transport,
        )
    ]


def model_origin():
    """The model origin hosts fetch releases from (tritonfleet.model_repo.origin), or None: the
    push over SSH."""
    from ..model_repo.origin import from_settings

    try:
        return from_settings(access.current())
    except UsageError as e:
        raise access.ConfigError(f"{host.name}: {e}") from e


@tritonfleet_step("Triton image")
def triton_image():
    # what the Triton steps read on a converged host, in one remote command
    """The Triton image on the host before any restart: pulled (logging in to a private
    registry first) or loaded from a local archive; reads what the Triton steps need in one command.

    Changes: the image in Docker's store (nothing when it is there); returns the operations, which
    ``triton_service`` reads to decide a restart.

    Tunables: ``triton_image``, ``image_archives``, ``bulk_transfer``, ``registry_user``,
    ``registry_password_env``, ``registry_host``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.triton import triton_image

        image = triton_image()
    """
    memo.prefetch(*triton_facts(access.current()))  # read by pre-flight already unless something changed
    return ensure_image(access.get("triton_image"))


@tritonfleet_step("Model repository")
def model_repository():
    """The model repository as a new release on the host: sent by content (or fetched
    by the host from the model origin), switched atomically; earlier releases kept.

    Changes: ``<triton_base_dir>/releases/<release>`` and the ``model_repository`` link; returns the
    operations, which ``triton_service`` reads to decide a restart or a reload.

    Tunables: ``model_repository``, ``model_overrides``, ``triton_base_dir``, ``triton_keep_releases``,
    ``model_origin``, ``gpu_placement``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.triton import model_repository

        models = model_repository()
    """
    return sync_models()


def model_changes() -> tuple[list[str], list[str]]:
    """(models to load, models to unload) between the live release and this host's release."""
    base = access.get("triton_base_dir")
    _, man, rid = current_host_repository(access.current())
    old = memo.fact(ReleaseState, base=base)["current"]
    if old == rid:
        return [], []
    return model_diff(host.get_fact(ReleaseManifest, base=base, release=old) if old else {}, man)


def api_key() -> tuple[list, str]:
    """The host's key for Triton's restricted APIs, made on the host when missing (and its mode
    and owner put right). Returns (the ops, why Triton must restart to take it, or "")."""
    if not restricted_apis(access.current()):
        return [], ""
    path = access.get("triton_api_key_file")
    have = memo.fact(FileState, path=path)
    if have and have.get("mode") == "600" and have.get("user") == "root":
        host.noop(f"Triton API key {path} is there (0600 root)")
        return [], ""
    op = server.shell(
        name=f"Triton API key {path} ({'made' if not have else 'mode 0600 root'} on the host)",
        commands=[apikey.key_command(path)],
    )
    return [op], "" if have else "API key created"


def retire_units(keep: set[str]) -> bool:
    """Stop, disable and remove the Triton units of the other mode: the per-GPU units not in
    ``keep`` (GPUs the host no longer has, or all of them after triton_per_gpu was turned off),
    and the single unit when per-GPU units replace it. Before any unit starts: instance 0 serves
    on the single unit's ports. Returns whether a unit was removed (a daemon-reload is due)."""
    names = [n for n in memo.fact(PerGpuUnits, service=access.get("triton_service")) if n not in keep]
    single = unit_path(access.current()).rsplit("/", 1)[1]
    if per_gpu.enabled(access.current()) and memo.fact(FileState, path=unit_path(access.current())):
        names.insert(0, single)
    for name in names:
        path = f"/etc/systemd/system/{name}"
        why = (
            "one Triton per GPU replaces it"
            if name == single
            else "triton_per_gpu is off"
            if not per_gpu.enabled(access.current())
            else "its GPU is gone"
        )
        server.shell(
            name=f"stop, disable and remove {name} ({why})",
            commands=[f"systemctl disable --now {q(name)} 2>/dev/null; rm -f {q(path)}"],
        )
    return bool(names)


@tritonfleet_step("Triton service")
def triton_service(image: list | None = None, models: list | None = None):
    """The systemd unit running Triton's container (or one per GPU with
    ``triton_per_gpu``); restarted, or its models reloaded, only on change, drained first behind a
    load balancer.

    + image: the operations ``triton_image`` returned (a changed image restarts Triton)
    + models: the operations ``model_repository`` returned (a new release reloads or restarts)

    Changes: the unit file(s), the API key file with restricted APIs, a daemon-reload when a unit
    changed, a restart or a model reload; the GPU-loss guard after a reload.

    Tunables: ``triton_service``, ``triton_container_name``, ``triton_http_port``, ``triton_grpc_port``,
    ``triton_metrics_port``, ``triton_model_control_mode``, ``triton_per_gpu``, ``triton_restricted_apis``,
    ``triton_api_key_file``, ``triton_extra_args``, ``lb``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.triton import model_repository, triton_image, triton_service

        triton_service(image=triton_image(), models=model_repository())
    """
    if per_gpu.enabled(access.current()):
        return per_gpu_service(image, models)
    service = access.get("triton_service")
    _, key_new = api_key()
    if retire_units(set()):
        systemd.daemon_reload(name="systemd daemon-reload (per-GPU units removed)")
    text = render_unit(unit_context(access.current()))
    unit = converged.put(
        name=f"systemd unit {service}.service", src=StringIO(text), dest=unit_path(access.current()), mode="644"
    )
    # daemon-reload only when the unit really changed (it can cost running GPU containers
    # their devices with the systemd cgroup driver)
    if will_change(unit):
        systemd.daemon_reload(name="systemd daemon-reload (unit changed)")
    image, models = list(image or []), list(models or [])
    explicit = access.get("triton_model_control_mode") == "explicit"
    # what an earlier run changed but stopped before Triton took it (Ctrl-C, a lost link)
    behind = running_behind(explicit, access.current())
    restart = restart_reason(explicit, unit, image, models, behind, key_new)
    if restart:
        if lb.enabled():  # out of the load balancer, nothing in flight, before Triton stops
            lb.drain_host(name=f"drain {host.name} in the load balancer before the restart", why=restart)
        systemd.service(name=f"restart {service} ({restart})", service=service, restarted=True)
    elif guard_ops.pending():  # the host layer reloaded systemd while Triton keeps running
        guard_ops.guard(
            name="GPU-loss guard: Triton's container still sees the host's GPUs after daemon-reload",
            reasons=guard_ops.pending(),
        )
    if not restart and explicit and (will_change(models) or behind["models"]):
        load, unload = model_changes() if will_change(models) else behind["models"]
        server.shell(
            name=f"load changed models without a restart ({', '.join(load + unload) or 'none'})",
            commands=[repository_api_commands(access.current(), load, unload)],
        )
    converged.service(name=f"{service} running and enabled", service=service, running=True, enabled=True)


def restart_reason(explicit: bool, unit, image: list, models: list, behind: dict, key_new) -> str | None:
    """Why Triton restarts on this run (None: it does not). Explicit mode is zero downtime: new
    models are loaded through the repository API while the old ones serve, so only a unit or
    image change restarts it; what an earlier run changed but never restarted for counts too."""
    if explicit:
        restart = "unit or image changed" if will_change(unit, image) else behind["restart"]
    else:
        restart = "unit, image or models changed" if will_change(unit, image, models) else behind["restart"]
    return restart or key_new


def per_gpu_service(image: list | None = None, models: list | None = None):
    """triton_per_gpu: one unit per GPU (tritonfleet.serving.per_gpu), each written, restarted on a change
    of its unit, the image or the models, and running and enabled; the units of GPUs the host no
    longer has, and the single unit, stopped and removed first."""
    gets = instance_gets(access.current())
    _, key_new = api_key()
    retired = retire_units({unit_path(g).rsplit("/", 1)[1] for g in gets})
    units = []
    for g in gets:
        text = render_unit(unit_context(g))
        units.append(
            converged.put(
                name=f"systemd unit {g.get('triton_service')}.service (GPU {g.get('triton_per_gpu_index')}, "
                f"HTTP {g.get('triton_http_port')})",
                src=StringIO(text),
                dest=unit_path(g),
                mode="644",
            )
        )
    if retired or will_change(*units):
        systemd.daemon_reload(name="systemd daemon-reload (per-GPU units changed)")
    image, models = list(image or []), list(models or [])
    explicit = access.get("triton_model_control_mode") == "explicit"
    drained = False
    for g, unit in zip(gets, units, strict=True):
        service = g.get("triton_service")
        behind = running_behind(explicit, g)
        restart = restart_reason(explicit, unit, image, models, behind, key_new)
        if restart:
            if lb.enabled() and not drained:  # the host leaves the load balancer once, before the first stop
                lb.drain_host(name=f"drain {host.name} in the load balancer before the restarts", why=restart)
                drained = True
            systemd.service(name=f"restart {service} ({restart})", service=service, restarted=True)
        if not restart and explicit and (will_change(models) or behind["models"]):
            load, unload = model_changes() if will_change(models) else behind["models"]
            server.shell(
                name=f"{service}: load changed models without a restart ({', '.join(load + unload) or 'none'})",
                commands=[repository_api_commands(access.current(), load, unload, g.get("triton_http_port"))],
            )
        converged.service(name=f"{service} running and enabled", service=service, running=True, enabled=True)


def running_behind(explicit: bool, settings: Settings) -> dict:
    """What the running Triton has not taken yet although it is on the host: an earlier run
    changed the unit, the image or the live release and stopped before the restart (or load).
    ``{"restart": why or "", "models": (load, unload) or None}``. ``settings``: the host's or a per-GPU instance's
    tunables."""
    run = memo.fact(TritonContainer, **container_fact_args(settings))
    out: dict = {"restart": "", "models": None}
    if not run["running"]:
        return out  # nothing runs: "running and enabled" starts it with everything in place
    want = memo.fact(DockerImageId, image=access.get("triton_image"))
    reasons = []
    if want and run["image_id"] and run["image_id"] != want:
        reasons.append(f"it runs image {run['image_id'][7:19]}, {access.get('triton_image')} is {want[7:19]}")
    if run["unit_mtime"] > run["started"]:
        reasons.append("the unit changed after it started")
    if not explicit and run["link_mtime"] > run["started"]:
        reasons.append("the model release was switched after it started")
    if reasons:
        out["restart"] = "an earlier run stopped before the restart: " + "; ".join(reasons)
    elif explicit:
        base = access.get("triton_base_dir")
        records = memo.fact(DeployHistory, base=base)["records"]
        live = memo.fact(ReleaseState, base=base)["current"]
        loaded = records[-1].get("release") if records else None
        if loaded and live and loaded != live:
            out["models"] = model_diff(
                host.get_fact(ReleaseManifest, base=base, release=loaded),
                host.get_fact(ReleaseManifest, base=base, release=live),
            )
    return out


def record_deployment(action: str = "deploy") -> None:
    """Append (release, image, unit) to the host's deploy history once it is healthy, with a
    snapshot of the unit: what a rollback returns to, kept on the host itself."""
    base = access.get("triton_base_dir")
    _, _, rid = current_host_repository(access.current())
    gets = instance_gets(access.current())  # [access.current()]: the single unit, whose digest units_digest is too
    append_record(
        base,
        rid,
        units_digest(access.current(), len(gets)),
        access.get("triton_image"),
        action,
        unit_files=[unit_path(g) for g in gets] if per_gpu.enabled(access.current()) else None,
    )


def failure_recorded() -> bool:
    """The report of a failed run is left on the host (the gate removes it once healthy)."""
    return bool(memo.fact(DeployHistory, base=access.get("triton_base_dir")).get("failure"))


def gate_or_roll_back(models: list[str], clear_failure: bool = False, repo: str | None = None):
    """The deploy's health gate. With auto_rollback (plain runs; a rollout rolls back itself), a
    host that fails it and served before is put back on its last healthy deployment at once (the
    rollback steps, run as nested operations); the host still fails, and its report says so."""
    try:
        return gate_current_host(access.current(), models, clear_failure, repo)
    except HealthError as e:
        if not access.get("auto_rollback") or in_rollout():
            raise
        report = e.failure
        history = host.get_fact(DeployHistory, base=access.get("triton_base_dir"))["records"]
        if not history:
            raise
        from .rollback import rollback

        logger.warning(
            f"{host.name}: {report.short(200)}; auto_rollback: back to release "
            f"{history[-1].get('release')}, {history[-1].get('image')}"
        )
        try:
            rollback()
        except (PyinfraError, HostFailure) as rb:
            report.now += f"; auto_rollback failed ({str(rb).splitlines()[0] if str(rb) else type(rb).__name__})"
            raise HealthError(report) from e
        report.now = (
            f"rolled back on the spot (auto_rollback): serves release {history[-1].get('release')}, "
            f"{history[-1].get('image')} again, healthy (before the rollback: {report.now})"
        )
        report.fix = "fix the cause above, then run the deploy again"
        raise HealthError(report) from e


@tritonfleet_step("Health gate")
def health_gate(record: bool = True):
    """The health gate: live, ready, every model ready, metrics, one real inference per
    model; then the deployment is recorded for rollback.

    + record: record the healthy deployment (and put a drained host back in its load balancer); False
      for a read-only check

    Changes: with ``record``, ``<triton_base_dir>/history.jsonl`` and the unit's snapshot; with
    ``auto_rollback``, a failed gate rolls the host back.

    Tunables: ``health_via``, ``health_host``, ``health_timeout``, ``health_request_timeout``,
    ``health_warm_inference``, ``auto_rollback``, ``lb``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.triton import health_gate

        health_gate(record=False)  # read-only: deploys/verify.py
    """
    local, _, _ = current_host_repository(access.current())
    gate_check = check_with_steps if access.get("auto_rollback") else check
    gate_check(
        name="check: health gate (live, ready, every model ready, metrics, first inference)",
        function=gate_or_roll_back,
        models=render.model_names(local),
        clear_failure=failure_recorded(),
        repo=str(local),
    )
    if record:
        if lb.enabled():  # healthy: back in the load balancer (a drain of this or a cut run)
            check(name="check: back in the load balancer once healthy", function=lb.ready_now)
        record_deployment()
