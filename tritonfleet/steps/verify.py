"""GPU verification: the host's nvidia-smi, and the same inside `docker run --gpus all`.

Both must show the GPU model of the host's class (T4/L4), compute capability and CUDA version at
least the configured minimum, and as many GPUs as gpu_count or the host's GPU record says
(tritonfleet.gpu.placement); a mismatch fails that host naming expected and found.
"""

from __future__ import annotations

from pyinfra import host, logger, state
from pyinfra.api import operation

from ..core.report import Failure, HostFailure, trim
from ..core.shell import q
from ..gpu import facts as gpufacts
from ..gpu.placement import RECORD, count_problems, expected_count, parse_record, record_update
from ..gpu.rules import GPU_CLASSES, check_gpus, triton_min_compute_capability, version_tuple
from ..host import kernel_module as kmod
from ..host.gpu_probe import (  # noqa: F401  (the check's command, as the bench's Ansible playbook runs it)
    QUERY,
    RECORD_PREFIX,
    SECTION,
    STAMP,
    GpuProbe,
    container_prefix,
    depends_command,
    probe_command,
    split_sections,
)
from ..host.layer import smi_command
from ..pyinfra_ext import memo
from ..pyinfra_ext.check import check
from ..pyinfra_ext.install import tritonfleet_step
from ..settings import access
from .triton import ensure_image


class GpuVerificationError(HostFailure):
    pass


VERIFY_MODES = ("changes", "always")
# host name -> the stamp's new text, left by a check that passed on a fresh container answer for
# its own operation (record_answer) to write
_new_answers: dict[str, str] = {}
# host name -> the GPU record's new lines (tritonfleet.gpu.placement), left by a check that passed
_new_records: dict[str, list[str]] = {}


def verify_mode() -> str:
    mode = access.get("gpu_verify_container") or "changes"
    if mode not in VERIFY_MODES:
        raise access.ConfigError(
            f"{host.name}: gpu_verify_container must be one of {', '.join(VERIFY_MODES)}, "
            f"not {mode!r} (group data, inventories/group_data/all.py)"
        )
    return mode


def _probe_all(image: str, meta: dict | None = None) -> list[tuple[str, gpufacts.GpuQuery, dict]]:
    """[(where, query result, summary)] for the host and the container. ``meta`` gets "key" (the
    digest to record once the check passed) or "cached" (the container answer was the recorded
    one), and the container's raw sections."""
    mode = verify_mode()
    smi = smi_command(access.current())
    # mode "changes": pre-flight's batch read the host's part (GpuProbe); while nothing changed
    # since and the recorded container answer is valid, that is the whole check's answer
    known = memo.known(GpuProbe, image=image, smi=smi) if mode == "changes" else None
    if known and known[-1] == "cached":
        stdout, stderr, tail = list(known), [], None
    else:
        _, out = host.run_shell_command(probe_command(image, mode=mode, smi=smi))
        stdout, stderr, tail = list(out.stdout_lines), list(out.stderr_lines), None
    if mode != "always" and stdout and (stdout[-1].startswith("key=") or stdout[-1] == "cached"):
        tail = stdout.pop()
        if stdout and stdout[-1].strip() == SECTION:
            stdout.pop()
    record = [ln[len(RECORD_PREFIX) :] for ln in stdout if ln.startswith(RECORD_PREFIX)]
    stdout = [ln for ln in stdout if not ln.startswith(RECORD_PREFIX)]
    lines = stdout + stderr
    parts = split_sections(lines, 4)
    host_q, (host_sum, kmod_lines) = parts[0], kmod.split(parts[1])
    if meta is not None:
        meta["kernel_module"] = kmod.parse(kmod_lines)
    # the container section: the query, then the summary; docker's own errors land in the first
    container = parts[2:]
    cont_q, cont_sum = container[0], (container[1] if len(container) > 1 else [])
    if meta is not None:
        meta["record"] = record
        meta.update(
            key=tail[4:] if tail and tail.startswith("key=") else None,
            cached=tail == "cached",
            container=(cont_q, cont_sum),
        )
    results = []
    for where, q_lines, s_lines in (("host", host_q, host_sum), ("container", cont_q, cont_sum)):
        info = gpufacts.parse_query(q_lines)
        if info.invalid_field == "compute_cap":  # drivers before R510: look the capability up by name
            command = (
                gpufacts.query_command(gpufacts.QUERY_FIELDS_NO_CC, smi)
                if where == "host"
                else container_prefix(image) + gpufacts.QUERY_COMMAND_NO_CC
            )
            _, out2 = host.run_shell_command(f"{command} 2>&1")
            info = gpufacts.parse_query(out2.stdout_lines + out2.stderr_lines, gpufacts.QUERY_FIELDS_NO_CC)
        results.append((where, info, gpufacts.parse_summary(s_lines)))
    return results


def min_compute_capability() -> str:
    """gpu_min_compute_capability, or the Triton release's own minimum when that is higher."""

    own = str(access.get("gpu_min_compute_capability") or "0")
    triton = triton_min_compute_capability(access.get("triton_image")) or "0"
    return own if version_tuple(own) >= version_tuple(triton) else triton


def wanted_flavour(driver_version: str | None) -> str:
    """nvidia_kernel_module, else NVIDIA's default for the branch the host's driver belongs to (the
    configured branch when the host reports none)."""
    flavour = access.get("nvidia_kernel_module")
    if flavour:
        return str(flavour)
    branch = (driver_version or "").split(".")[0] or access.get("nvidia_driver_branch") or ""
    return kmod.default_flavour(branch)


def verify_current_host(image: str) -> dict:
    """The check: changes nothing on the host but forgetting a recorded answer that failed; a
    fresh answer that passed is left for ``record_answer`` to write."""
    _new_answers.pop(host.name, None)
    _new_records.pop(host.name, None)
    gpu_class = str(access.get("gpu_class")).upper()
    rows, errors, meta, drivers = [], [], {}, []
    probed = _probe_all(image, meta)
    recorded = parse_record(meta.get("record") or [])
    try:
        expected = expected_count(access.get("gpu_count"), recorded)
    except ValueError as e:
        raise access.ConfigError(f"{host.name}: {e}") from e
    source = "gpu_count" if access.get("gpu_count") not in (None, "") else f"recorded in {RECORD}"
    host_gpus = []
    for where, info, summary in probed:
        errs = check_gpus(
            f"{host.name} ({where})",
            gpu_class,
            info.gpus,
            summary.get("cuda_version"),
            min_compute_capability(),
            access.get("gpu_min_cuda_version"),
        )
        if info.status == "ok" or info.gpus:
            errs += count_problems(f"{host.name} ({where})", info.gpus, expected, recorded, source)
        if where == "host":
            host_gpus = info.gpus
        if info.status != "ok":
            errs = [f"{host.name} ({where}): nvidia-smi failed ({info.status}): {info.message}"] + errs
        errors += errs
        g = info.gpus[0] if info.gpus else None
        drivers.append(g.driver_version if g else None)
        rows.append(
            f"{host.name:<12} {where:<9} {len(info.gpus)}x {(g.name if g else '-'):<10} "
            f"driver {(g.driver_version if g else '-'):<10} cc {(g.compute_cap if g else '-'):<4} "
            f"CUDA {summary.get('cuda_version') or '-'}"
        )
    if expected:  # reported/expected (a record that grows: as many as the host reports now)
        shown = expected if source == "gpu_count" else max(expected, len(host_gpus))
        rows = [f"{r}  GPUs {r.split('x ', 1)[0].split()[-1]}/{shown}" for r in rows]
    if meta.get("cached"):
        rows[-1] += "  (as when it last passed: nothing it depends on changed)"
    module = meta.get("kernel_module")
    if module is not None and (module.installed or module.loaded or module.license):
        wanted = wanted_flavour(drivers[0] if drivers else None)
        rows[0] += f"  kernel module {module.summary()}"
        problem = module.problem(wanted)
        if problem:
            errors.append(
                f"{host.name} (host): kernel module flavour: {problem}, expected {wanted} (nvidia_kernel_module)"
            )
    for r in rows:
        logger.info(f"GPU check  {r}")
    if errors:
        host.run_shell_command(f"rm -f {STAMP}")
        found = [e.replace(f"{host.name} (", "(", 1) for e in dict.fromkeys(errors)]
        cont_q, cont_sum = meta.get("container") or ([], [])
        raise GpuVerificationError(
            Failure(
                host.name,
                "GPU verification",
                f"GPU class {gpu_class} ({' or '.join(GPU_CLASSES.get(gpu_class, {}).get('names', [])) or '?'}), "
                + (f"{expected} GPU(s) ({source}), " if expected else "")
                + f"compute capability >= {min_compute_capability()}, CUDA >= "
                f"{access.get('gpu_min_cuda_version')}, on the host and in `{container_prefix(image).strip()}`",
                "; ".join(found),
                trim(rows + [ln for ln in cont_q if ln.strip() and "," not in ln][:6]),
                "nvidia-smi (host and container, as the check read it)",
                "the GPU check runs before the Triton image, models and service are touched: Triton was not "
                "changed by this run",
                "fix the driver / Container Toolkit / inventory as the line above says (nvidia-smi on the host; "
                f"{container_prefix(image)}nvidia-smi; a kernel module flavour: run the driver step, deploys/host.py, "
                "which installs the configured flavour and reboots when the loaded module differs, or set "
                "nvidia_kernel_module for this GPU class in inventories/group_data/<class>.py), then run the deploy again"
                + (
                    "; a GPU that is gone for good: set gpu_count for this host (inventory or group data) to what "
                    f"it has now, or remove {RECORD} so the next verified run records what it finds"
                    if any("missing:" in e for e in found)
                    else ""
                ),
                cause="; ".join(found),
            )
        )
    new_record = record_update(host_gpus, recorded)
    if new_record:
        _new_records[host.name] = new_record
    if meta.get("key"):
        cont_q, cont_sum = meta["container"]
        _new_answers[host.name] = "\n".join([f"key={meta['key']}", *cont_q, SECTION, *cont_sum]) + "\n"
    return {"rows": rows, "cached": bool(meta.get("cached")), "gpus": len(host_gpus), "expected": expected}


def stamp_command(text: str) -> str:
    return f"mkdir -p {q(STAMP.rsplit('/', 1)[0])} && printf '%s' {q(text)} > {STAMP}.tmp && mv {STAMP}.tmp {STAMP}"


@operation(is_idempotent=False)
def record_answer():
    """Record the container check's answer on the host when the check just passed on a fresh one (what it
    depends on changed, or there was none): a change only then. Never planned as a change (the answer
    exists only once the check ran).

    Changes: the recorded answer, only when the check just passed on a fresh one.

    Tunables: none.

    **Example:**

    .. code:: python

        record_answer(name="record the GPU check's answer")
    """
    text = _new_answers.pop(host.name, None) if state.is_executing else None
    if not text:
        host.noop("the GPU check's recorded answer stays as it is")
        return
    yield stamp_command(text)


def record_command(lines: list[str]) -> str:
    return (
        f"mkdir -p {q(RECORD.rsplit('/', 1)[0])} && printf '%s\\n' {' '.join(q(x) for x in lines)} "
        f"> {RECORD}.tmp && mv {RECORD}.tmp {RECORD}"
    )


@operation(is_idempotent=False)
def record_gpus():
    """Record the GPUs the check found (tritonfleet.gpu.placement.RECORD) when the host had no record, or
    reports more or other GPUs than it holds: what later runs and `tritonfleet status` expect.

    Changes: the host's GPU record, only when missing or other than found.

    Tunables: none.

    **Example:**

    .. code:: python

        record_gpus(name="record the host's GPUs")
    """
    lines = _new_records.pop(host.name, None) if state.is_executing else None
    if not lines:
        host.noop("the GPU record stays as it is")
        return
    yield record_command(lines)


@tritonfleet_step("GPU verification")
def verify_gpus(load_image: bool = True):
    """GPU verification: ``nvidia-smi`` on the host and in ``docker run --gpus all``
    (model, compute capability, CUDA, as many GPUs as the host should have), then the answer and
    the GPUs found recorded on the host.

    + load_image: pull (or load) the CUDA test image first; False when the deploy already did

    Changes: the CUDA test image on the host (with ``load_image``), the recorded check answer and GPU
    record; a drained host is put back in its load balancer once Triton is ready again.

    Tunables: ``cuda_test_image``, ``gpu_count``, ``gpu_min_compute_capability``, ``gpu_min_cuda_version``,
    ``gpu_verify_container``, ``nvidia_driver_branch``, ``nvidia_kernel_module``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.verify import verify_gpus

        verify_gpus(load_image=False)  # read-only: deploys/verify.py
    """
    image = access.get("cuda_test_image")
    if load_image:
        ensure_image(image)
    check(
        name=f"check: nvidia-smi on the host and in {image} with --gpus all", function=verify_current_host, image=image
    )
    record_answer(name="record the GPU check's answer and what it depends on (gpu_verify_container)")
    record_gpus(name=f"record the host's GPUs ({RECORD}: what gpu_count defaults to)")
