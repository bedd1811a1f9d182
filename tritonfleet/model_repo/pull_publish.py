"""Pull mode with a model origin: the control machine publishes every model release the hosts
will fetch when it publishes the repository release (`tritonfleet pull publish` / `pull
rollout`), so a self-converging host only reads the origin: no upload path, no write credential
on the host (tritonfleet.model_repo.ops checks there that the release's manifest is present).

A host's model release is its repository rendered with its overrides and its instance groups
placed on its GPUs. The GPU count is the host's ``gpu_count`` (1 with ``triton_per_gpu``); a host
whose count the inventory does not say gets the release of every count from 1 to
``MAX_GPUS`` published (they share every object but the placed configs)."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import UsageError
from ..gpu.placement import per_gpu_enabled, placement_count
from ..settings.defaults import DEFAULTS
from . import origin as origins
from . import render

MAX_GPUS = 8


def gpu_counts(settings) -> list[int]:
    """The GPU counts a host's release may be placed on."""
    if per_gpu_enabled(settings):
        return [1]
    if settings.get("gpu_count") not in (None, ""):
        return [placement_count(settings.get("gpu_count"), [], None)]
    return list(range(1, MAX_GPUS + 1))


def publish_models(hosts, repo_root: Path) -> list[origins.Published]:
    """Publish, for every host of ``hosts`` (fleet inventory hosts) with a model origin, the
    model release(s) it will fetch; UsageError naming the host for an origin a host cannot only
    read, OriginError when the origin refuses."""
    out: list[origins.Published] = []
    for fh in hosts:
        settings = {**DEFAULTS, **fh.data}
        try:
            origin = origins.from_settings(settings)
        except UsageError as e:
            raise UsageError(f"{fh.name}: {e}") from None
        if origin is None:
            continue
        why = origins.store_class(origin).pull_problem(origin)
        if why:
            raise UsageError(f"{fh.name}: {why}")
        origins.check(origin)  # and, on HTTP, the empty object the hosts' own check reads
        repo = Path(settings["model_repository"])
        settings["model_repository"] = str(repo if repo.is_absolute() else Path(repo_root) / repo)
        for gpus in gpu_counts(settings):
            path, manifest, release = render.host_repository(settings, gpus)
            out.append(origins.publish(origin, path, manifest, release))
    return out
