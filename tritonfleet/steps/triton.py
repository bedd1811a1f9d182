"""Triton service: images, model repository releases, the systemd unit, the health gate."""

from __future__ import annotations

import json
import shlex
from functools import cache
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, python, server, systemd
from pyinfra.operations.util import any_changed

from .. import TEMPLATES, config, models
from ..facts import memo
from ..facts.host import DockerImageId, FileState, ReleaseState, UnitState
from ..health import gate_current_host
from ..ops import fast
from ..ops.release import model_release
from ..ops.stream import docker_load
from ..transfer import TransferError
from ..transfer import choose as choose_transport


@cache
def _archive_image_id(path: str) -> str:
    from ..images import image_id

    return image_id(Path(path))


def ensure_image(image: str) -> list:
    """Make ``image`` present: `docker load` of a configured archive, or a pull. Returns the ops
    that changed something (for restart gating). Runs before any restart, so a failed pull or load
    leaves the running container serving."""
    archives = config.get("image_archives") or {}
    have = memo.fact(DockerImageId, image=image)
    if image in archives:
        archive = archives[image]
        if not Path(archive).is_file():
            raise config.ConfigError(f"{host.name}: image archive for {image} not found: {archive}")
        want = _archive_image_id(archive)
        if have == want:
            return []
        # streamed into `docker load` on the host (bulk_transfer): no copy on the host's disk
        transport = config.get("bulk_transfer")
        _check_transport(transport)
        return [docker_load(name=f"docker load {image} from {Path(archive).name}", archive=str(archive),
                            transport=transport)]
    if have:
        return []
    ops = []
    user = config.get("registry_user")
    if user:
        ops.append(registry_login(image, user))
    ops.append(server.shell(name=f"docker pull {image}", commands=[f"docker pull {shlex.quote(image)}"]))
    return ops


def registry_login(image: str, user: str):
    import os

    env = config.get("registry_password_env")
    secret = os.environ.get(env)
    if not secret:
        raise config.ConfigError(
            f"{host.name}: registry_user is set but ${env} is empty; export the registry secret "
            f"in ${env} on the control machine (it is never read from files or argv)"
        )
    registry = image.split("/", 1)[0]
    tmp = "/root/.tritonfleet-registry-secret"
    # The secret travels over SFTP into a 0600 file and reaches docker on stdin only.
    files.put(name=f"registry secret for {registry} (not logged)", src=StringIO(secret), dest=tmp, mode="600")
    return server.shell(
        name=f"docker login {registry} as {user}",
        commands=[f"docker login -u {shlex.quote(user)} --password-stdin {shlex.quote(registry)} < {tmp}; "
                  f"rc=$?; rm -f {tmp}; exit $rc"],
    )


@cache
def _rendered(src: str, overrides_json: str) -> tuple[str, str, str]:
    rendered = models.render(Path(src), json.loads(overrides_json))
    man = models.manifest(rendered)
    return str(rendered), json.dumps(man, sort_keys=True), models.release_id(man)


def host_repository() -> tuple[Path, dict, str]:
    """(rendered local repository, manifest, release id) for the current host."""
    src = Path(config.get("model_repository")).resolve()
    overrides = config.get("model_overrides") or {}
    path, man, rid = _rendered(str(src), json.dumps(overrides, sort_keys=True))
    return Path(path), json.loads(man), rid


def _check_transport(transport: str) -> None:
    """Refuse a transport that cannot work before any host is touched."""
    try:
        choose_transport(host, transport)
    except TransferError as e:
        raise config.ConfigError(str(e)) from e


def sync_models() -> list:
    """Make this host's repository the live release (tritonfleet.release): one remote command
    when it already is (no file on the host is read: sizes and mtimes are compared with the
    release's stat record). Otherwise only files no release on the host holds travel, in one
    stream; Triton only ever sees a complete release."""
    base = config.get("triton_base_dir")
    local, man, rid = host_repository()
    live = memo.fact(ReleaseState, base=base)
    if live["current"] == rid and not live["drift"]:
        host.noop(f"model release {rid} is live" + ("" if live["verified"] else " (no stat record)"))
        return []
    why = (f"{len(live['drift'])} files changed on the host: {', '.join(live['drift'][:5])}"
           if live["current"] == rid else f"live: {live['current'] or 'none'}")
    transport = config.get("bulk_transfer")
    _check_transport(transport)
    return [model_release(
        name=f"model release {rid} ({why})",
        base=base, release=rid, local=str(local), manifest=man,
        keep=int(config.get("triton_keep_releases")), transport=transport,
    )]


def unit_context() -> dict:
    base = config.get("triton_base_dir")
    return dict(
        image=config.get("triton_image"),
        container=config.get("triton_container_name"),
        gpus=config.get("triton_gpus"),
        shm_size=config.get("triton_shm_size"),
        ulimit_memlock=config.get("triton_ulimit_memlock"),
        ulimit_stack=config.get("triton_ulimit_stack"),
        http_port=config.get("triton_http_port"),
        grpc_port=config.get("triton_grpc_port"),
        metrics_port=config.get("triton_metrics_port"),
        http_bind=config.get("triton_http_bind"),
        grpc_bind=config.get("triton_grpc_bind"),
        metrics_bind=config.get("triton_metrics_bind"),
        model_repository=f"{base}/model_repository",
        strict_model_config=config.get("triton_strict_model_config"),
        model_control_mode=config.get("triton_model_control_mode"),
        extra_args=config.get("triton_extra_args") or [],
        start_timeout=config.get("triton_start_timeout"),
    )


def render_unit(ctx: dict) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template("triton.service.j2").render(**ctx)


def service_unit_path() -> str:
    return f"/etc/systemd/system/{config.get('triton_service')}.service"


@deploy("Triton image")
def triton_image():
    # what the Triton steps read on a converged host, in one remote command
    memo.prefetch((DockerImageId, {"image": config.get("triton_image")}),
                  (ReleaseState, {"base": config.get("triton_base_dir")}),
                  (FileState, {"path": service_unit_path()}),
                  (UnitState, {"unit": f"{config.get('triton_service')}.service"}))
    return ensure_image(config.get("triton_image"))


@deploy("Model repository")
def model_repository():
    return sync_models()


@deploy("Triton service")
def triton_service(changed: list | None = None):
    service = config.get("triton_service")
    unit = fast.put(name=f"systemd unit {service}.service", src=StringIO(render_unit(unit_context())),
                    dest=service_unit_path(), mode="644")
    # daemon-reload only when the unit really changed (it can cost running GPU containers
    # their devices with the systemd cgroup driver)
    systemd.daemon_reload(name="systemd daemon-reload (unit changed)", _if=unit.did_change)
    systemd.service(name=f"restart {service} (unit, image or models changed)", service=service,
                    restarted=True, _if=any_changed(unit, *(changed or [])))
    fast.service(name=f"{service} running and enabled", service=service, running=True, enabled=True)


@deploy("Health gate")
def health_gate():
    local, _, _ = host_repository()
    python.call(name="check: health gate (live, ready, every model ready, metrics)", function=gate_current_host,
                models=models.model_names(local))
