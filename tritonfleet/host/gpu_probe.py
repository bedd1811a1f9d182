"""The GPU check's host side, as one command and as a fact (tritonfleet.steps.verify runs the check).

``probe_command`` is the whole check in one remote command: the host's GPU record, the
``nvidia-smi`` query and ``-q`` report's header, the kernel module's flavour, then both nvidia-smi answers again
inside ``docker run --gpus all`` (or, in mode "changes", the last passing container answer when
nothing it depends on changed: :data:`STAMP`).

``GpuProbe`` is the same without the container run: on a converged host everything the check
reads (the recorded answer is still valid), in a section of pre-flight's one batched command
(tritonfleet.pyinfra_ext.memo.prefetch). It also answers, from that one ``nvidia-smi`` query, the
facts that would each run nvidia-smi again (``derived``): the GPUs (NvidiaGpus), the driver
version, the persistence check's ``nvidia-smi -q`` lines, the kernel module and the GPU record. Where its answer is not "cached" the check runs
``probe_command`` itself.
"""

from __future__ import annotations

from pyinfra.api import FactBase
from pyinfra.facts.server import Command

from ..core.shell import q
from ..gpu import facts as gpufacts
from ..gpu.placement import RECORD, parse_record
from . import kernel_module as kmod
from .facts import DockerImageId

QUERY = gpufacts.QUERY_COMMAND
SECTION = "@@tritonfleet-section@@"
# the host's GPU record (tritonfleet.gpu.placement.RECORD) comes first in the probe's output, each line
# behind this prefix
RECORD_PREFIX = "@@tritonfleet-gpu-record@@ "
# the container check's last passing answer, and what it depended on (gpu_verify_container)
STAMP = "/var/lib/tritonfleet/gpu-verified"
# GpuProbe's last line when the recorded answer is not valid (the check runs the container)
STALE = "stale"
# GpuProbe's image IDs (the test image's, then those of ``also``), one line each behind this prefix
IMAGE_PREFIX = "@@tritonfleet-image@@ "


def container_prefix(image: str) -> str:
    """The check's container (no network: it only runs nvidia-smi), before the command it runs."""
    return f"docker run --rm --gpus all --network none {q(image)} "


def depends_command(image: str, image_id: str | None = None) -> str:
    """Shell printing a digest of what the container check's answer depends on: this boot, the
    host's GPUs and driver (the query's output in $q), the toolkit, Docker and containerd
    packages, daemon.json and the test image (``image_id``: shell printing its ID line as
    ``docker image inspect`` would, where the caller already asked Docker)."""
    inspect = image_id or f"docker image inspect --format '{{{{.Id}}}}' {q(image)} 2>/dev/null"
    return (
        '{ echo "$q"; cat /proc/sys/kernel/random/boot_id; '
        "dpkg-query -W -f '${Package}=${Version}\\n' 'nvidia-container-*' 'libnvidia-container*' "
        "docker-ce docker.io 'containerd*' 2>/dev/null; cat /etc/docker/daemon.json 2>/dev/null; "
        f"{inspect}; }} "
        "| sha256sum | cut -c1-32"
    )


def _host_part(query: str, smi: str) -> str:
    host_query = (
        query if smi == "nvidia-smi" or not query.startswith("nvidia-smi ") else smi + query[len("nvidia-smi") :]
    )
    # the host's part also reads the GPU record, nvidia-smi -q (the CUDA version, each GPU's
    # persistence mode: gpufacts.summary_command) and the kernel module's flavour (installed:
    # modinfo; loaded: /proc)
    return (
        f"sed 's/^/{RECORD_PREFIX}/' {RECORD} 2>/dev/null; q=$({host_query} 2>&1); echo \"$q\"; "
        f"echo {SECTION}; {gpufacts.summary_command(smi)}; {kmod.COMMAND}; echo {SECTION}; "
    )


def images_command(images: tuple[str, ...]) -> str:
    """Shell setting $ids to the image ID of each of ``images``, one line each in that order
    (empty: not there): one ``docker image inspect`` for all of them, which prints the found
    ones' IDs in the order asked and exits 1 when one is missing (docker/cli
    cli/command/inspect/inspector.go, ``Inspect``; commit e0dfb46e22c4); then, and only then,
    one inspect each, so that the lines keep their places."""
    names = " ".join(q(i) for i in images)
    return (
        f"ids=$(docker image inspect --format '{{{{.Id}}}}' {names} 2>/dev/null) || "
        f"ids=$(for i in {names}; do printf '%s\\n' \"$(docker image inspect --format '{{{{.Id}}}}' \"$i\" "
        '2>/dev/null)"; done)'
    )


def probe_args(image: str, smi: str, triton_image: str | None) -> dict:
    """GpuProbe's arguments in a deploy of Triton (pre-flight's batch, and the check that finds
    its answer there): the test image, the driver's command, the Triton image asked with it."""
    return {"image": image, "smi": smi, "also": (triton_image,) if triton_image else ()}


def probe_images(image: str, also) -> tuple[str, ...]:
    """The images GpuProbe asks Docker for: the test image first, then ``also``, each once."""
    return tuple(dict.fromkeys([image, *(also or ())]))


def _cached(image: str, otherwise: str, image_id: str | None = None) -> str:
    return (
        f"k=$({depends_command(image, image_id)}); "
        f'if [ "$(head -n 1 {STAMP} 2>/dev/null)" = "key=$k" ]; then tail -n +2 {STAMP}; '
        f"echo {SECTION}; echo cached; else {otherwise}; fi"
    )


def probe_command(image: str, query: str = QUERY, mode: str = "always", smi: str = "nvidia-smi") -> str:
    """One remote command for the whole check: the query and ``nvidia-smi -q``'s header (for the
    CUDA version) on the host, then the query and the table inside one `docker run --gpus all` (no network:
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
    else the host's part and ``stale``; first, the image IDs of the test image and ``also`` (the
    Triton image: one ``docker image inspect`` for both). Read in pre-flight's batch; ``derived``
    answers the facts that would each run nvidia-smi or docker again from this one answer."""

    default = list

    def command(self, image: str, smi: str = "nvidia-smi", also: tuple[str, ...] = ()) -> str:
        return (
            f"{images_command(probe_images(image, also))}; printf '%s\\n' \"$ids\" | sed 's/^/{IMAGE_PREFIX}/'; "
            + _host_part(QUERY, smi)
            + _cached(image, f"echo {STALE}", image_id="printf '%s\\n' \"$ids\" | head -n 1")
        )

    def process(self, output):
        return list(output)

    @staticmethod
    def derives(image: str, smi: str = "nvidia-smi", also: tuple[str, ...] = ()) -> list[tuple]:
        """[(fact class, kwargs)] that ``derived`` may answer: a batch with this fact leaves them
        out (memo.prefetch); one it did not answer is read on its own later."""
        return [
            (gpufacts.GpuRecord, {}),
            (Command, {"command": kmod.COMMAND}),
            (Command, {"command": gpufacts.persistence_command(smi)}),
            (gpufacts.NvidiaGpus, {"smi": smi}),
            (Command, {"command": gpufacts.driver_version_command(smi)}),
            *((DockerImageId, {"image": i}) for i in probe_images(image, also)),
        ]

    @staticmethod
    def derived(lines: list[str], image: str, smi: str = "nvidia-smi", also: tuple[str, ...] = ()) -> list[tuple]:
        """[(fact class, kwargs, value)] read from the same answer: the GPU record, the kernel
        module and the persistence check's lines of ``nvidia-smi -q`` always; NvidiaGpus and the
        driver version when the query answered (an old driver without compute_cap, or one that
        fails, is read on its own, as before)."""
        record = [ln[len(RECORD_PREFIX) :] for ln in lines if ln.startswith(RECORD_PREFIX)]
        ids = image_ids(lines)
        rest = without_ids([ln for ln in lines if not ln.startswith(RECORD_PREFIX)])
        parts = split_sections(rest, 2)
        query_lines, (summary_lines, kmod_lines) = parts[0], kmod.split(parts[1])
        out: list[tuple] = [
            (gpufacts.GpuRecord, {}, parse_record(record)),
            (Command, {"command": kmod.COMMAND}, "\n".join(kmod_lines) or None),
            (
                Command,
                {"command": gpufacts.persistence_command(smi)},
                "\n".join(gpufacts.persistence_lines(summary_lines)) or None,
            ),
            *(
                (DockerImageId, {"image": i}, DockerImageId().process(ids[n : n + 1]))
                for n, i in enumerate(probe_images(image, also))
            ),
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


def image_ids(lines: list[str]) -> list[str]:
    """GpuProbe's image ID lines, in the order asked ("" where the image is not there)."""
    mark = IMAGE_PREFIX.rstrip()
    return [ln[len(mark) :].strip() for ln in lines if ln.startswith(mark)]


def without_ids(lines: list[str]) -> list[str]:
    return [ln for ln in lines if not ln.startswith(IMAGE_PREFIX.rstrip())]


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
