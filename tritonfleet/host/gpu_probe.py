"""The GPU check's host side, as one command and as a fact (tritonfleet.steps.verify runs the check).

``probe_command`` is the whole check in one remote command: the host's GPU record, the
``nvidia-smi`` query and table, the kernel module's flavour, then both nvidia-smi answers again
inside ``docker run --gpus all`` (or, in mode "changes", the last passing container answer when
nothing it depends on changed: :data:`STAMP`).

``GpuProbe`` is the same without the container run: on a converged host everything the check
reads (the recorded answer is still valid), in a section of pre-flight's one batched command
(tritonfleet.pyinfra_ext.memo.prefetch). It also answers, from that one ``nvidia-smi`` query, the
facts that would each run nvidia-smi again (``derived``): the GPUs (NvidiaGpus), the driver
version, the kernel module and the GPU record. Where its answer is not "cached" the check runs
``probe_command`` itself.
"""

from __future__ import annotations

from pyinfra.api import FactBase
from pyinfra.facts.server import Command

from ..core.shell import q
from ..gpu import facts as gpufacts
from ..gpu.placement import RECORD, parse_record
from . import kernel_module as kmod

QUERY = gpufacts.QUERY_COMMAND
SECTION = "@@tritonfleet-section@@"
# the host's GPU record (tritonfleet.gpu.placement.RECORD) comes first in the probe's output, each line
# behind this prefix
RECORD_PREFIX = "@@tritonfleet-gpu-record@@ "
# the container check's last passing answer, and what it depended on (gpu_verify_container)
STAMP = "/var/lib/tritonfleet/gpu-verified"
# GpuProbe's last line when the recorded answer is not valid (the check runs the container)
STALE = "stale"


def container_prefix(image: str) -> str:
    """The check's container (no network: it only runs nvidia-smi), before the command it runs."""
    return f"docker run --rm --gpus all --network none {q(image)} "


def depends_command(image: str) -> str:
    """Shell printing a digest of what the container check's answer depends on: this boot, the
    host's GPUs and driver (the query's output in $q), the toolkit, Docker and containerd
    packages, daemon.json and the test image."""
    return (
        '{ echo "$q"; cat /proc/sys/kernel/random/boot_id; '
        "dpkg-query -W -f '${Package}=${Version}\\n' 'nvidia-container-*' 'libnvidia-container*' "
        "docker-ce docker.io 'containerd*' 2>/dev/null; cat /etc/docker/daemon.json 2>/dev/null; "
        f"docker image inspect --format '{{{{.Id}}}}' {q(image)} 2>/dev/null; }} "
        "| sha256sum | cut -c1-32"
    )


def _host_part(query: str, smi: str) -> str:
    host_query = (
        query if smi == "nvidia-smi" or not query.startswith("nvidia-smi ") else smi + query[len("nvidia-smi") :]
    )
    # the host's part also reads the GPU record and the kernel module's flavour (installed: modinfo;
    # loaded: /proc)
    return (
        f"sed 's/^/{RECORD_PREFIX}/' {RECORD} 2>/dev/null; q=$({host_query} 2>&1); echo \"$q\"; "
        f"echo {SECTION}; {smi} 2>&1; {kmod.COMMAND}; echo {SECTION}; "
    )


def _cached(image: str, otherwise: str) -> str:
    return (
        f"k=$({depends_command(image)}); "
        f'if [ "$(head -n 1 {STAMP} 2>/dev/null)" = "key=$k" ]; then tail -n +2 {STAMP}; '
        f"echo {SECTION}; echo cached; else {otherwise}; fi"
    )


def probe_command(image: str, query: str = QUERY, mode: str = "always", smi: str = "nvidia-smi") -> str:
    """One remote command for the whole check: the query and the summary (for the CUDA version)
    from nvidia-smi on the host, then both again inside one `docker run --gpus all` (no network:
    the container only runs nvidia-smi). Sections are separated by SECTION lines; the last one is
    ``key=<digest>`` after a container run, or ``cached`` when mode "changes" found the last
    passing answer still valid (nothing it depends on changed) and printed that instead. ``smi``:
    the command that asks the driver on the host (nvidia_smi_command; the query given for the host
    then starts with it too); inside the container, the nvidia-smi the Container Toolkit put there."""
    inner = q(f"{query} 2>&1; echo {SECTION}; nvidia-smi 2>&1")
    run = f"{container_prefix(image)}sh -c {inner} 2>&1"
    if mode == "always":
        return f"{_host_part(query, smi)}{run}"
    return _host_part(query, smi) + _cached(image, f'{run}; echo {SECTION}; echo "key=$k"')


class GpuProbe(FactBase):
    """The GPU check's host side without the container (mode "changes"): the output lines of
    ``probe_command`` when the recorded container answer is still valid (last line ``cached``),
    else the host's part and ``stale``. Read in pre-flight's batch; ``derived`` answers the facts
    that would each run nvidia-smi again from this one query."""

    default = list

    def command(self, image: str, smi: str = "nvidia-smi") -> str:
        return _host_part(QUERY, smi) + _cached(image, f"echo {STALE}")

    def process(self, output):
        return list(output)

    @staticmethod
    def derived(lines: list[str], image: str, smi: str = "nvidia-smi") -> list[tuple]:
        """[(fact class, kwargs, value)] read from the same answer: the GPU record and the kernel
        module always; NvidiaGpus and the driver version when the query answered (an old driver
        without compute_cap, or one that fails, is read on its own, as before)."""
        record = [ln[len(RECORD_PREFIX) :] for ln in lines if ln.startswith(RECORD_PREFIX)]
        rest = [ln for ln in lines if not ln.startswith(RECORD_PREFIX)]
        parts = split_sections(rest, 2)
        query_lines, (_, kmod_lines) = parts[0], kmod.split(parts[1])
        out: list[tuple] = [
            (gpufacts.GpuRecord, {}, parse_record(record)),
            (Command, {"command": kmod.COMMAND}, "\n".join(kmod_lines) or None),
        ]
        info = gpufacts.parse_query(query_lines)
        if info.ok:
            out += [
                (gpufacts.NvidiaGpus, {"smi": smi}, info),
                (
                    Command,
                    {"command": gpufacts.driver_version_command(smi)},
                    "\n".join(g.driver_version or "" for g in info.gpus),
                ),
            ]
        return out


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
