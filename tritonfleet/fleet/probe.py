"""One read-only look at a host, in one SSH command: GPUs, driver, toolkit, Docker, the Triton
unit, image and live model release, which models Triton has ready, and the last recorded
deployment. Compared with what the inventory asks for, it shows drift.

Used by ``tritonfleet status`` and by ``tritonfleet rollout`` (versions before and after).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..core.connection_errors import CONNECTION_ERRORS
from ..core.report import HOST_RECORD, Failure
from ..core.shell import q
from ..gpu import placement
from ..gpu.facts import smi_command
from ..gpu.rules import GPU_CLASSES
from ..host import boot_kernel, driver_hold, driver_source, kernel_module
from ..inventory import roster
from ..model_repo.render import host_repository
from ..serving import apikey, per_gpu
from ..serving.unit import render_unit, unit_context, unit_digest, units_digest
from ..settings.access import Settings

SECTIONS = (
    "gpu",
    "gpu_record",
    "toolkit",
    "docker",
    "active",
    "unit",
    "image",
    "wanted_image",
    "release",
    "models",
    "last",
    "failure",
    "kernel",
    "kmod",
    "driver_source",
    "driver_hold",
    "instances",
)


def command(settings: Settings) -> str:
    """The probe's shell command for a host whose tunables ``settings`` holds."""
    base, service = settings.get("triton_base_dir"), settings.get("triton_service")
    container = settings.get("triton_container_name")
    bind = settings.get("triton_http_bind")
    addr = bind if bind and bind not in ("0.0.0.0", "::") else "127.0.0.1"
    url = f"http://{addr}:{settings.get('triton_http_port')}/v2/repository/index"
    parts = {
        # the command the deploy asks the driver with (nvidia_smi_command)
        "gpu": f"{smi_command(settings)} --query-gpu=name,driver_version,index,pci.bus_id,uuid "
        "--format=csv,noheader 2>&1 | head -n 16",
        "gpu_record": f"cat {placement.RECORD} 2>/dev/null",
        "toolkit": "dpkg-query -W -f '${Version}' nvidia-container-toolkit 2>/dev/null",
        "docker": "docker version --format '{{.Server.Version}}' 2>/dev/null",
        "active": f"systemctl is-active {q(service)} 2>/dev/null",
        "unit": f"sha256sum /etc/systemd/system/{q(service)}.service 2>/dev/null | cut -c1-16",
        # the reference the container was started with, the image it runs (ID), that image's
        # repository digests; then the image the wanted reference names on the host now
        "image": (
            f"c=$(docker inspect --format '{{{{.Config.Image}}}}|{{{{.Image}}}}' {q(container)} 2>/dev/null) "
            '&& echo "$c" && echo "digests=$(docker image inspect --format '
            '\'{{join .RepoDigests " "}}\' "${c#*|}" 2>/dev/null)"'
        ),
        "wanted_image": f"docker image inspect --format '{{{{.Id}}}}' {q(str(settings.get('triton_image')))} 2>/dev/null",
        "release": f"readlink {q(base)}/model_repository",
        "models": apikey.curl(settings.get("triton_api_key_file") or "/nonexistent", f"-s -m 5 -X POST {q(url)}"),
        "last": f"tail -n 1 {q(base)}/history.jsonl 2>/dev/null",
        "failure": f"cat {HOST_RECORD} 2>/dev/null",
        # a pending reboot, the kernel it boots and whether that kernel has the NVIDIA module
        "kernel": f"( {boot_kernel.status_command()} )",
        # the NVIDIA kernel module's flavour: installed (modinfo's licence) and loaded (/proc)
        "kmod": f"( {kernel_module.COMMAND} )",
        # where the driver came from (CUDA repository, distro packages, .run installer)
        "driver_source": f"( {driver_source.PROBE_COMMAND} )",
        # the branch a failed driver change left the host held on (tritonfleet.fleet.rollout.driver)
        "driver_hold": f"head -c 4096 {driver_hold.HOLD_FILE} 2>/dev/null",
    }
    if per_gpu.enabled(settings):
        parts.update(per_gpu_parts(settings, addr))
    return "; ".join(f"echo @{k}; {v}; echo" for k, v in parts.items()) + "; true"


def per_gpu_parts(settings: Settings, addr: str) -> dict[str, str]:
    """The probe's sections for a host with one Triton per GPU (tritonfleet.serving.per_gpu): each per-GPU
    unit on the host as ``<index> <is-active> <HTTP code of /v2/health/ready>``, the digest of the
    units one after the other by index (units_digest), the image of GPU 0's container."""
    step = per_gpu.port_step(settings)
    first = per_gpu.instance_get(settings, 0)
    units = f"$({per_gpu.list_units_command(settings)})"
    return {
        "active": "true",
        "instances": (
            f"for u in {units}; do i=${{u##*-gpu}}; i=${{i%.service}}; "
            f's=$(systemctl is-active "$u" 2>/dev/null); '
            f"r=$(curl -s -o /dev/null -m 3 -w '%{{http_code}}' "
            f"http://{addr}:$(({int(settings.get('triton_http_port'))} + {step} * i))/v2/health/ready); "
            'echo "$i ${s:-unknown} ${r:-000}"; done'
        ),
        "unit": (
            f'( cd /etc/systemd/system && f={units} && [ -n "$f" ] && cat $f | sha256sum | cut -c1-16 ) 2>/dev/null'
        ),
        "image": (
            f"c=$(docker inspect --format '{{{{.Config.Image}}}}|{{{{.Image}}}}' "
            f"{q(first.get('triton_container_name'))} 2>/dev/null) "
            '&& echo "$c" && echo "digests=$(docker image inspect --format '
            '\'{{join .RepoDigests " "}}\' "${c#*|}" 2>/dev/null)"'
        ),
    }


#: the sections the command printed (a section it did not print was not asked: no answer to miss)
PRINTED = "@printed"


def parse(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {k: [] for k in SECTIONS}
    out[PRINTED] = []
    key = None
    for line in text.splitlines():
        if line.startswith("@") and line[1:].strip() in SECTIONS:
            key = line[1:].strip()
            out[PRINTED].append(key)
        elif key and line.strip():
            out[key].append(line.strip())
    return out


@dataclass
class HostStatus:
    host: str
    address: str
    gpu_class: str | None
    reachable: bool = False
    error: str = ""
    gpus: list[str] = field(default_factory=list)
    gpu_ids: list[dict] = field(default_factory=list)  # index, pci_bus_id, uuid, name of each GPU reported
    gpu_recorded: list[dict] = field(default_factory=list)  # the host's GPU record (tritonfleet.gpu.placement)
    gpu_expected: int | None = None  # gpu_count, else the record's count
    gpu_expected_from: str = ""  # "gpu_count" or "recorded"
    driver: str | None = None
    toolkit: str | None = None
    docker: str | None = None
    unit_state: str | None = None
    unit: str | None = None
    image: str | None = None
    image_id: str | None = None
    image_digests: list[str] = field(default_factory=list)
    wanted_image_id: str | None = None
    release: str | None = None
    models_ready: list[str] = field(default_factory=list)
    models_not_ready: list[str] = field(default_factory=list)
    last_deploy: dict | None = None
    last_failure: dict | None = None  # the report of a failure newer than the last healthy deployment
    kernel: dict | None = None  # tritonfleet.host.boot_kernel.KernelState: running/boot kernel, module, pending reboot
    reboot: str = "-"  # the pending reboot and its kernel's module, for the table
    kernel_module: dict | None = None  # tritonfleet.host.kernel_module.ModuleState: installed/loaded flavour
    module: str = "-"  # the module's flavour, for the table
    driver_source: str | None = None  # cuda, debian, ubuntu, runfile (+ others on a mixed host); None: none
    # triton_per_gpu: each per-GPU unit on the host {index, state, ready} and how many are expected
    instances: list[dict] = field(default_factory=list)
    instances_expected: int | None = None
    #: what the probe could not read or tell, and why ({what: why}): never a default value that
    #: looks like an answer (no models, no failure, no count); each one is drift
    unknown: dict[str, str] = field(default_factory=dict)
    drift: list[str] = field(default_factory=list)
    driver_hold: dict | None = None  # tritonfleet.host.driver_hold: the branch a failed driver change left it on
    # out of the load balancer by the quarantine receiver (tritonfleet.fleet.quarantine): since, reasons, held
    quarantine: dict | None = None

    @property
    def version(self) -> str:
        """Short form of what the host serves: release id and image tag."""
        if not self.release and not self.image:
            return "-"
        tag = (self.image or "-").rsplit("/", 1)[-1]
        name, _, digest = tag.partition("@")
        return f"{self.release or '-'} {name}" + (f"@{digest[:19]}" if digest else "")

    def to_json(self) -> dict:
        d = asdict(self)
        d["version"] = self.version
        return d


def interpret(fh: roster.FleetHost, sections: dict[str, list[str]]) -> HostStatus:
    st = HostStatus(fh.name, fh.address, fh.gpu_class, reachable=True)
    gpu_lines = sections["gpu"]
    if gpu_lines and "," in gpu_lines[0] and "failed" not in gpu_lines[0].lower():
        for line in gpu_lines:
            name, drv, *ids = [p.strip() for p in line.split(",")]
            st.gpus.append(name)
            st.driver = drv
            if len(ids) == 3 and ids[0].isdigit():
                st.gpu_ids.append({"index": int(ids[0]), "pci_bus_id": ids[1], "uuid": ids[2], "name": name})
    elif gpu_lines:
        st.error = gpu_lines[0][:120]
    st.gpu_recorded = placement.parse_record(sections["gpu_record"])
    try:
        settings = fh if hasattr(fh, "get") else None  # a FleetHost; bare name/address holders: the record's count
        gpu_count = settings.get("gpu_count") if settings else None
        st.gpu_expected = placement.expected_count(gpu_count, st.gpu_recorded)
        st.gpu_expected_from = "gpu_count" if gpu_count not in (None, "") else "recorded"
    except ValueError as e:  # gpu_count that is not a count: said, not taken for "none expected"
        st.gpu_expected = None
        st.unknown["GPU count"] = str(e)
    st.toolkit = (sections["toolkit"] or [None])[0]
    st.docker = (sections["docker"] or [None])[0]
    st.unit_state = (sections["active"] or ["unknown"])[0]
    if settings and per_gpu.enabled(settings):
        per_gpu_state(st, settings, sections["instances"])
    st.unit = (sections["unit"] or [None])[0]
    for line in sections["image"]:
        if line.startswith("digests="):
            st.image_digests = line[len("digests=") :].split()
        elif "|" in line:
            st.image, _, image_id = line.partition("|")
            st.image_id = image_id if image_id.startswith("sha256:") else None
    wanted = (sections["wanted_image"] or [None])[0]
    st.wanted_image_id = wanted if wanted and wanted.startswith("sha256:") else None
    rel = (sections["release"] or [None])[0]
    st.release = rel.rstrip("/").rsplit("/", 1)[-1] if rel else None
    answer = " ".join(sections["models"])
    try:
        index = json.loads(answer) if answer else None
    except ValueError:
        index = None
    if isinstance(index, list) and all(isinstance(m, dict) for m in index):
        for m in index:
            (st.models_ready if m.get("state") == "READY" else st.models_not_ready).append(m.get("name"))
    elif answer or (st.unit_state == "active" and "models" in sections.get(PRINTED, SECTIONS)):
        # a Triton that runs and does not say what it serves
        st.unknown["models"] = (
            f"Triton's repository index answered {answer[:120]!r}"
            if answer
            else "Triton's repository index did not answer"
        )
    try:
        st.last_deploy = json.loads(sections["last"][0]) if sections["last"] else None
    except ValueError:
        st.last_deploy = None
        st.unknown["last deployment"] = f"the last line of history.jsonl is not a record: {sections['last'][0][:120]!r}"
    try:
        st.last_failure = current_failure(sections["failure"], st.last_deploy)
    except ValueError as e:
        st.unknown["last failure"] = str(e)
    found = driver_source.parse_probe(sections["driver_source"])
    st.driver_source = "+".join(found.sources) or None
    st.driver_hold = driver_hold.parse_hold(sections.get("driver_hold") or [])
    if sections["kernel"]:
        ks = boot_kernel.parse(sections["kernel"])
        st.kernel, st.reboot = asdict(ks), ks.summary()
    if sections["kmod"]:
        ms = kernel_module.parse(sections["kmod"])
        st.kernel_module, st.module = asdict(ms), ms.summary()
    return st


def per_gpu_state(st: HostStatus, settings: Settings, lines: list[str]) -> None:
    """The per-GPU instances of ``st`` from the probe's lines; its unit_state "active" when every
    expected one is active and ready, else "<up>/<expected> up"."""
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0].isdigit():
            st.instances.append({"index": int(parts[0]), "state": parts[1], "ready": parts[2] == "200"})
    try:
        st.instances_expected = placement.placement_count(
            settings.get("gpu_count"), st.gpu_recorded, len(st.gpus) or None
        )
    except ValueError as e:
        st.instances_expected = None
        st.unknown["Triton instances"] = str(e)
    up = len(up_instances(st))
    want = st.instances_expected or len(st.instances)
    st.unit_state = "active" if want and up == want and len(st.instances) == want else f"{up}/{want} up"


def up_instances(st: HostStatus) -> list[dict]:
    return [
        i
        for i in st.instances
        if i["state"] == "active"
        and i["ready"]
        and (st.instances_expected is None or i["index"] < st.instances_expected)
    ]


def instance_drift(st: HostStatus) -> list[str]:
    """Per-GPU instances down, missing, or left for GPUs the host no longer has."""
    if st.instances_expected is None:
        return []
    have = {i["index"]: i for i in st.instances}
    out = []
    down = [
        f"GPU {n} ({have[n]['state']}{'' if have[n]['ready'] else ', not ready'})"
        if n in have
        else f"GPU {n} (no unit)"
        for n in range(st.instances_expected)
        if n not in have or not (have[n]["state"] == "active" and have[n]["ready"])
    ]
    if down:
        out.append(
            f"triton {st.instances_expected - len(down)}/{st.instances_expected} instances up; down: {', '.join(down)}"
        )
    extra = sorted(n for n in have if n >= st.instances_expected)
    if extra:
        out.append(f"per-GPU units of GPUs the host does not have: {', '.join(f'GPU {n}' for n in extra)}")
    return out


def current_failure(lines: list[str], last_deploy: dict | None) -> dict | None:
    """The failure report left on the host, when no healthy deployment was recorded after it.
    ValueError when the host keeps one that cannot be read (it is not taken for "no failure")."""
    if not lines:
        return None
    text = " ".join(lines)
    try:
        report = json.loads(text)
    except ValueError:
        report = None
    if not isinstance(report, dict):
        raise ValueError(f"{HOST_RECORD} on the host is not a failure report: {text[:120]!r}")
    if last_deploy and str(last_deploy.get("time", "")) >= str(report.get("time", "")):
        return None
    failure = Failure.from_json(report)
    return {**failure.to_json(), "time": report.get("time", "")}


def intent(fh: roster.FleetHost, st: HostStatus | None = None) -> dict:
    """What the inventory asks of this host: image, model release (its instances placed on the
    GPUs ``st`` found), unit, driver branch, toolkit."""
    want = {
        "image": fh.get("triton_image"),
        "driver_branch": fh.get("nvidia_driver_branch"),
        "toolkit": fh.get("container_toolkit_version"),
        "kernel_module": fh.get("nvidia_kernel_module"),
        "driver_source": fh.get("nvidia_driver_source"),
    }
    try:
        gpus = (
            1
            if per_gpu.enabled(fh)
            else placement.placement_count(
                fh.get("gpu_count"), st.gpu_recorded if st else [], len(st.gpus) if st else None
            )
        )
        _, man, rid = host_repository(fh, gpus=gpus)
        want["release"] = rid
        want["models"] = sorted({p.split("/", 1)[0] for p in man if "/" in p})
    except (ValueError, OSError) as e:  # an unrenderable repository is shown, not fatal here
        want["release_error"] = str(e)
    if per_gpu.enabled(fh):
        try:
            count = placement.placement_count(
                fh.get("gpu_count"), st.gpu_recorded if st else [], len(st.gpus) if st and st.gpus else None
            )
            want["unit"] = units_digest(fh, count)
        except ValueError as e:
            want["unit_error"] = str(e)
        return want
    want["unit"] = unit_digest(render_unit(unit_context(fh)))
    return want


def drift(st: HostStatus, want: dict) -> list[str]:
    out = []
    if not st.reachable:
        return ["unreachable"]
    if st.driver_hold:
        out.append(driver_hold.describe(st.driver_hold))
    if st.last_failure:
        out.append(f"last run failed ({st.last_failure.get('time', '?')}): {st.last_failure.get('short', '')}")
    out += [f"{what} unknown: {why[:160]}" for what, why in st.unknown.items()]
    if st.error:  # nvidia-smi answered with an error: not "no driver", not "no GPU"
        out.append(f"GPUs unknown: {st.error}")
    if st.instances_expected is not None:
        out += instance_drift(st)
    elif st.unit_state != "active":
        out.append(f"triton {st.unit_state}")
    if want.get("unit_error"):
        out.append(f"cannot tell the wanted units: {want['unit_error'][:120]}")
    if want.get("image") and st.image != want["image"]:
        out.append(f"image {st.image or 'none'} (want {want['image']})")
    elif want.get("image") and st.image_id:
        out += image_drift(st, want["image"])
    if want.get("release_error"):
        out.append(f"cannot tell the wanted models: {want['release_error'][:120]}")
    if want.get("release") and st.release != want["release"]:
        out.append(f"models {st.release or 'none'} (want {want['release']})")
    if want.get("unit") and st.unit != want["unit"]:
        out.append("unit differs")
    missing = [m for m in want.get("models", []) if m not in st.models_ready]
    if missing and st.unit_state == "active" and "models" not in st.unknown:
        out.append(f"not ready: {', '.join(missing)}")
    branch = want.get("driver_branch")
    if branch and st.driver and not st.driver.startswith(f"{branch}."):
        out.append(f"driver {st.driver} (want {branch})")
    elif branch and not st.driver and not st.error:
        out.append("no driver")
    source = want.get("driver_source")
    if source and st.driver_source and st.driver_source != source:
        out.append(f"driver source {st.driver_source} (want {source})")
    tk = want.get("toolkit")
    if tk and st.toolkit != tk:
        out.append(f"toolkit {st.toolkit or 'none'} (want {tk})")
    out += module_drift(st, want)
    k = st.kernel or {}
    if k.get("boot") and k.get("module") == "no" and (k.get("reboot_required") or k.get("boot") != k.get("running")):
        out.append(
            f"{'pending reboot' if k.get('reboot_required') else 'next boot'} into kernel {k['boot']}, which "
            "has no NVIDIA module (the host would come back without its GPU)"
        )
    if st.gpu_expected and (st.gpus or not st.error):
        out += [
            p.split(": ", 1)[1]
            for p in placement.count_problems(
                "GPUs",
                st.gpu_ids or [{"name": g} for g in st.gpus],
                st.gpu_expected,
                st.gpu_recorded,
                st.gpu_expected_from,
            )
        ]
    names = GPU_CLASSES.get(st.gpu_class or "", {}).get("names", [])
    wrong = [g for g in st.gpus if g not in names]
    if names and wrong:
        out.append(f"GPU {wrong[0]} (want {' or '.join(names)})")
    return out


def module_drift(st: HostStatus, want: dict) -> list[str]:
    """The kernel module flavour installed or loaded is not the one asked for (nvidia_kernel_module,
    else NVIDIA's default for the branch the host's driver belongs to)."""
    m = st.kernel_module or {}
    if not (m.get("installed") or m.get("loaded") or m.get("license")):
        return []
    branch = (st.driver or "").split(".")[0] or str(want.get("driver_branch") or "")
    wanted = want.get("kernel_module") or kernel_module.default_flavour(branch)
    state = kernel_module.ModuleState(
        m.get("installed"), m.get("loaded"), m.get("license") or "", m.get("version") or "", m.get("proc") or ""
    )
    problem = state.problem(wanted)
    return [f"kernel module: {problem} (want {wanted})"] if problem else []


def image_drift(st: HostStatus, image: str) -> list[str]:
    """The container was started from the wanted reference; is it still the image that reference
    names? Pinned by digest: the running image must carry that digest (images loaded from an
    archive carry none: their ID is compared). By tag: a tag pulled again since (a moved tag)
    names another image ID than the one the container runs."""
    from ..serving.images import split_image

    name, _, digest = split_image(image)
    short = st.image_id[7:19]
    if digest and st.image_digests:
        if not any(d.partition("@")[2] == digest for d in st.image_digests):
            return [
                f"image {short} is not {name}@{digest[:19]} (its digests: "
                f"{', '.join(d.partition('@')[2][:19] for d in st.image_digests)})"
            ]
        return []
    if st.wanted_image_id and st.wanted_image_id != st.image_id:
        return [
            f"image {image} moved: it names {st.wanted_image_id[7:19]} on the host, the container "
            f"runs {short} (the deploy restarts Triton on it; pin triton_image by digest to stop tags moving)"
        ]
    if not st.wanted_image_id:
        return [f"image {image} is not on the host (the container runs {short})"]
    return []


def probe(fh: roster.FleetHost, with_intent: bool = True, timeout: float = 30) -> HostStatus:
    try:
        _, text = roster.run(fh, command(fh), timeout=timeout)
    except (roster.FleetError, *CONNECTION_ERRORS) as e:  # cannot reach it (a bug is raised, not hidden)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return HostStatus(fh.name, fh.address, fh.gpu_class, reachable=False, error=msg[:160], drift=["unreachable"])
    st = interpret(fh, parse(text))
    if with_intent:
        st.drift = drift(st, intent(fh, st))
    return st
