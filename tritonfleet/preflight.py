"""Checks that run on the control machine before any host is touched.

A problem found here stops the whole run with a message naming the host, the file and the fix:
an invalid model repository would take Triton down on every host of a rollout.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host

from . import config


class PreflightError(SystemExit):
    """Raised while pyinfra prepares operations: nothing has run on any host yet."""

    def __init__(self, message: str):
        super().__init__(f"tritonfleet pre-flight failed, no host was changed:\n{message}")


_validated: dict[str, list] = {}


def check_model_repository() -> None:
    from .steps.triton import host_repository
    from .validate import validate_repository

    src = Path(config.get("model_repository"))
    if not src.is_dir():
        raise PreflightError(f"{host.name}: model_repository {src} is not a directory "
                             "(set model_repository in group data, relative to where pyinfra runs)")
    def problems_of(repo: Path) -> list:
        key = str(repo.resolve())
        if key not in _validated:
            _validated[key] = validate_repository(repo)
        return _validated[key]

    # the repository as written first (its errors name its own files), then as this host's
    # class renders it (model_overrides)
    problems = problems_of(src)
    if not problems:
        try:
            local, _, _ = host_repository()
        except ValueError as e:
            raise PreflightError(f"{host.name}: {e} (model_overrides in group data)") from e
        problems = [f"with model_overrides applied: {p}" for p in problems_of(local)] if local != src.resolve() else []
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise PreflightError(f"{host.name}: model repository {src} is invalid "
                             f"(fix it, then check with `tritonfleet validate {src}`):\n{lines}")


def check_gpu_class_and_driver() -> None:
    from .gpucheck import GPU_CLASSES, driver_supported

    gpu_class = host.data.get("gpu_class")
    if not gpu_class:
        raise PreflightError(f"{host.name}: no gpu_class; put the host in a GPU-class group "
                             f"({', '.join(k.lower() for k in GPU_CLASSES)}) in the inventory or set gpu_class")
    if str(gpu_class).upper() not in GPU_CLASSES:
        raise PreflightError(f"{host.name}: unknown gpu_class {gpu_class!r}; known: {', '.join(GPU_CLASSES)}")
    branch = config.get("nvidia_driver_branch")
    if not branch:
        raise PreflightError(f"{host.name}: nvidia_driver_branch is not set (group_data/{str(gpu_class).lower()}.py)")
    version = config.get("nvidia_driver_version") or str(branch)
    ok, reason = driver_supported(version, config.get("triton_image"))
    if not ok:
        raise PreflightError(f"{host.name}: driver {version}: {reason} "
                             "(set nvidia_driver_branch in group data to a supported branch)")


def run_all() -> None:
    check_gpu_class_and_driver()
    check_model_repository()
