"""What the telemetry step puts on a host: the GPU fault collector (tritonfleet.gpu.telemetry), the
inference probe (tritonfleet.observability.inference_probe), each as its own file run by
``python3`` from a systemd unit, and the units' text.

Pure (no pyinfra): the deploy step (tritonfleet.steps.telemetry), the tests and a check on a real
GPU machine render the same command lines from the same tunables (``settings``: the host's,
tritonfleet.settings.access).
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from .. import resource
from ..gpu.facts import smi_command
from ..gpu.fault_push import MODULE_FILE as PUSH_FILE
from ..gpu.signals import SPEC_FILE
from ..gpu.xids import CATALOG_FILE, MODULE_FILE
from ..settings.access import ConfigError, Settings

#: where the two scripts and the health-signal spec they read live on the host
LIB_DIR = "/usr/local/lib/tritonfleet"
COLLECTOR = f"{LIB_DIR}/gpu_telemetry.py"
PROBE = f"{LIB_DIR}/inference_probe.py"
SIGNALS = f"{LIB_DIR}/{SPEC_FILE}"
#: the collector's Xid ledger (tritonfleet.gpu.xids) and NVIDIA's Xid catalog it reads
XIDS = f"{LIB_DIR}/{MODULE_FILE}"
XID_CATALOG = f"{LIB_DIR}/{CATALOG_FILE}"
#: the collector's direct path to the quarantine receiver (tritonfleet.gpu.fault_push)
PUSH = f"{LIB_DIR}/{PUSH_FILE}"
COLLECTOR_UNIT = "tritonfleet-gpu-telemetry"
PROBE_UNIT = "tritonfleet-inference-probe"
PYTHON = "/usr/bin/python3"
#: systemd command-line words that need no quoting
_PLAIN = re.compile(r"^[A-Za-z0-9_./:=,@+-]+$")


class UnitError(ConfigError):
    """A tunable that cannot go into a unit's command line (a setting the person corrects)."""


def sources() -> dict[str, str]:
    """{path on the host: the file's text}: the modules' own files, as they are (the two scripts,
    tritonfleet.gpu.signals, which both load from their directory, and the collector's
    tritonfleet.gpu.xids with NVIDIA's Xid catalog)."""
    here = Path(__file__).resolve().parent.parent
    return {
        COLLECTOR: (here / "gpu" / "telemetry.py").read_text(),
        PROBE: (here / "observability" / "inference_probe.py").read_text(),
        SIGNALS: (here / "gpu" / "signals.py").read_text(),
        XIDS: (here / "gpu" / "xids.py").read_text(),
        XID_CATALOG: (here / "data" / CATALOG_FILE).read_text(),
        PUSH: (here / "gpu" / "fault_push.py").read_text(),
    }


def systemd_word(arg: str, setting: str) -> str:
    """One word of an ExecStart= line (systemd.service, "Command lines": double quotes keep a word
    with spaces whole; ``$`` and ``%`` are doubled to stay literal)."""
    text = str(arg)
    if any(c in text for c in "\"'\\`;") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise UnitError(
            f"{setting}: {arg!r} has quotes, backslashes, backticks, ';' or control characters "
            "(newlines), which cannot go into a unit's command line (group data)"
        )
    text = text.replace("%", "%%").replace("$", "$$")
    return text if _PLAIN.match(text) else f'"{text}"'


def _seconds(settings: Settings, key: str) -> float:
    v = settings.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise UnitError(f"{key} = {v!r} must be a number of seconds > 0 (group data)")
    return float(v)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def collector_args(settings: Settings, host_name: str = "") -> list[tuple[str, str]]:
    """[(argument, the tunable it comes from)] of the collector's command line."""
    return [
        (PYTHON, ""),
        (COLLECTOR, ""),
        (f"--textfile-dir={settings.get('telemetry_textfile_dir')}", "telemetry_textfile_dir"),
        (f"--nvidia-smi={smi_command(settings)}", "nvidia_smi_command"),
        (f"--kmsg={settings.get('telemetry_kmsg_path')}", "telemetry_kmsg_path"),
        (f"--interval={_num(_seconds(settings, 'telemetry_interval'))}", "telemetry_interval"),
        (f"--timeout={_num(_seconds(settings, 'telemetry_smi_timeout'))}", "telemetry_smi_timeout"),
        *push_args(settings, host_name),
    ]


def push_args(settings: Settings, host_name: str) -> list[tuple[str, str]]:
    """The collector's direct path (``quarantine_push_url``): where it pushes, as whom (the host's
    inventory name), with which token file, and the Xid numbers pushed whatever their action; none
    when it is not set."""
    url = settings.get("quarantine_push_url")
    if not url:
        return []
    if not host_name:
        raise UnitError("quarantine_push_url: the collector's command line needs the host's inventory name")
    xids = ",".join(str(int(x)) for x in settings.get("quarantine_xids") or [])
    return [
        (f"--push-url={url}", "quarantine_push_url"),
        (f"--push-host={host_name}", "host name"),
        (f"--push-token-file={settings.get('quarantine_push_token_path')}", "quarantine_push_token_path"),
        *([(f"--push-xids={xids}", "quarantine_xids")] if xids else []),
    ]


def probe_args(settings: Settings, http_ports: list[int]) -> list[tuple[str, str]]:
    """The probe's command line; ``http_ports``: every Triton instance's HTTP port on the host
    (one, or one per GPU with triton_per_gpu)."""
    bind = settings.get("triton_http_bind")
    addr = bind if bind and bind not in ("0.0.0.0", "::") else "127.0.0.1"
    if ":" in addr:
        addr = f"[{addr}]"
    args = [
        (PYTHON, ""),
        (PROBE, ""),
        (f"--textfile-dir={settings.get('telemetry_textfile_dir')}", "telemetry_textfile_dir"),
    ]
    args += [(f"--triton={int(p)}=http://{addr}:{int(p)}", "triton_http_port") for p in http_ports]
    if settings.get("triton_restricted_apis"):
        args.append((f"--key-file={settings.get('triton_api_key_file')}", "triton_api_key_file"))
    args += [
        (f"--interval={_num(_seconds(settings, 'probe_interval'))}", "probe_interval"),
        (f"--timeout={_num(_seconds(settings, 'probe_timeout'))}", "probe_timeout"),
    ]
    return args


def command_line(args: list[tuple[str, str]]) -> str:
    return " ".join(systemd_word(a, s or "command") for a, s in args)


def _render(template: str, **values) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource("templates"))),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    return env.get_template(template).render(**values)


def collector_unit(settings: Settings, host_name: str = "") -> str:
    return _render(f"{COLLECTOR_UNIT}.service.j2", exec_start=command_line(collector_args(settings, host_name)))


def probe_unit(settings: Settings, http_ports: list[int]) -> str:
    return _render(f"{PROBE_UNIT}.service.j2", exec_start=command_line(probe_args(settings, http_ports)))


def unit_path(name: str) -> str:
    return f"/etc/systemd/system/{name}.service"


def files(settings: Settings, http_ports: list[int], host_name: str = "") -> dict[str, str]:
    """{path on the host: text} of everything the step puts there (scripts, then units)."""
    return {
        **sources(),
        unit_path(COLLECTOR_UNIT): collector_unit(settings, host_name),
        unit_path(PROBE_UNIT): probe_unit(settings, http_ports),
    }


def quarantine_unit(exec_start: list[str], workdir: str, user: str = "") -> str:
    """The receiver's unit (``tritonfleet quarantine unit``)."""
    return _render(
        "tritonfleet-quarantine.service.j2",
        workdir=workdir,
        user=user,
        exec_start=" ".join(systemd_word(a, "command") for a in exec_start),
    )
