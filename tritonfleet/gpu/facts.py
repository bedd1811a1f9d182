"""What a host's NVIDIA driver reports: GPUs, driver and CUDA versions.

Two layers:

* pure parse functions (``parse_query``, ``parse_summary``) that take the lines ``nvidia-smi``
  printed (stdout and stderr together) and never raise; they are used by the fact below and by
  the GPU verification, which runs ``nvidia-smi`` itself (also inside ``docker run --gpus all``);
* a pyinfra fact whose command never fails: a missing or broken driver is data (``status``),
  not an error that stops the deploy.

``status`` is one of ``ok``, ``no_driver`` (no nvidia-smi), ``no_communication`` (nvidia-smi
cannot talk to the kernel module: not loaded, not built for this kernel, no GPU on the bus),
``version_mismatch`` (the loaded module and the installed library differ: reboot),
``no_gpu`` (driver up, no device), ``error`` (anything else, with the text in ``message``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from pyinfra.api import FactBase

from ..settings.access import Settings
from .placement import RECORD, parse_record, per_gpu_enabled, placement_count

STATUS_OK = "ok"
STATUS_NO_DRIVER = "no_driver"
STATUS_NO_COMMUNICATION = "no_communication"
STATUS_VERSION_MISMATCH = "version_mismatch"
STATUS_NO_GPU = "no_gpu"
STATUS_ERROR = "error"

QUERY_FIELDS = ("index", "name", "uuid", "pci.bus_id", "driver_version", "compute_cap", "memory.total")
# Drivers before R510 have no compute_cap field ("Field "compute_cap" is not a valid field to query.").
QUERY_FIELDS_NO_CC = tuple(f for f in QUERY_FIELDS if f != "compute_cap")


def query_command(fields=QUERY_FIELDS, smi: str = "nvidia-smi") -> str:
    """The nvidia-smi invocation for ``fields`` (one plain command: it also runs in a container);
    ``smi``: the command that asks the driver (nvidia_smi_command, on the host)."""
    return f"{smi} --query-gpu={','.join(fields)} --format=csv,noheader,nounits"


QUERY_COMMAND = query_command(QUERY_FIELDS)
QUERY_COMMAND_NO_CC = query_command(QUERY_FIELDS_NO_CC)

# Compute capability by product name, for drivers whose nvidia-smi cannot report it.
# (NVIDIA's CUDA GPUs table.)  Matched exactly or as a prefix followed by " " or "-".
COMPUTE_CAPABILITY_BY_NAME = {
    "Tesla T4": "7.5",
    "NVIDIA T4": "7.5",
    "NVIDIA L4": "8.9",
    "NVIDIA L40": "8.9",
    "NVIDIA L40S": "8.9",
    "NVIDIA A2": "8.6",
    "NVIDIA A10": "8.6",
    "NVIDIA A10G": "8.6",
    "NVIDIA A16": "8.6",
    "NVIDIA A30": "8.0",
    "NVIDIA A40": "8.6",
    "NVIDIA A100": "8.0",
    "A100": "8.0",
    "NVIDIA H100": "9.0",
    "NVIDIA H200": "9.0",
    "Tesla V100": "7.0",
    "Tesla P100": "6.0",
    "Tesla P40": "6.1",
    "Tesla P4": "6.1",
    "Tesla M60": "5.2",
    "Tesla K80": "3.7",
}


def compute_capability_for(name: str | None) -> str | None:
    """Compute capability of a GPU product name from the table (None if unknown)."""
    if not name:
        return None
    name = name.strip()
    best = None
    for key, cc in COMPUTE_CAPABILITY_BY_NAME.items():
        if name == key or name.startswith(key + " ") or name.startswith(key + "-"):
            if best is None or len(key) > len(best[0]):
                best = (key, cc)
    return best[1] if best else None


@dataclass
class Gpu:
    index: int | None
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    compute_cap: str | None = None
    memory_total_mib: int | None = None
    # "nvidia-smi" when the driver reported it, "name table" when looked up from the name
    compute_cap_source: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class GpuQuery:
    status: str
    gpus: list[Gpu] = field(default_factory=list)
    message: str = ""
    rc: int | None = None
    # the field nvidia-smi refused ("compute_cap" on old drivers): the caller may retry without it
    invalid_field: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK


_NOT_FOUND = re.compile(
    r"nvidia-smi: (command )?not found|nvidia-smi.*(No such file or directory|executable file not found)"
    r"|executable file not found in \$PATH.*nvidia-smi|tritonfleet: nvidia-smi missing",
    re.IGNORECASE,
)
_NO_COMM = re.compile(r"couldn.t communicate with the NVIDIA driver", re.IGNORECASE)
_MISMATCH = re.compile(r"Driver/library version mismatch", re.IGNORECASE)
_NO_DEVICES = re.compile(r"^No devices were found", re.IGNORECASE | re.MULTILINE)
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_NVML_LIB = re.compile(r"NVML library version:\s*(\S+)")
_MARKER = re.compile(r"^(rc|fields)=(.*)$")


def classify(lines) -> tuple[str, str] | None:
    """(status, message) when the output is one of nvidia-smi's known failures, else None."""
    text = "\n".join(line.rstrip() for line in lines if not _MARKER.match(line.strip())).strip()
    if not text:
        return None
    if _NOT_FOUND.search(text):
        return STATUS_NO_DRIVER, "nvidia-smi is not installed (no NVIDIA driver)"
    if _MISMATCH.search(text):
        lib = _NVML_LIB.search(text)
        extra = f" (NVML library {lib.group(1)})" if lib else ""
        return STATUS_VERSION_MISMATCH, (
            f"the loaded NVIDIA kernel module does not match the installed driver library{extra}; "
            "reboot to load the installed driver"
        )
    if _NO_COMM.search(text):
        return STATUS_NO_COMMUNICATION, (
            "nvidia-smi cannot communicate with the NVIDIA driver (kernel module not loaded or "
            "not built for the running kernel, or no NVIDIA GPU on this host)"
        )
    if _NO_DEVICES.search(text):
        return STATUS_NO_GPU, "the NVIDIA driver is loaded but found no GPU"
    return None


def _markers(lines) -> tuple[int | None, tuple[str, ...] | None, list[str]]:
    rc, fields, rest = None, None, []
    for line in lines:
        m = _MARKER.match(line.strip())
        if m and m.group(1) == "rc":
            try:
                rc = int(m.group(2))
            except ValueError:
                rc = None
        elif m and m.group(1) == "fields":
            fields = tuple(f.strip() for f in m.group(2).split(",") if f.strip())
        else:
            rest.append(line)
    return rc, fields, rest


def _value(raw: str) -> str | None:
    v = raw.strip()
    if not v or (v.startswith("[") and v.endswith("]")) or v in ("N/A", "Not Supported"):
        return None
    return v


def _int_value(raw: str) -> int | None:
    v = _value(raw)
    if v is None:
        return None
    m = re.match(r"^(\d+)", v)
    return int(m.group(1)) if m else None


def _is_header(cells: list[str], fields) -> bool:
    return [re.sub(r"\s*\[.*\]$", "", c.strip()) for c in cells] == list(fields)


def parse_query(lines, fields=QUERY_FIELDS) -> GpuQuery:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`` output.

    ``lines`` are stdout+stderr lines; ``rc=N`` / ``fields=a,b`` marker lines (written by the
    fact command) are understood.  Without ``compute_cap`` among the fields it is looked up from
    the GPU name."""
    lines = [line for line in (lines or []) if line is not None]
    rc, marked_fields, rest = _markers(lines)
    fields = tuple(marked_fields or fields)
    known = classify(rest)
    if known:
        return GpuQuery(status=known[0], message=known[1], rc=rc)
    text = "\n".join(rest).strip()
    invalid = _INVALID_FIELD.search(text)
    if invalid:
        return GpuQuery(
            status=STATUS_ERROR,
            rc=rc,
            invalid_field=invalid.group(1),
            message=f"this driver's nvidia-smi cannot query {invalid.group(1)!r}: {invalid.group(0)}",
        )
    rows = [line.strip() for line in rest if line.strip()]
    gpus: list[Gpu] = []
    bad: list[str] = []
    for row in rows:
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != len(fields):
            bad.append(row)
            continue
        if _is_header(cells, fields):
            continue
        values = dict(zip(fields, cells, strict=True))
        name = _value(values.get("name", "")) or ""
        cc = _value(values["compute_cap"]) if "compute_cap" in values else None
        source = "nvidia-smi" if cc else None
        if cc is None:
            cc = compute_capability_for(name)
            source = "name table" if cc else None
        gpus.append(
            Gpu(
                index=_int_value(values["index"]) if "index" in values else len(gpus),
                name=name,
                uuid=_value(values.get("uuid", "")),
                pci_bus_id=_value(values.get("pci.bus_id", "")),
                driver_version=_value(values.get("driver_version", "")),
                compute_cap=cc,
                memory_total_mib=_int_value(values.get("memory.total", "")),
                compute_cap_source=source,
            )
        )
    if bad:
        return GpuQuery(
            status=STATUS_ERROR, gpus=gpus, rc=rc, message="unexpected nvidia-smi output: " + " | ".join(bad)[:500]
        )
    if rc not in (None, 0):
        return GpuQuery(status=STATUS_ERROR, gpus=gpus, rc=rc, message=f"nvidia-smi exited {rc}: {text[:500]}")
    if not gpus:
        return GpuQuery(status=STATUS_NO_GPU, rc=rc, message="nvidia-smi listed no GPU")
    return GpuQuery(status=STATUS_OK, gpus=gpus, rc=rc)


_HEADER = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+(?:Driver|KMD) Version:\s*(?P<driver>\S+)"
    r"(?:\s+CUDA(?: UMD)? Version:\s*(?P<cuda>[^\s|]+))?"
)
_GPU_ROW = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persistence>On|Off)\s*\|\s*"
    r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s+(?P<disp>\S+)\s*\|"
    r"\s*(?P<ecc>.*?)\s*\|\s*$"
)
_MEM_ROW = re.compile(r"(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB")


def parse_summary(lines) -> dict:
    """Driver and CUDA version (and the GPU rows) from the plain ``nvidia-smi`` table.

    Returns {"status", "message", "nvidia_smi_version", "driver_version", "cuda_version",
    "gpus": [{"index", "name", "persistence_mode", "pci_bus_id", "memory_used_mib",
    "memory_total_mib"}]}; versions are None when not shown ("N/A" CUDA included)."""
    lines = [line for line in (lines or []) if line is not None]
    rc, _, rest = _markers(lines)
    out = {
        "status": STATUS_OK,
        "message": "",
        "nvidia_smi_version": None,
        "driver_version": None,
        "cuda_version": None,
        "gpus": [],
    }
    known = classify(rest)
    if known:
        out["status"], out["message"] = known
        return out
    stripped = [line.strip() for line in rest]
    for i, line in enumerate(stripped):
        m = _HEADER.search(line)
        if m and out["driver_version"] is None:
            out["nvidia_smi_version"] = m.group("smi")
            out["driver_version"] = m.group("driver")
            cuda = m.group("cuda")
            out["cuda_version"] = cuda if cuda and cuda != "N/A" else None
            continue
        g = _GPU_ROW.match(line)
        if g:
            gpu = {
                "index": int(g.group("index")),
                "name": g.group("name").strip(),
                "persistence_mode": g.group("persistence"),
                "pci_bus_id": g.group("bus"),
                "memory_used_mib": None,
                "memory_total_mib": None,
            }
            nxt = stripped[i + 1] if i + 1 < len(stripped) else ""
            mm = _MEM_ROW.search(nxt)
            if mm:
                gpu["memory_used_mib"] = int(mm.group("used"))
                gpu["memory_total_mib"] = int(mm.group("total"))
            out["gpus"].append(gpu)
    if out["driver_version"] is None:
        out["status"] = STATUS_ERROR
        text = "\n".join(stripped).strip()
        out["message"] = (
            "no nvidia-smi table in the output" + (f" (exit {rc})" if rc else "") + (f": {text[:300]}" if text else "")
        )
    return out


# --------------------------------------------------------------------------- pyinfra facts


def _no_smi(smi: str) -> str:
    return (
        f"command -v {smi.split()[0]} >/dev/null 2>&1 || "
        "{ echo 'tritonfleet: nvidia-smi missing'; echo rc=127; exit 0; }"
    )


class NvidiaGpus(FactBase):
    """The GPUs nvidia-smi lists, as a ``GpuQuery`` (status, gpus, message).

    Older drivers cannot report compute_cap: the query is repeated without it and the compute
    capability is taken from the product name."""

    def command(self, smi: str = "nvidia-smi") -> str:
        """``smi``: the command that asks the driver (nvidia_smi_command)."""
        return (
            f"{_no_smi(smi)}; out=$({query_command(QUERY_FIELDS, smi)} 2>&1); rc=$?; "
            'case "$out" in *"is not a valid field"*) '
            f"echo fields={','.join(QUERY_FIELDS_NO_CC)}; out=$({query_command(QUERY_FIELDS_NO_CC, smi)} 2>&1); "
            "rc=$?;; esac; "
            'printf "%s\\n" "$out"; echo "rc=$rc"'
        )

    def process(self, output):
        return parse_query(list(output))


class GpuRecord(FactBase):
    """The GPUs the first verified run recorded on the host (tritonfleet.gpu.placement.RECORD), as
    [{index, pci_bus_id, uuid, name}]; [] when there is no record."""

    default = list

    def command(self) -> str:
        return f"cat {RECORD} 2>/dev/null; true"

    def process(self, output):
        return parse_record(output)


def nvidia_gpus_args(settings: Settings) -> dict:
    """The NvidiaGpus fact's arguments for a host: the command that asks the driver
    (nvidia_smi_command)."""
    return {"smi": smi_command(settings)}


def placement_gpus(settings: Settings) -> int:
    """The number of GPUs the current host's instance groups are placed on
    (tritonfleet.gpu.placement.placement_count): gpu_count, else the host's record, else what
    nvidia-smi reports now, else 1. With triton_per_gpu 1: each Triton sees one GPU."""

    if per_gpu_enabled(settings):
        return 1
    return host_gpus(settings)


def host_gpus(settings: Settings) -> int:
    """The number of GPUs the current host has (tritonfleet.gpu.placement.placement_count): gpu_count,
    else the host's record, else what nvidia-smi reports now, else 1. With triton_per_gpu, the
    number of Triton instances."""
    from ..pyinfra_ext import memo

    gpu_count = settings.get("gpu_count")
    if gpu_count not in (None, ""):
        return placement_count(gpu_count, [], None)
    memo.prefetch((GpuRecord, {}), (NvidiaGpus, nvidia_gpus_args(settings)))
    recorded = memo.fact(GpuRecord)
    live = memo.fact(NvidiaGpus, **nvidia_gpus_args(settings))
    return placement_count(None, recorded, len(live.gpus) if live is not None and live.ok else None)


def driver_version_command(smi: str = "nvidia-smi") -> str:
    """The driver version of each GPU, or nvidia-smi's error (the driver step's reboot decision)."""
    return f"{smi} --query-gpu=driver_version --format=csv,noheader 2>&1 || true"


def smi_command(settings: Settings) -> str:
    """The command that asks a host's driver (nvidia_smi_command; "nvidia-smi" when it is empty)."""
    return str(settings.get("nvidia_smi_command") or "nvidia-smi")
