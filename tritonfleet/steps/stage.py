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
"""

from __future__ import annotations

from pyinfra import host

from ..model_repo.ops import model_release
from ..model_repo.render import current_host_repository
from ..preflight import triton_layer
from ..pyinfra_ext.install import tritonfleet_step
from ..settings import access
from .triton import ensure_image, model_origin


def mirror_only() -> bool:
    """This host runs the image mirror and no Triton (no GPU class): staging leaves it alone."""
    return access.get("image_mirror_group") in host.groups and not host.data.get("gpu_class")


def preflight() -> None:
    """The Triton layer's pre-flight, on the hosts that serve Triton."""
    if not mirror_only():
        triton_layer()


@tritonfleet_step("Stage the Triton image")
def stage_image():
    """The new Triton image on the host, nothing restarted (a rollout's ``--stage``).

    Changes: the image in Docker's store; nothing on the image mirror's own hosts.

    Tunables: ``triton_image``, ``image_mirror_group``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.stage import stage_image

        stage_image()
    """
    if mirror_only():
        return []
    return ensure_image(access.get("triton_image"))


@tritonfleet_step("Stage the model release")
def stage_models():
    """The new model release complete on the host, the live link left alone.

    Changes: ``<triton_base_dir>/releases/<release>``; nothing on the image mirror's own hosts.

    Tunables: ``triton_base_dir``, ``triton_keep_releases``, ``model_origin``.

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
    return [
        model_release(
            name=f"stage model release {rid} from {origin.url}",
            base=base,
            release=rid,
            local=str(local),
            manifest=man,
            keep=int(access.get("triton_keep_releases")),
            origin=origin,
            switch=False,
        )
    ]
