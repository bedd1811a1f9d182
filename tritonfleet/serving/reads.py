"""What the Triton steps read on a converged host, as (fact, kwargs) pairs for one batched command
(tritonfleet.pyinfra_ext.memo.prefetch): pre-flight reads them with the host layer's facts and the
GPU check's host side, so that a converged host's deploy asks the host once; the Triton image step
reads them again only when something changed since (the memo forgot them)."""

from __future__ import annotations

from ..host.facts import FileState, UnitState
from ..model_repo.facts import ReleaseState
from ..settings.access import Settings
from .facts import DeployHistory, DockerImageId, PerGpuUnits, TritonContainer
from .unit import restricted_apis, unit_path


def container_fact_args(settings: Settings) -> dict:
    """TritonContainer's arguments (one memo key for the prefetch and the Triton service step);
    ``settings``: the host's or a per-GPU instance's (tritonfleet.serving.per_gpu)."""
    return {
        "container": settings.get("triton_container_name"),
        "unit": unit_path(settings),
        "link": f"{settings.get('triton_base_dir')}/model_repository",
    }


def triton_facts(settings: Settings) -> list[tuple]:
    """Every fact the Triton image, model repository and service steps read on a converged host."""
    base = settings.get("triton_base_dir")
    return [
        (DockerImageId, {"image": settings.get("triton_image")}),
        (ReleaseState, {"base": base}),
        (FileState, {"path": unit_path(settings)}),
        *([(FileState, {"path": settings.get("triton_api_key_file")})] if restricted_apis(settings) else []),
        (UnitState, {"unit": f"{settings.get('triton_service')}.service"}),
        (DeployHistory, {"base": base}),
        (TritonContainer, container_fact_args(settings)),
        (PerGpuUnits, {"service": settings.get("triton_service")}),
    ]
