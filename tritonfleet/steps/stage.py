"""Staging: the new image and model release on every target host before any host changes what it
serves (``deploys/stage.py``; ``tritonfleet rollout --stage`` runs it on every target before
the first batch).

What staging leaves on a host is invisible to Triton: the image pulled (through the mirror when
there is one) and the release complete in ``releases/<id>`` with its stat record, the live link
untouched. The deploy that follows finds both there: its image step has nothing to pull and its
model step only switches the link, so a batch costs the restart and the health gate. A host
that cannot stage fails this run and is left out of the rollout before any host changed.

Without a model origin the release is pushed over SSH by the deploy itself, as always: staging
then pulls the image only.

With ``model_fanout`` the release's objects travel as one BitTorrent swarm (its torrent made here,
once a release; the wave's seeds read the origin as its web seed, every other host reads its
peers) before each host fetches from the origin whatever the swarm did not bring
(docs/model-origin.md#fan-out).
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.operations import server

from ..host.ops import aptlock
from ..model_repo import origin as origins
from ..model_repo import swarm, torrent
from ..model_repo.ops import model_release
from ..model_repo.render import current_host_repository
from ..preflight import triton_layer
from ..pyinfra_ext.install import tritonfleet_step
from ..serving import image_fanout
from ..serving.ops.image_fanout import WebSeed, image_from_swarm, image_seeded
from ..settings import access, mirrored
from .mirror import client_auth, client_ca_path, mirror_url
from .triton import ensure_image, model_origin


def mirror_only() -> bool:
    """This host runs the image mirror and no Triton (no GPU class): staging leaves it alone."""
    return access.get("image_mirror_group") in host.groups and not host.data.get("gpu_class")


# the hosts of this staging run (filled as each host's operations are made, read when they run):
# the release's wave, and the image fan-out's
WAVE = swarm.Wave()
IMAGE_WAVE = swarm.Wave()
_TORRENTS: dict[tuple[str, str, int], torrent.Torrent] = {}


def _release_torrent(local, manifest: dict, release: str, piece: int) -> torrent.Torrent:
    """The release's torrent, made once a run (every host of a release shares it)."""
    key = (str(local), release, piece)
    if key not in _TORRENTS:
        shas = {sha for size, sha in manifest.values() if int(size) > 0}
        _TORRENTS[key] = torrent.from_repository(Path(local), manifest, shas, piece)
    return _TORRENTS[key]


def _wave_hosts() -> list:
    """The hosts of this run that stage a release (the image mirror's own hosts do not)."""
    group = access.get("image_mirror_group")
    return sorted(
        (
            h
            for h in host.state.inventory.iter_activated_hosts()
            if not (group in h.groups and not h.data.get("gpu_class"))
        ),
        key=lambda h: h.name,
    )


def fanout_for(origin, local, manifest: dict, release: str) -> swarm.Fanout | None:
    """This host's part of the wave's swarm, or None: no fan-out (off, an origin read through
    signed URLs, or a release of empty files only)."""
    if not access.get("model_fanout"):
        return None
    shas = sorted({sha for size, sha in manifest.values() if int(size) > 0})
    if not shas:
        return None
    seed_url = torrent.web_seed(origins.urls(origin, shas[:1])[shas[0]], shas[0])
    if seed_url is None:
        host.noop("model_fanout: the origin's URLs are signed (no web seed): the host fetches from the origin")
        return None
    t = _release_torrent(local, manifest, release, int(access.get("model_fanout_piece_kb")) * 1024)
    WAVE.add(host.name, t.info_hash, access.get("fanout_zone"), access.get("fanout_seed"))
    tracker, tracker_host = access.get("model_fanout_tracker"), None
    if tracker is None:
        first = _wave_hosts()[0] if _wave_hosts() else host
        tracker_host = first.name
        tracker = swarm.announce_url(first.data.get("ssh_hostname") or first.name)
    return swarm.Fanout(
        torrent=t,
        origin=origin,
        web_seed=seed_url,
        tracker=tracker,
        tracker_host=tracker_host,
        wave=WAVE,
        port=int(access.get("model_fanout_port")),
        seed_minutes=float(access.get("model_fanout_seed_minutes")),
        stall_seconds=int(access.get("model_fanout_stall_seconds")),
        wait_seconds=int(access.get("model_fanout_wait_seconds")),
    )


def preflight() -> None:
    """The Triton layer's pre-flight, on the hosts that serve Triton."""
    if not mirror_only():
        triton_layer()


def image_fanout_target() -> tuple[str, str] | None:
    """(repository path, digest) of the Triton image when staging shares its blobs through the
    wave's swarm: ``image_fanout`` on and the image pinned and pulled through the image mirror."""
    if not access.get("image_fanout") or not access.get("image_mirror"):
        return None
    registry, path, _, digest = mirrored.parse_reference(access.get("triton_image"))
    if registry != access.get("image_mirror") or not digest:
        return None
    return path, digest


def _installed(packages: list[str], extra: str = "", label: str = "image fan-out") -> object:
    """The Debian packages (and ``extra`` shell) a fan-out needs on this host, each installed
    where missing."""
    cmd = " && ".join(
        f"{{ dpkg -s {p} >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
        f"--no-install-recommends {p}; }}"
        for p in packages
    )
    return server.shell(
        name=f"{label}: {', '.join(packages)}{' and the registry binary' if extra else ''} installed",
        commands=aptlock.wrapped([cmd + (f" && {{ {extra}; }}" if extra else "")]),
    )


def _image_swarm_ops(path: str, digest: str) -> list:
    """A GPU host's part of the image fan-out (run after its logins, before its pull): one host a
    zone (``fanout_zone``, ``fanout_seed``) reads the mirror's registry as its web seed."""
    IMAGE_WAVE.add(host.name, digest, access.get("fanout_zone"), access.get("fanout_seed"))
    auth = client_auth()
    web = WebSeed(
        IMAGE_WAVE,
        access.get("mirror_client_user") if auth else None,
        access.get("mirror_client_password_env") if auth else None,
        client_ca_path(),
    )
    return [
        _installed(["aria2"], image_fanout.registry_install()),
        image_from_swarm(
            name=f"image fan-out: {path}@{digest[:19]} from the wave's swarm",
            path=path,
            digest=digest,
            mirror_ref=access.get("triton_image"),
            port=int(access.get("image_fanout_port")),
            local_port=int(access.get("image_fanout_local_port")),
            seed_minutes=float(access.get("model_fanout_seed_minutes")),
            stall_seconds=int(access.get("model_fanout_stall_seconds")),
            wait_seconds=int(access.get("model_fanout_wait_seconds")),
            web=web,
        ),
    ]


@tritonfleet_step("Stage the Triton image")
def stage_image():
    """The new Triton image on the host, nothing restarted (a rollout's ``--stage``).

    Changes: the image in Docker's store; nothing on the image mirror's own hosts, unless
    ``image_fanout``: there the image's torrent, made from the mirror's store (its registry the web
    seed of one host a zone), and the tracker.

    Tunables: ``triton_image``, ``image_mirror_group``, ``image_fanout``, ``image_fanout_port``,
    ``image_fanout_local_port``, ``fanout_zone``, ``fanout_seed``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.stage import stage_image

        stage_image()
    """
    target = image_fanout_target()
    if mirror_only():
        if target is None:
            return []
        path, digest = target
        tracker = swarm.announce_url(access.get("image_mirror").rsplit(":", 1)[0])
        return [
            _installed(["opentracker"]),
            image_seeded(
                name=f"image fan-out: the mirror's torrent of {path}@{digest[:19]}",
                storage=access.get("image_mirror_storage"),
                path=path,
                digest=digest,
                tracker=tracker,
                web_seed=f"{mirror_url()}/v2/{path}/",
                piece=int(access.get("model_fanout_piece_kb")) * 1024,
            ),
        ]
    if target is None:
        return ensure_image(access.get("triton_image"))
    return ensure_image(access.get("triton_image"), before_pull=lambda: _image_swarm_ops(*target))


@tritonfleet_step("Stage the model release")
def stage_models():
    """The new model release complete on the host, the live link left alone.

    Changes: ``<triton_base_dir>/releases/<release>``; nothing on the image mirror's own hosts.

    Tunables: ``triton_base_dir``, ``triton_keep_releases``, ``model_origin``, ``model_fanout`` (and the
    other ``model_fanout_*``), ``fanout_zone``, ``fanout_seed``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.stage import stage_models

        stage_models()
    """
    if mirror_only():
        return []
    origin = model_origin()
    if origin is None:
        host.noop("no model_origin: the deploy pushes the release over SSH itself")
        return []
    base = access.get("triton_base_dir")
    local, man, rid = current_host_repository(access.current())
    fan = fanout_for(origin, local, man, rid)
    ops = []
    if fan is not None:
        ops.append(_installed(["aria2"] + (["opentracker"] if fan.tracker_host == host.name else []), label="fan-out"))
    return ops + [
        model_release(
            name=f"stage model release {rid} from {origin.url}",
            base=base,
            release=rid,
            local=str(local),
            manifest=man,
            keep=int(access.get("triton_keep_releases")),
            origin=origin,
            switch=False,
            fanout=fan,
        )
    ]
