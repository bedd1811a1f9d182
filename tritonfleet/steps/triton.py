"""Triton service: images, model repository releases, the systemd unit, the health gate."""

from __future__ import annotations

import json
import shlex
from functools import cache
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd

from .. import TEMPLATES, config, models
from ..facts.host import DockerImageId, ModelReleases, ReleaseManifest
from ..health import gate_current_host
from ..ops.check import check, will_change
from ..ops.registry import docker_login, registry_of

IMAGE_CACHE = "/var/lib/tritonfleet/images"


@cache
def _archive_image_id(path: str) -> str:
    from ..images import image_id

    return image_id(Path(path))


def ensure_image(image: str) -> list:
    """Make ``image`` present: `docker load` of a configured archive, or a pull. Returns the ops
    that changed something (for restart gating). Runs before any restart, so a failed pull or load
    leaves the running container serving."""
    archives = config.get("image_archives") or {}
    have = host.get_fact(DockerImageId, image=image)
    if image in archives:
        archive = archives[image]
        if not Path(archive).is_file():
            raise config.ConfigError(f"{host.name}: image archive for {image} not found: {archive}")
        want = _archive_image_id(archive)
        if have == want:
            return []
        remote = f"{IMAGE_CACHE}/{Path(archive).name}"
        put = files.put(name=f"upload image archive {Path(archive).name}", src=archive, dest=remote, mode="600")
        load = server.shell(
            name=f"docker load {image}",
            commands=[f"docker load -i {shlex.quote(remote)} && rm -f {shlex.quote(remote)}"],
        )
        return [put, load]
    if have:
        return []
    ops = []
    if needs_login(image):
        ops.append(docker_login(name=f"docker login {login_registry()} as {config.get('registry_user')} "
                                     f"(secret from ${config.get('registry_password_env')}, on stdin)",
                                registry=login_registry(), user=config.get("registry_user"),
                                secret_env=config.get("registry_password_env")))
    ops.append(server.shell(name=f"docker pull {image}", commands=[f"docker pull {shlex.quote(image)}"]))
    return ops


def login_registry() -> str:
    """The registry the login (registry_user) is for: registry_host, or triton_image's registry."""
    return config.get("registry_host") or registry_of(config.get("triton_image"))


def needs_login(image: str) -> bool:
    """Pulling ``image`` needs the registry login."""
    return bool(config.get("registry_user")) and registry_of(image) == login_registry()


def pulls(images: list[str]) -> list[str]:
    """Those of ``images`` this host will pull (no archive configured, not present yet)."""
    archives = config.get("image_archives") or {}
    return [i for i in images if i not in archives and not host.get_fact(DockerImageId, image=i)]


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


def sync_models() -> list:
    """Ship the repository as a new release and switch to it atomically. Only changed files move;
    removed files are gone from the new release; Triton only ever sees a complete release."""
    base = config.get("triton_base_dir")
    local, man, rid = host_repository()
    state = host.get_fact(ModelReleases, base=base)
    if state["current"] == rid:
        host.noop(f"model release {rid} is live")
        return []
    q = shlex.quote
    rel_dir, tmp = f"{base}/releases/{rid}", f"{base}/releases/.incoming-{rid}"
    ops = []
    if rid not in state["releases"]:
        old = state["current"]
        old_man = host.get_fact(ReleaseManifest, base=base, release=old) if old else {}
        changed = [p for p, v in man.items() if old_man.get(p) != v]
        stale = [p for p in old_man if p not in man or p in changed]
        prep = [f"rm -rf {q(tmp)}", f"mkdir -p {q(tmp)}"]
        if old:
            # hard links: unchanged files cost nothing; changed ones are unlinked before upload
            prep.append(f"cp -al {q(base)}/releases/{q(old)}/. {q(tmp)}/")
            prep.append(f"rm -f {q(tmp)}/{models.MARKER}")
            prep += [f"rm -f {q(tmp + '/' + p)}" for p in stale]
        ops.append(server.shell(name=f"prepare model release {rid} ({len(changed)} files to send)", commands=[" && ".join(prep)]))
        for p in changed:
            ops.append(files.put(name=f"model file {p}", src=str(local / p), dest=f"{tmp}/{p}", mode="644"))
        marker = json.dumps({"release": rid, "files": man}, sort_keys=True)
        ops.append(files.put(name="release manifest", src=StringIO(marker), dest=f"{tmp}/{models.MARKER}", mode="644"))
        ops.append(server.shell(name=f"complete model release {rid}",
                                commands=[f"find {q(tmp)} -type d -empty -delete; mkdir -p {q(tmp)}; "
                                          f"chmod -R a+rX {q(tmp)} && mv -T {q(tmp)} {q(rel_dir)}"]))
    keep = int(config.get("triton_keep_releases"))
    ops.append(server.shell(
        name=f"switch live model repository to release {rid}",
        commands=[
            f"ln -sfn releases/{rid} {q(base)}/model_repository.new && "
            f"mv -T {q(base)}/model_repository.new {q(base)}/model_repository && "
            f"echo {rid} >> {q(base)}/releases.log && "
            # prune: keep the newest `keep` releases by switch order, never the live one
            f"tac {q(base)}/releases.log | awk '!seen[$0]++' | tail -n +{keep + 1} | "
            f"while read r; do [ \"$r\" != {rid} ] && rm -rf {q(base)}/releases/\"$r\"; done; true"
        ],
    ))
    return ops


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


@deploy("Triton image")
def triton_image():
    return ensure_image(config.get("triton_image"))


@deploy("Model repository")
def model_repository():
    return sync_models()


@deploy("Triton service")
def triton_service(changed: list | None = None):
    service = config.get("triton_service")
    unit = files.put(name=f"systemd unit {service}.service", src=StringIO(render_unit(unit_context())),
                     dest=f"/etc/systemd/system/{service}.service", mode="644")
    # daemon-reload only when the unit really changed (it can cost running GPU containers
    # their devices with the systemd cgroup driver)
    if will_change(unit):
        systemd.daemon_reload(name="systemd daemon-reload (unit changed)")
    if will_change(unit, changed or []):
        systemd.service(name=f"restart {service} (unit, image or models changed)", service=service,
                        restarted=True)
    systemd.service(name=f"{service} running and enabled", service=service, running=True, enabled=True)


@deploy("Health gate")
def health_gate():
    local, _, _ = host_repository()
    check(name="check: health gate (live, ready, every model ready, metrics)", function=gate_current_host,
          models=models.model_names(local))
