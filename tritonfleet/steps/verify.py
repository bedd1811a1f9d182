"""GPU verification: the host's nvidia-smi, and the same inside `docker run --gpus all`.

Both must show the GPU model of the host's class (T4/L4), compute capability and CUDA version at
least the configured minimum; a mismatch fails that host naming expected and found.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import deploy

from .. import config
from ..facts import gpu as gpufacts
from ..gpucheck import check_gpus
from ..ops.check import check
from .triton import ensure_image

QUERY = gpufacts.QUERY_COMMAND


class GpuVerificationError(RuntimeError):
    pass


def _probe(where: str, command: str):
    _, out = host.run_shell_command(command)
    lines = out.stdout_lines + out.stderr_lines
    info = gpufacts.parse_query(lines)
    if info.invalid_field == "compute_cap":  # drivers before R510: look the capability up by name
        _, out = host.run_shell_command(command.replace(QUERY, gpufacts.QUERY_COMMAND_NO_CC))
        lines = out.stdout_lines + out.stderr_lines
        info = gpufacts.parse_query(lines, gpufacts.QUERY_FIELDS_NO_CC)
    _, out2 = host.run_shell_command(command.replace(QUERY, "nvidia-smi"))
    summary = gpufacts.parse_summary(out2.stdout_lines + out2.stderr_lines)
    return info, summary, lines


def verify_current_host(image: str) -> dict:
    gpu_class = str(config.get("gpu_class")).upper()
    docker = (f"docker run --rm --gpus all {shlex.quote(image)} ")
    rows, errors = [], []
    for where, prefix in (("host", ""), ("container", docker)):
        info, summary, raw = _probe(where, f"{prefix}{QUERY} 2>&1")
        errs = check_gpus(f"{host.name} ({where})", gpu_class, info.gpus, summary.get("cuda_version"),
                          config.get("gpu_min_compute_capability"), config.get("gpu_min_cuda_version"))
        if info.status != "ok":
            errs = [f"{host.name} ({where}): nvidia-smi failed ({info.status}): {info.message}"] + errs
        errors += errs
        g = info.gpus[0] if info.gpus else None
        rows.append(
            f"{host.name:<12} {where:<9} {len(info.gpus)}x {(g.name if g else '-'):<10} "
            f"driver {(g.driver_version if g else '-'):<10} cc {(g.compute_cap if g else '-'):<4} "
            f"CUDA {summary.get('cuda_version') or '-'}"
        )
    for r in rows:
        logger.info(f"GPU check  {r}")
    if errors:
        raise GpuVerificationError("; ".join(dict.fromkeys(errors)))
    return {"rows": rows}


@deploy("GPU verification")
def verify_gpus(load_image: bool = True):
    image = config.get("cuda_test_image")
    if load_image:
        ensure_image(image)
    check(name=f"check: nvidia-smi on the host and in {image} with --gpus all",
          function=verify_current_host, image=image)
