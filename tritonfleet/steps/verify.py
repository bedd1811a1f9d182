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


SECTION = "@@tritonfleet-section@@"


def probe_command(image: str, query: str = QUERY) -> str:
    """One remote command for the whole check: the query and the summary (for the CUDA version)
    from nvidia-smi on the host, then both again inside one `docker run --gpus all` (no network:
    the container only runs nvidia-smi). Sections are separated by SECTION lines."""
    inner = shlex.quote(f"{query} 2>&1; echo {SECTION}; nvidia-smi 2>&1")
    return (f"{query} 2>&1; echo {SECTION}; nvidia-smi 2>&1; echo {SECTION}; "
            f"docker run --rm --gpus all --network none {shlex.quote(image)} sh -c {inner} 2>&1")


def split_sections(lines: list[str], count: int) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for line in lines:
        if line.strip() == SECTION:
            parts.append([])
        else:
            parts[-1].append(line)
    if len(parts) < count:  # e.g. docker failed before the container printed anything
        parts += [[] for _ in range(count - len(parts))]
    return parts


def _probe_all(image: str) -> list[tuple[str, gpufacts.GpuQuery, dict]]:
    """[(where, query result, summary)] for the host and the container."""
    _, out = host.run_shell_command(probe_command(image))
    parts = split_sections(out.stdout_lines + out.stderr_lines, 4)
    host_q, host_sum = parts[0], parts[1]
    # the container section: the query, then the summary; docker's own errors land in the first
    container = parts[2:]
    cont_q, cont_sum = container[0], (container[1] if len(container) > 1 else [])
    results = []
    for where, q_lines, s_lines in (("host", host_q, host_sum), ("container", cont_q, cont_sum)):
        info = gpufacts.parse_query(q_lines)
        if info.invalid_field == "compute_cap":  # drivers before R510: look the capability up by name
            prefix = "" if where == "host" else f"docker run --rm --gpus all --network none {shlex.quote(image)} "
            _, out2 = host.run_shell_command(f"{prefix}{gpufacts.QUERY_COMMAND_NO_CC} 2>&1")
            info = gpufacts.parse_query(out2.stdout_lines + out2.stderr_lines, gpufacts.QUERY_FIELDS_NO_CC)
        results.append((where, info, gpufacts.parse_summary(s_lines)))
    return results


def verify_current_host(image: str) -> dict:
    gpu_class = str(config.get("gpu_class")).upper()
    rows, errors = [], []
    for where, info, summary in _probe_all(image):
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
