"""The image fan-out as operations (the step: tritonfleet.steps.stage; the host scripts and why:
tritonfleet.serving.image_fanout): the mirror host's torrent, then each GPU host's swarm (a zone's
seed host with the mirror's registry as its web seed) and load.

What the mirror host answers (the torrent, the checked manifests, the blobs) is kept here, in the
run's process, for the GPU hosts' operations that follow it (pyinfra runs an operation on every
host before the next). A GPU host that finds nothing there, or whose swarm or load falls short,
says so and goes on: the staging's normal pull through the mirror comes next and takes what is
missing, so the fan-out never fails a host.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from pyinfra import logger
from pyinfra.api import FunctionCommand, StringCommand, operation

from ...model_repo import swarm
from ...pyinfra_ext.stream import connector_arguments
from .. import image_fanout as fan
from .. import image_mirror as mirror

# digest -> what the mirror host answered (tritonfleet.serving.image_fanout.parse_seed)
SEEDED: dict[str, dict] = {}


@dataclass(frozen=True)
class WebSeed:
    """How a zone's seed host reads the mirror's registry (its torrent's web seed)."""

    wave: swarm.Wave  # the staging run's image wave: who seeds (one a zone)
    user: str | None  # the mirror's client login (None: an open mirror)
    secret_env: str | None  # the control machine's variable holding its password
    ca: str | None  # the mirror's CA on the host


def _seed(state, host, storage: str, path: str, digest: str, tracker: str, web_seed: str, options: dict) -> bool:
    t0 = time.monotonic()
    script = fan.seed_script(storage, path, digest, tracker, web_seed, **options)
    ok, out = host.run_shell_command(StringCommand(script), print_output=False, **connector_arguments())
    got: dict = fan.parse_seed(out.stdout_lines) if ok else {"skip": " ".join(out.stderr_lines[-2:])[:300]}
    if "skip" in got:
        logger.warning(
            f"{host.print_prefix}image fan-out: no torrent ({got['skip']}); the hosts pull through the mirror"
        )
        return True
    SEEDED[digest] = got
    logger.info(
        f"{host.print_prefix}image fan-out: {path}@{digest[:19]} torrent made (swarm {got['info_hash'][:12]}, "
        f"{len(got['blobs'])} blobs, {sum(got['blobs'].values()) / 1e6:.1f} MB; the registry its web seed) "
        f"in {time.monotonic() - t0:.1f} s"
    )
    return True


@operation(is_idempotent=False)
def image_seeded(storage: str, path: str, digest: str, tracker: str, web_seed: str, piece: int):
    """The mirror host makes the torrent of the image ``path@digest`` from its store (every blob
    checked against its digest first) with its registry as the web seed, and its tracker answers
    for it; the zones' seed hosts then read the blobs from the registry once.

    + storage: the mirror's storage root (``image_mirror_storage``)
    + path: the image's repository path
    + digest: the pinned manifest digest
    + tracker: the announce URL (opentracker on this host)
    + web_seed: the registry's ``<mirror>/v2/<path>/`` URL
    + piece: the torrent's piece size in bytes

    Changes: ``<storage>/tritonfleet-image-seed``, the tracker's whitelist.

    Tunables: ``image_fanout``, ``image_mirror_storage``, ``model_fanout_piece_kb``.

    **Example:**

    .. code:: python

        image_seeded(
            name="the mirror makes the image's torrent",
            storage="/var/lib/docker-registry",
            path="nvidia/tritonserver",
            digest="sha256:...",
            tracker="http://10.0.0.9:6969/announce",
            web_seed="https://10.0.0.9:5000/v2/nvidia/tritonserver/",
            piece=1 << 20,
        )
    """
    yield FunctionCommand(_seed, (storage, path, digest, tracker, web_seed, {"piece": piece}), {})


def _load(state, host, path: str, digest: str, mirror_ref: str, web: WebSeed, options: dict) -> bool:
    seed = SEEDED.get(digest)
    if seed is None:
        logger.warning(
            f"{host.print_prefix}image fan-out: the mirror host made no torrent in this run; pulling through the mirror"
        )
        return True
    t0 = time.monotonic()
    files = list(seed["blobs"])
    seeds = host.name in web.wave.seeds()
    login = ""
    if seeds and web.user:
        # the mirror's client password, read now and sent on stdin (as the fill's)
        secret = os.environ.get(web.secret_env or "")
        problem = mirror.client_secret_problem(secret)
        if problem or not secret:
            logger.warning(
                f"{host.print_prefix}image fan-out: ${web.secret_env} on the control machine {problem} "
                "(the web seed's login); pulling through the mirror"
            )
            return True
        login = secret + "\n"
    script = swarm.swarm_script(
        fan.HOST_BASE,
        seed["info_hash"],
        list(range(1, len(files) + 1)),
        port=options["port"],
        seed_minutes=options["seed_minutes"],
        stall_seconds=options["stall_seconds"],
        wait_seconds=options["wait_seconds"],
        layout=fan.SWARM_LAYOUT,
        web_user=web.user if seeds else None,
        ca=web.ca if seeds else None,
    )
    meta = seed["seed_torrent"] if seeds else seed["torrent"]
    _, out = host.run_shell_command(
        StringCommand(script),
        print_output=False,
        **{**connector_arguments(), "_stdin": login + swarm.swarm_input(meta, seed["blobs"])},
    )
    res = swarm.parse_swarm(out.stdout_lines)
    if res.skipped or res.missed:
        why = res.skipped or f"{len(res.missed)} of {len(files)} blobs missing ({res.end})"
        logger.warning(f"{host.print_prefix}image fan-out: {why}; pulling through the mirror")
        return True
    objects = f"{fan.HOST_BASE}/releases/{swarm.OBJECTS_DIR}"
    t1 = time.monotonic()
    _, out = host.run_shell_command(
        StringCommand(fan.load_script(objects, path, digest, mirror_ref, options["local_port"])),
        print_output=False,
        **{**connector_arguments(), "_stdin": fan.load_input(seed["manifests"], seed["blobs"])},
    )
    lines = [ln.strip() for ln in out.stdout_lines]
    if "imgfan-loaded" not in lines:
        why = next((ln.removeprefix("imgfan-skip ") for ln in lines if ln.startswith("imgfan-skip")), "no answer")
        logger.warning(f"{host.print_prefix}image fan-out: {why}; pulling through the mirror")
        return True
    role = "seed, from the mirror's registry (web seed) and peers" if seeds else "from peers"
    logger.info(
        f"{host.print_prefix}image fan-out (the swarm {seed['info_hash'][:12]}, {role}): {len(res.got)} blobs "
        f"({res.bytes / 1e6:.1f} MB) verified in {t1 - t0:.1f} s and loaded by digest in {time.monotonic() - t1:.1f} s"
    )
    return True


@operation(is_idempotent=False)
def image_from_swarm(
    path: str,
    digest: str,
    mirror_ref: str,
    port: int,
    local_port: int,
    seed_minutes: float,
    stall_seconds: int,
    wait_seconds: int,
    web: WebSeed,
):
    """The image's blobs from the wave's swarm (its zone's seed host reads the mirror's registry
    as the web seed, the others their peers), each checked, loaded
    into Docker by digest through a throwaway registry on 127.0.0.1, then ``mirror_ref`` pulled
    (the manifest only). Never fails the host: what is missing, the pull through the mirror takes.

    + path: the image's repository path
    + digest: the pinned manifest digest
    + mirror_ref: the image's reference through the mirror (what the deploy runs)
    + port: aria2c's listening port
    + local_port: the throwaway registry's port on 127.0.0.1
    + seed_minutes: how long the host serves the blobs to the rest of the wave
    + stall_seconds: no byte for this long: the swarm is given up
    + wait_seconds: the swarm's longest wait
    + web: the wave (who seeds) and the seed's login to the mirror and its CA

    Changes: the image in Docker's store; the swarm's files below /var/lib/tritonfleet-image-fanout.

    Tunables: ``image_fanout``, ``image_fanout_port``, ``image_fanout_local_port``,
    ``model_fanout_seed_minutes``, ``model_fanout_stall_seconds``, ``model_fanout_wait_seconds``,
    ``fanout_zone``, ``fanout_seed``, ``image_mirror_auth``, ``mirror_client_user``,
    ``mirror_client_password_env``, ``image_mirror_ca``.

    **Example:**

    .. code:: python

        image_from_swarm(
            name="the image from the wave's swarm",
            path="nvidia/tritonserver",
            digest="sha256:...",
            mirror_ref="mirror:5000/nvidia/tritonserver:24.08-py3@sha256:...",
            port=6882,
            local_port=5079,
            seed_minutes=10,
            stall_seconds=30,
            wait_seconds=1800,
            web=WebSeed(wave, "tritonfleet", "TRITONFLEET_MIRROR_PASSWORD", None),
        )
    """
    options = {
        "port": port,
        "local_port": local_port,
        "seed_minutes": seed_minutes,
        "stall_seconds": stall_seconds,
        "wait_seconds": wait_seconds,
    }
    yield FunctionCommand(_load, (path, digest, mirror_ref, web, options), {})
