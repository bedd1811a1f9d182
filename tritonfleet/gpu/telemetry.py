"""GPU fault telemetry on a host: a node exporter textfile collector (runs ON the GPU host).

This file is the collector itself: ``steps/telemetry.py`` copies it to the host as it is and
runs it as ``tritonfleet-gpu-telemetry.service`` (python3, standard library only, Python 3.10+;
of tritonfleet only the metric names, from the health-signal spec tritonfleet.gpu.signals that the
step puts next to it, :func:`_spec`). Every ``interval`` seconds it asks the driver for the health of each GPU
(one ``nvidia-smi --query-gpu`` call, :data:`FIELDS`), it follows the kernel's message buffer for
the driver's Xid reports (``NVRM: Xid ...``), and it writes both into ``<textfile dir>/
tritonfleet-gpu.prom`` (atomically: a temporary file renamed over it), which the node exporter's
textfile collector serves to Prometheus. An Xid is written at once, not at the next interval.

Why a textfile collector and not dcgm-exporter: DCGM is not in Debian's or Ubuntu's archives (it
comes from NVIDIA's CUDA repository, or as the GPU Operator's container), while the node exporter
is (``prometheus-node-exporter``); ``nvidia-smi`` ships with every driver the deploy installs; and
Xids are read from the kernel log, where the driver prints every one, instead of DCGM's field that
holds only the last Xid. An operator who runs dcgm-exporter already keeps it: the rules here read
this collector's series only (docs/operations.md).

Sources of every format read here:

* the driver's fields: ``nvidia-smi --help-query-gpu`` of driver 580 (captured on an H200 in
  tests/fixtures/nvidia-real-h200-580-health/help-query-gpu.txt, with the real answer to exactly
  this query in query-telemetry.txt): "Volatile error counters track the number of errors detected
  since the last driver load. Aggregate error counts persist indefinitely"; unsupported values
  read ``[N/A]`` (the H200 retires no pages, it remaps rows);
* the Xid line: NVIDIA's open kernel modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c
  (``krcReportXid``): ``NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, <message>``, or
  without ``pid=..., name=...`` when no process is known, and on a MIG GPU `` GPU-I:%02u`` (and
  `` GPU-CI:%02u``) inside the parenthesis; older drivers printed ``NVRM: Xid (0000:03:00): 14,
  Channel 00000001`` (NVIDIA's "Xid Errors" document, "Viewing Xid Error Messages");
* the kernel's record format of ``/dev/kmsg``: ``<priority>,<sequence>,<microseconds since
  boot>,<flags>;<text>``, dictionary lines that follow start with a space (the kernel's
  Documentation/ABI/testing/dev-kmsg; real records in tests/fixtures/nvidia-real-h200-580-health/
  kmsg.txt); each read() returns one record, EAGAIN when there is none (O_NONBLOCK), EPIPE when
  records were overwritten before they were read.

Noise: the Xid reports go through a ledger (tritonfleet.gpu.xids, shipped next to this file as
``gpu_xids.py`` with NVIDIA's Xid catalog as ``xid_catalog.json``): a repeated identical line
costs a dictionary look-up and a count, is logged once with a summary of its repeats a minute,
and the reads are bounded, so memory stays flat however many lines a failing GPU logs. Each Xid
series carries the ``action`` NVIDIA's catalog recommends for it, which the health rules select on.

The kernel-message source is a setting (``--kmsg``, tunable ``telemetry_kmsg_path``): the
default is the real ``/dev/kmsg``; a regular file in that format is followed like ``tail -f``
(the test hosts' fault injection writes one, never the machine's kernel log). Counters count
since the source began: for /dev/kmsg, the oldest record the kernel still keeps of this boot.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import os
import re
import select
import shlex
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field


def _sibling(module: str, copy: str, what: str):
    """A stdlib-only module of the package (tritonfleet.gpu.<module>): the package's module; run as
    a script, its ``copy`` next to this file (on the host, where tritonfleet is not installed) or
    the package's file."""
    if __package__:
        return importlib.import_module(f"tritonfleet.gpu.{module}")
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, copy), os.path.join(here, os.pardir, "gpu", f"{module}.py")]
    path = next((p for p in paths if os.path.exists(p)), paths[0])
    spec = importlib.util.spec_from_file_location(copy[:-3], path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        raise ImportError(f"{path}: {what} is missing (the GPU telemetry step puts it there)")
    module_ = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module_  # its dataclasses look their module up
    spec.loader.exec_module(module_)
    return module_


S = _sibling("signals", "gpu_signals.py", "the health-signal spec")
X = _sibling("xids", "gpu_xids.py", "the Xid ledger")
P = _sibling("fault_push", "gpu_fault_push.py", "the direct path to the quarantine receiver")
XID, XidEvent, parse_xid = X.XID, X.XidEvent, X.parse_xid
#: at most this much of a file source, and this many records of /dev/kmsg, in one read
READ_BYTES = 1 << 20
READ_RECORDS = 8192
#: seconds between two log lines that sum up repeated Xid reports
REPEAT_SUMMARY_S = 60.0

TEXTFILE = "tritonfleet-gpu.prom"

# (nvidia-smi field, kind, metric, labels added, help). Exactly the fields of the captured real
# query (tests/fixtures/nvidia-real-h200-580-health/telemetry-fields.txt), in its order.
# kinds: id (a label), num, mhz (x 1e6 -> Hz), mask (0x... hex), flag (Active / Not Active,
# Enabled / Disabled, Yes / No -> 1 / 0)
FIELDS: tuple[tuple[str, str, str, dict, str], ...] = (
    ("index", "id", "", {}, ""),
    ("uuid", "id", "", {}, ""),
    ("pci.bus_id", "id", "", {}, ""),
    ("temperature.gpu", "num", S.TEMPERATURE, {}, "Core GPU temperature (temperature.gpu)."),
    (
        "temperature.memory",
        "num",
        S.MEMORY_TEMPERATURE,
        {},
        "HBM memory temperature (temperature.memory; absent where the GPU does not report it).",
    ),
    ("power.draw", "num", S.POWER_DRAW, {}, "Power draw (power.draw)."),
    ("power.limit", "num", S.POWER_LIMIT, {}, "Software power limit (power.limit)."),
    ("clocks.sm", "mhz", S.SM_CLOCK, {}, "Current SM clock (clocks.sm)."),
    ("clocks.max.sm", "mhz", S.SM_CLOCK_MAX, {}, "Maximum SM clock (clocks.max.sm)."),
    (
        "clocks_event_reasons.active",
        "mask",
        S.CLOCKS_EVENT_REASONS,
        {},
        "Bitmask of active clock event reasons (clocks_event_reasons.active, nvml.h's nvmlClocksEventReason* bits).",
    ),
    (
        "clocks_event_reasons.gpu_idle",
        "flag",
        S.CLOCKS_EVENT_REASON_ACTIVE,
        {"reason": "gpu_idle"},
        "1 while the clock event reason is active (clocks_event_reasons.<reason>).",
    ),
    ("clocks_event_reasons.hw_slowdown", "flag", S.CLOCKS_EVENT_REASON_ACTIVE, {"reason": "hw_slowdown"}, ""),
    (
        "clocks_event_reasons.hw_thermal_slowdown",
        "flag",
        S.CLOCKS_EVENT_REASON_ACTIVE,
        {"reason": "hw_thermal_slowdown"},
        "",
    ),
    (
        "clocks_event_reasons.hw_power_brake_slowdown",
        "flag",
        S.CLOCKS_EVENT_REASON_ACTIVE,
        {"reason": "hw_power_brake_slowdown"},
        "",
    ),
    (
        "clocks_event_reasons.sw_thermal_slowdown",
        "flag",
        S.CLOCKS_EVENT_REASON_ACTIVE,
        {"reason": "sw_thermal_slowdown"},
        "",
    ),
    ("clocks_event_reasons.sw_power_cap", "flag", S.CLOCKS_EVENT_REASON_ACTIVE, {"reason": "sw_power_cap"}, ""),
    (
        "pcie.link.gen.current",
        "num",
        S.PCIE_GENERATION,
        {},
        "Current PCIe link generation (may be reduced while the GPU is idle).",
    ),
    ("pcie.link.gen.max", "num", S.PCIE_GENERATION_MAX, {}, "Highest PCIe link generation of this GPU and system."),
    (
        "pcie.link.width.current",
        "num",
        S.PCIE_WIDTH,
        {},
        "Current PCIe link width (lanes; may be reduced while the GPU is idle).",
    ),
    ("pcie.link.width.max", "num", S.PCIE_WIDTH_MAX, {}, "Widest PCIe link of this GPU and system."),
    ("ecc.mode.current", "flag", S.ECC_MODE, {}, "1 when ECC is on (ecc.mode.current)."),
    (
        "ecc.errors.corrected.volatile.total",
        "num",
        S.ECC_ERRORS,
        {"type": "corrected", "period": "volatile"},
        "ECC errors: volatile since the last driver load, aggregate over the GPU's life "
        "(ecc.errors.<type>.<period>.total).",
    ),
    ("ecc.errors.uncorrected.volatile.total", "num", S.ECC_ERRORS, {"type": "uncorrected", "period": "volatile"}, ""),
    ("ecc.errors.corrected.aggregate.total", "num", S.ECC_ERRORS, {"type": "corrected", "period": "aggregate"}, ""),
    ("ecc.errors.uncorrected.aggregate.total", "num", S.ECC_ERRORS, {"type": "uncorrected", "period": "aggregate"}, ""),
    (
        "retired_pages.single_bit_ecc.count",
        "num",
        S.RETIRED_PAGES,
        {"cause": "single_bit_ecc"},
        "Device memory pages retired (retired_pages.*; GPUs that remap rows retire none).",
    ),
    ("retired_pages.double_bit.count", "num", S.RETIRED_PAGES, {"cause": "double_bit_ecc"}, ""),
    (
        "retired_pages.pending",
        "flag",
        S.RETIRED_PAGES_PENDING,
        {},
        "1 when pages are pending retirement at the next reboot (retired_pages.pending).",
    ),
    (
        "remapped_rows.correctable",
        "num",
        S.REMAPPED_ROWS,
        {"cause": "correctable"},
        "Memory rows remapped (remapped_rows.correctable, remapped_rows.uncorrectable).",
    ),
    ("remapped_rows.uncorrectable", "num", S.REMAPPED_ROWS, {"cause": "uncorrectable"}, ""),
    (
        "remapped_rows.pending",
        "flag",
        S.REMAPPED_ROWS_PENDING,
        {},
        "1 when a row remapping waits for a GPU reset (remapped_rows.pending).",
    ),
    (
        "remapped_rows.failure",
        "flag",
        S.REMAPPED_ROWS_FAILURE,
        {},
        "1 when a row remapping failed in the GPU's life (remapped_rows.failure).",
    ),
)
QUERY = ",".join(f[0] for f in FIELDS)
FLAGS = {"active": 1.0, "not active": 0.0, "enabled": 1.0, "disabled": 0.0, "yes": 1.0, "no": 0.0}
PREFIX = S.GPU_PREFIX

KMSG_RECORD = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),(?P<flags>[^;]*);(?P<text>.*)$")


def query_command(smi: str) -> list[str]:
    """The driver query as argv (``smi``: the tunable nvidia_smi_command, shell words)."""
    return [*shlex.split(smi), f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]


def value(raw: str, kind: str) -> float | None:
    """One field of the csv answer; None for what the GPU does not report (``[N/A]``, ``N/A``,
    ``[Not Supported]``, ``[Unknown Error]``...) or cannot be read as ``kind``."""
    text = raw.strip()
    if not text or text.startswith("[") or text.upper() == "N/A":
        return None
    try:
        if kind == "mask":
            return float(int(text, 16))
        if kind == "flag":
            return FLAGS.get(text.lower())
        number = float(text)
    except ValueError:
        return None
    return number * 1e6 if kind == "mhz" else number


@dataclass
class GpuReading:
    index: str
    uuid: str
    pci_bus_id: str
    values: dict[tuple[str, tuple], float] = field(default_factory=dict)  # (metric, labels) -> value

    @property
    def pci(self) -> str:
        """The bus id as the Xid line prints it: ``00000000:00:06.0`` -> ``0000:00:06``."""
        parts = self.pci_bus_id.split(":")
        if len(parts) != 3:
            return ""
        try:
            return f"{int(parts[0], 16):04x}:{parts[1].lower()}:{parts[2].split('.')[0].lower()}"
        except ValueError:
            return ""


def parse_query(text: str) -> list[GpuReading]:
    """The csv answer (noheader, nounits), one line a GPU. A line with another number of fields
    than :data:`FIELDS` (an error message) raises ValueError with the line."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(", ")]
        if len(parts) != len(FIELDS) or not parts[0].isdigit():
            raise ValueError(f"unexpected nvidia-smi answer: {line.strip()[:300]}")
        gpu = GpuReading(parts[0], parts[1], parts[2])
        for (_field, kind, metric, labels, _), raw in zip(FIELDS, parts, strict=True):
            if kind == "id":
                continue
            v = value(raw, kind)
            if v is not None:
                gpu.values[(metric, tuple(sorted(labels.items())))] = v
        gpus.append(gpu)
    return gpus


# ---- kernel messages ----------------------------------------------------------------------


def parse_kmsg_record(record: str) -> tuple[int, str] | None:
    """(microseconds since boot, message) of one ``/dev/kmsg`` record; its dictionary lines
    (after the first line) are not part of the message. None when it is not a record."""
    first = record.split("\n", 1)[0]
    m = KMSG_RECORD.match(first)
    if not m:
        return None
    return int(m.group("usec")), m.group("text")


class KernelLog:
    """The kernel's messages from ``path``: ``/dev/kmsg`` (a character device: one record per
    read) or a regular file of such records, followed as it grows (a file that shrinks was
    replaced: read again from its start)."""

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None
        self.device = False
        self.offset = 0
        self.pending = b""
        self.error = ""
        self.restarted = False  # the source started over (a replaced file): counts start over too
        self.more = False  # the last read stopped at its bound: more is there now

    def _open(self) -> bool:
        if self.fd is not None:
            return True
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            self.error = f"cannot open {self.path}: {e.strerror}"
            return False
        self.device = stat.S_ISCHR(os.fstat(self.fd).st_mode)
        self.offset, self.pending, self.error = 0, b"", ""
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @property
    def readable(self) -> bool:
        return self.fd is not None and not self.error

    def read(self) -> list[tuple[int, str]]:
        """Every record available now: [(microseconds since boot, message)]."""
        if not self._open() or self.fd is None:
            return []
        return self._read_device() if self.device else self._read_file()

    def _read_device(self) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        self.more = False
        while True:
            if len(out) >= READ_RECORDS:
                self.more = True
                break
            try:
                chunk = os.read(self.fd, 16384)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten before we read them: go on
                    continue
                if e.errno == errno.EAGAIN:
                    break
                self.error = f"reading {self.path}: {e.strerror}"
                self.close()
                break
            if not chunk:
                break
            rec = parse_kmsg_record(chunk.decode("utf-8", "replace"))
            if rec:
                out.append(rec)
        return out

    def _read_file(self) -> list[tuple[int, str]]:
        try:
            size = os.fstat(self.fd).st_size
            current = os.stat(self.path)
        except OSError as e:
            self.error = f"reading {self.path}: {e.strerror}"
            self.close()
            return []
        if current.st_ino != os.fstat(self.fd).st_ino or size < self.offset:
            self.close()  # replaced or truncated: read it again from its start
            self.restarted = True
            if not self._open():
                return []
            size = os.fstat(self.fd).st_size
        if size == self.offset:
            self.more = False
            return []
        data = os.pread(self.fd, min(size - self.offset, READ_BYTES), self.offset)
        self.more = self.offset + len(data) < size
        self.offset += len(data)
        text = self.pending + data
        lines = text.split(b"\n")
        self.pending = lines.pop()  # an unfinished last line waits for its end
        out = []
        for line in lines:
            if line.startswith(b" "):  # a dictionary line of the record before
                continue
            rec = parse_kmsg_record(line.decode("utf-8", "replace"))
            if rec:
                out.append(rec)
        return out

    def wait(self, timeout: float) -> None:
        """Until a record may be there (device: poll) or ``timeout`` seconds (a file is polled)."""
        if self.fd is not None and self.device:
            try:
                select.select([self.fd], [], [], timeout)
                return
            except OSError:
                pass
        time.sleep(min(timeout, 0.25))


def boot_time(proc_stat: str = "/proc/stat") -> float:
    """When the machine booted (``btime`` of /proc/stat, seconds since the epoch)."""
    try:
        with open(proc_stat) as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return time.time() - time.monotonic()


# ---- the textfile ---------------------------------------------------------------------------


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict | tuple) -> str:
    items = sorted(dict(labels).items())
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in items) + "}" if items else ""


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(float(v))


HELP = {f[2]: f[4] for f in FIELDS if f[2] and f[4]}
HELP.update(
    {
        S.GPU_INFO: "One series per GPU the driver reports, with its index, UUID and bus ids (pci: as Xid lines print it).",
        S.GPU_COUNT: "GPUs the driver reports.",
        S.QUERY_SUCCESS: "1 when the last nvidia-smi query answered for every GPU, 0 when it failed.",
        S.QUERY_DURATION: "Seconds the last nvidia-smi query took.",
        S.XID_ERRORS: "Xid reports of the driver in the kernel log since the source began, every line (labels: "
        "pci as printed, xid, action: the immediate action NVIDIA's Xid catalog recommends).",
        S.XID_EVENTS: "Distinct Xid reports (a repeated identical line counts once) since the source began.",
        S.XID_STANDING: "1 while the Xid stands, 0 once a later Xid on the same GPU cancelled it (the catalog's "
        "cancelling pairs).",
        S.XID_LAST: "When the last Xid report of this number was logged (seconds since the epoch).",
        S.KERNEL_LOG_READABLE: "1 while the kernel-message source can be read.",
    }
)
COUNTERS = {S.ECC_ERRORS, S.XID_ERRORS, S.XID_EVENTS}


def render(gpus: list[GpuReading] | None, query_ok: bool, query_seconds: float, xids: list[tuple], log_ok: bool) -> str:
    """The textfile (Prometheus text format 0.0.4). ``gpus`` None: no query answered yet; ``xids``:
    the ledger's rows (tritonfleet.gpu.xids.Ledger.rows)."""
    samples: dict[str, list[tuple[dict, float]]] = {}

    def add(metric: str, labels: dict, v: float) -> None:
        samples.setdefault(metric, []).append((labels, v))

    for g in gpus or []:
        ident = {"gpu": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id}
        add(S.GPU_INFO, {**ident, "pci": g.pci}, 1)
        for (metric, labels), v in sorted(g.values.items()):
            add(metric, {**ident, **dict(labels)}, v)
    if gpus is not None:
        add(S.GPU_COUNT, {}, len(gpus))
    add(S.QUERY_SUCCESS, {}, 1 if query_ok else 0)
    add(S.QUERY_DURATION, {}, round(query_seconds, 3))
    for pci, xid, action, lines, events, last, standing in xids:
        xid_labels = {"pci": pci, "xid": str(xid), "action": action}
        add(S.XID_ERRORS, xid_labels, lines)
        add(S.XID_EVENTS, xid_labels, events)
        add(S.XID_STANDING, xid_labels, 1 if standing else 0)
        add(S.XID_LAST, xid_labels, round(last, 3))
    add(S.KERNEL_LOG_READABLE, {}, 1 if log_ok else 0)
    out = []
    for name, rows in samples.items():
        out.append(f"# HELP {name} {HELP.get(name, name)}")
        out.append(f"# TYPE {name} {'counter' if name in COUNTERS else 'gauge'}")
        out += [f"{name}{_labels(labels)} {_num(v)}" for labels, v in rows]
    return "\n".join(out) + "\n"


def write_atomically(directory: str, name: str, text: str) -> None:
    """Write ``directory/name`` whole or not at all (a temporary file renamed over it): the node
    exporter never reads half a file."""
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(directory, name))


# ---- the collector ------------------------------------------------------------------------


class Collector:
    def __init__(
        self,
        textfile_dir: str,
        smi: str,
        kmsg: str,
        interval: float,
        timeout: float,
        catalog: str | None = None,
        pusher=None,
    ):
        self.pusher = pusher  # a fault_push.Pusher: critical Xids straight to the receiver, or None
        self.textfile_dir, self.smi, self.interval, self.timeout = textfile_dir, smi, interval, timeout
        self.log = KernelLog(kmsg)
        self.btime = boot_time()
        self.gpus: list[GpuReading] | None = None
        self.query_ok, self.query_seconds = False, 0.0
        self.xids = X.Ledger(X.load_catalog(catalog))
        self.summarised = time.monotonic()
        self.lock = threading.Lock()
        self.dirty = threading.Event()

    def query(self) -> None:
        t0 = time.monotonic()
        try:
            res = subprocess.run(
                query_command(self.smi), capture_output=True, text=True, timeout=self.timeout, stdin=subprocess.DEVNULL
            )
            if res.returncode != 0:
                raise ValueError(f"exit {res.returncode}: {(res.stdout + res.stderr).strip()[:300]}")
            gpus, ok = parse_query(res.stdout), True
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            say(f"nvidia-smi query failed: {e}")
            gpus, ok = [], False
        with self.lock:
            self.gpus, self.query_ok, self.query_seconds = gpus, ok, time.monotonic() - t0
        self.dirty.set()

    def read_log(self) -> bool:
        """New kernel messages; True when an Xid count changed (or the source started over)."""
        records = self.log.read()
        changed = False
        if self.log.restarted:
            self.log.restarted = False
            with self.lock:
                self.xids.clear()
            changed = True
        new = []
        with self.lock:  # once a batch: a repeated line costs a look-up and a count
            for usec, text in records:
                kind = self.xids.add(text, self.btime + usec / 1e6)
                if kind is None:
                    continue
                changed = True
                if kind == X.NEW:
                    new.append((text, self.btime + usec / 1e6))
        for text, when in new:
            ev = parse_xid(text)
            action = self.xids.catalog.action(ev.xid)
            if self.pusher is not None:  # before the log line: the direct path waits for nothing
                self.pusher.push(ev.xid, ev.pci, action, when, ev.text)
            say(f"Xid {ev.xid} on {ev.pci} ({action}): {ev.text[:300]}")
        if time.monotonic() - self.summarised >= REPEAT_SUMMARY_S:
            self.summarised = time.monotonic()
            with self.lock:
                repeats = self.xids.said()
            for (pci, xid), n in sorted(repeats.items()):
                say(f"Xid {xid} on {pci}: {n} more identical report(s) in the last {REPEAT_SUMMARY_S:g} s")
        return changed

    def write(self) -> None:
        with self.lock:
            text = render(self.gpus, self.query_ok, self.query_seconds, self.xids.rows(), self.log.readable)
        try:
            write_atomically(self.textfile_dir, TEXTFILE, text)
        except OSError as e:
            say(f"cannot write {os.path.join(self.textfile_dir, TEXTFILE)}: {e}")

    def _query_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            self.query()
            stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def once(self) -> None:
        self.read_log()
        while self.log.more:
            self.read_log()
        self.query()
        self.write()

    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        worker = threading.Thread(target=self._query_loop, args=(stop,), daemon=True)
        worker.start()
        last_error = None
        while not stop.is_set():
            if self.read_log():
                self.dirty.set()
            if self.log.error != last_error:
                last_error = self.log.error
                if last_error:
                    say(last_error)
                self.dirty.set()
            if self.dirty.is_set():
                self.dirty.clear()
                self.write()
            if not self.log.more:
                self.log.wait(0.5)


def say(text: str) -> None:
    print(f"tritonfleet-gpu-telemetry: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="GPU fault telemetry for the node exporter's textfile collector")
    p.add_argument("--textfile-dir", required=True, help="the node exporter's --collector.textfile.directory")
    p.add_argument("--nvidia-smi", default="nvidia-smi", help="the driver's nvidia-smi (shell words)")
    p.add_argument("--kmsg", default="/dev/kmsg", help="kernel-message source: /dev/kmsg or a file of its records")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between driver queries")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a driver query may take")
    p.add_argument("--once", action="store_true", help="read, query and write once, then exit")
    p.add_argument("--push-url", default="", help="the quarantine receiver: critical Xids POSTed there at once")
    p.add_argument("--push-host", default="", help="this host's inventory name (the receiver's)")
    p.add_argument("--push-token-file", default="", help="this host's push token (fault_push.host_token)")
    p.add_argument("--push-xids", default="", help="Xid numbers pushed whatever their action (comma-separated)")
    args = p.parse_args(argv)
    if args.interval <= 0 or args.timeout <= 0:
        p.error("--interval and --timeout must be > 0")
    if not os.path.isdir(args.textfile_dir):
        p.error(f"--textfile-dir {args.textfile_dir} is not a directory")
    pusher = None
    if args.push_url:
        if not args.push_host or not args.push_token_file:
            p.error("--push-url needs --push-host and --push-token-file")
        try:
            token = P.read_token(args.push_token_file)
            extra = {int(x) for x in args.push_xids.split(",") if x.strip()}
        except (OSError, ValueError) as e:
            p.error(f"--push-token-file {args.push_token_file} or --push-xids: {e}")
        pusher = P.Pusher(args.push_url, args.push_host, token, set(S.xid_actions(S.XID_QUARANTINE)), extra, say)
    try:
        c = Collector(args.textfile_dir, args.nvidia_smi, args.kmsg, args.interval, args.timeout, pusher=pusher)
    except (OSError, ValueError, KeyError) as e:
        p.error(
            f"{X.catalog_path()}: cannot read NVIDIA's Xid catalog ({e}); the GPU telemetry step puts "
            f"it next to {X.MODULE_FILE}"
        )
    if args.once:
        c.once()
        return 0 if c.query_ok else 1
    try:
        c.run()
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
