"""Rollback: put a host back on an earlier healthy deployment recorded on the host itself.

Every healthy deploy appends (model release, image, unit digest) to
``<triton_base_dir>/history.jsonl`` and keeps a snapshot of the unit in ``units/``; the model
releases stay in ``releases/`` (``triton_keep_releases``) and images are never removed. A
rollback therefore needs nothing from the control machine: it restores the unit, switches the
``model_repository`` link back, restarts Triton and runs the health gate.

Target: ``rollback_to[<host>]`` ({"release": ..., "unit": ...}, set by ``tritonfleet rollout`` to
what the host served before its batch) or, without it, the newest recorded deployment that differs
from what the host has now.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.facts.files import FindInFile, Sha256File
from pyinfra.operations import server, systemd

from ..core.report import fail
from ..core.shell import q
from ..model_repo.facts import ReleaseManifest, ReleaseState
from ..model_repo.release import switch_back_script
from ..pyinfra_ext.check import check
from ..pyinfra_ext.install import tritonfleet_step
from ..serving import per_gpu
from ..serving.facts import DeployHistory, DockerImageId
from ..serving.health import gate_current_host
from ..serving.ops import lb
from ..serving.ops.history import append_record
from ..serving.repository_api import model_diff, repository_api_commands
from ..serving.unit import unit_path
from ..settings import access


def pick_target(
    records: list[dict],
    current: tuple[str | None, str | None],
    releases: list[str],
    units: list[str],
    wanted: dict | None = None,
) -> tuple[dict | None, str]:
    """The record to return to, or None with the reason. ``current`` = (release, unit digest)."""
    usable = [r for r in records if r.get("release") in releases and r.get("unit") in units]
    if wanted:
        key = (wanted.get("release"), wanted.get("unit"))
        for r in reversed(usable):
            if (r["release"], r["unit"]) == key:
                return r, ""
        # what the host had before was never recorded healthy (or is gone): the newest healthy
        # deployment is the best there is
    for r in reversed(usable):
        if (r["release"], r["unit"]) != tuple(current):
            return r, ""
    if not records:
        return None, "no healthy deployment was ever recorded on this host: nothing to roll back to"
    return None, (
        f"no recorded deployment other than the current one is restorable "
        f"({len(records)} records, {len(usable)} with their release and unit still on the host)"
    )


def _model_diff(base: str, current: str | None, target: str) -> tuple[list[str], list[str]]:
    now = host.get_fact(ReleaseManifest, base=base, release=current) if current else {}
    return model_diff(now, host.get_fact(ReleaseManifest, base=base, release=target))


def restore_unit_command(base: str, digest: str, unit: str) -> str:
    """Put the unit snapshot ``digest`` (kept under ``base``/units) back in place as ``unit``."""
    return f"install -m 644 {q(f'{base}/units/{digest}.service')} {q(unit)}"


def _fail(message: str, expected: str = "an earlier healthy deployment to roll back to"):
    fail(
        expected,
        message,
        fix="nothing was changed by the rollback; bring the host to a known state with the full "
        "deploy (pyinfra ... deploys/triton.py --limit <host>)",
    )


@tritonfleet_step("Rollback")
def rollback():
    """Put the host back on an earlier healthy deployment recorded on the host: the
    unit restored, the ``model_repository`` link switched back, Triton restarted, the health gate run.

    Changes: the unit file, the live release link, a Triton restart (drained first), the history.
    The target is ``rollback_to[<host>]`` or the newest recorded deployment that differs from now.

    Tunables: ``rollback_to``, ``triton_base_dir``, ``triton_service``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.rollback import rollback

        rollback()  # pyinfra -y inventories/prod.py deploys/rollback.py --limit <host>
    """
    base = access.get("triton_base_dir")
    service = access.get("triton_service")
    if per_gpu.enabled(access.current()):
        check(
            name="check: an earlier deployment to roll back to",
            function=_fail,
            message=f"{host.name}: rollback of a host with one Triton per GPU (triton_per_gpu) is not built; "
            "deploy the earlier release and image with deploys/triton.py instead (docs/multi-gpu.md)",
        )
        return
    history = host.get_fact(DeployHistory, base=base)
    state = host.get_fact(ReleaseState, base=base)
    unit_now = (host.get_fact(Sha256File, path=unit_path(access.current())) or "")[:16] or None
    wanted = (access.get("rollback_to") or {}).get(host.name)
    target, why = pick_target(
        history["records"], (state["current"], unit_now), state["releases"], history["units"], wanted
    )
    if target is None:
        check(
            name="check: an earlier deployment to roll back to",
            function=_fail,
            message=f"{host.name}: rollback impossible: {why}",
        )
        return
    rid, digest, image = target["release"], target["unit"], target["image"]
    if not host.get_fact(DockerImageId, image=image):
        check(
            name=f"check: image {image} of the earlier deployment is on the host",
            function=_fail,
            message=f"{host.name}: rollback impossible: image {image} is no longer on the host "
            "(tritonfleet never removes images; was it pruned by hand?)",
            expected=f"image {image} of the earlier deployment on the host",
        )
        return
    unit_changes = unit_now != digest
    link_changes = state["current"] != rid
    if not unit_changes and not link_changes:
        host.noop(f"already on release {rid} with unit {digest}")
    if unit_changes:
        server.shell(
            name=f"restore unit {digest} ({image})",
            commands=[restore_unit_command(base, digest, unit_path(access.current()))],
        )
        systemd.daemon_reload(name="systemd daemon-reload (unit restored)")
    if link_changes:
        server.shell(
            name=f"switch live model repository back to release {rid}", commands=[switch_back_script(base, rid)]
        )
    explicit = bool(
        host.get_fact(FindInFile, path=unit_path(access.current()), pattern="--model-control-mode=explicit")
    )
    if explicit and not unit_changes and link_changes:
        # same unit in explicit model-control mode: the earlier models are loaded through the
        # repository API while the others serve (no restart)
        load, unload = _model_diff(base, state["current"], rid)
        server.shell(
            name=f"load the earlier models without a restart ({', '.join(load + unload) or 'none'})",
            commands=[repository_api_commands(access.current(), load, unload)],
        )
    elif unit_changes or link_changes:
        if lb.enabled():
            lb.drain_host(
                name=f"drain {host.name} in the load balancer before the restart",
                why="rollback to an earlier deployment",
            )
        systemd.service(
            name=f"restart {service} on the earlier deployment", service=service, restarted=True, running=True
        )
    systemd.service(name=f"{service} running and enabled", service=service, running=True, enabled=True)
    names = sorted({p.split("/", 1)[0] for p in host.get_fact(ReleaseManifest, base=base, release=rid)})
    check(
        name="check: health gate after rollback",
        function=gate_current_host,
        settings=access.current(),
        models=names,
        clear_failure=bool(history.get("failure")),
    )
    if lb.enabled():
        check(name="check: back in the load balancer once healthy", function=lb.ready_now)
    append_record(base, rid, digest, image, "rollback")
