"""The driver's Xid reports: the line parsed, NVIDIA's catalog (each Xid's recommended action,
tritonfleet/data/xid_catalog.json) and the ledger that counts them per distinct event.

Standard library only: the telemetry step puts this file on the host as ``gpu_xids.py`` next to
the collector (tritonfleet.gpu.telemetry), with the catalog as ``xid_catalog.json``.

Noise: a failing GPU can log the same line hundreds of thousands of times (NVSentinel's issue
1120: about 800,000 Xid 95 lines on one node, 29 distinct). The ledger remembers each distinct
message text it has seen (bounded: :data:`DISTINCT_LIMIT`, the oldest forgotten first), so a
repeated line costs a dictionary look-up instead of a parse, and is counted, not logged.

Sources: the line's forms are NVIDIA's open kernel modules, src/nvidia/src/kernel/gpu/rc/
kernel_rc.c (``krcReportXid``), and NVIDIA's "Xid Errors" document (the older form without
``PCI:``); the catalog's sources are in the catalog file itself.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

#: the names of this file's and the catalog's copies on the host, next to the collector
MODULE_FILE = "gpu_xids.py"
CATALOG_FILE = "xid_catalog.json"
#: the action of an Xid the catalog does not list (a newer driver's)
UNKNOWN = "UNKNOWN"
#: distinct message texts remembered; past it the oldest is forgotten (seen again, it counts as new)
DISTINCT_LIMIT = 4096
#: what every Xid report contains (a cheap test before the expression)
MARK = "NVRM: Xid"

# The driver's Xid report (kernel_rc.c) and the older form without "PCI:" (NVIDIA's Xid document).
XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
    r"(?: GPU-I:\d+)?(?: GPU-CI:\d+)?\): (?P<xid>\d+)(?:,|$)"
)


@dataclass
class XidEvent:
    pci: str  # domain:bus:device, lower case, as the driver prints it
    xid: int
    text: str  # the whole message
    usec: int = 0  # microseconds since boot (the record's timestamp)


def parse_xid(text: str) -> XidEvent | None:
    """An Xid report in one kernel message (None for any other message)."""
    m = XID.search(text)
    if not m:
        return None
    return XidEvent(m.group("pci").lower(), int(m.group("xid")), text.strip())


@dataclass(frozen=True)
class Catalog:
    """What the collector takes from NVIDIA's catalog: each Xid's immediate action, the Xids a
    later one cancels on the same GPU (``cancels``: canceller -> the Xids it cancels)."""

    actions: dict[int, str]
    cancels: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def action(self, xid: int) -> str:
        return self.actions.get(xid, UNKNOWN)


def catalog_path() -> str:
    """The catalog's copy next to this file's (on a host, as ``gpu_xids.py``), else the package's
    data file."""
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.basename(__file__) == MODULE_FILE:
        return os.path.join(here, CATALOG_FILE)
    return os.path.normpath(os.path.join(here, os.pardir, "data", CATALOG_FILE))


def read_catalog(path: str | None = None) -> dict:
    """The catalog file as it is (tritonfleet/data/xid_catalog.json)."""
    with open(path or catalog_path()) as f:
        return json.load(f)


def load_catalog(path: str | None = None) -> Catalog:
    data = read_catalog(path)
    cancels: dict[int, list[int]] = {}
    for pair in data.get("cancels", []):
        cancels.setdefault(int(pair["cancelled_by"]), []).append(int(pair["xid"]))
    return Catalog({int(r["xid"]): r["action"] for r in data["xids"]}, {k: tuple(v) for k, v in cancels.items()})


NEW, REPEAT = "new", "repeat"


class Ledger:
    """Xid reports per GPU (``pci``) and number: every line counted (``lines``), each distinct
    message text once (``events``), when the last one was logged, and whether the Xid stands
    (False once a later Xid of the catalog's cancelling pairs was reported on the same GPU)."""

    def __init__(self, catalog: Catalog, limit: int = DISTINCT_LIMIT):
        self.catalog, self.limit = catalog, limit
        self.seen: dict[str, tuple[str, int]] = {}  # message text -> (pci, xid), oldest first
        self.lines: dict[tuple[str, int], int] = {}
        self.events: dict[tuple[str, int], int] = {}
        self.last: dict[tuple[str, int], float] = {}
        self.standing: dict[tuple[str, int], bool] = {}
        self.repeats: dict[tuple[str, int], int] = {}  # repeated lines not yet said (collector's log)

    def clear(self) -> None:
        for d in (self.seen, self.lines, self.events, self.last, self.standing, self.repeats):
            d.clear()

    def add(self, text: str, when: float) -> str | None:
        """Count one kernel message logged at ``when`` (seconds since the epoch): NEW for an Xid
        report whose text was not seen before, REPEAT for one that was, None for anything else."""
        key = self.seen.get(text)
        if key is None:
            if MARK not in text:
                return None
            ev = parse_xid(text)
            if ev is None:
                return None
            key = (ev.pci, ev.xid)
            if len(self.seen) >= self.limit:
                del self.seen[next(iter(self.seen))]
            self.seen[text] = key
            self.events[key] = self.events.get(key, 0) + 1
            kind = NEW
        else:
            self.repeats[key] = self.repeats.get(key, 0) + 1
            kind = REPEAT
        self.lines[key] = self.lines.get(key, 0) + 1
        self.last[key] = when
        self.standing[key] = True
        for cancelled in self.catalog.cancels.get(key[1], ()):
            if (key[0], cancelled) in self.standing:
                self.standing[(key[0], cancelled)] = False
        return kind

    def said(self) -> dict[tuple[str, int], int]:
        """The repeated lines counted since the last call (and forget them)."""
        out, self.repeats = self.repeats, {}
        return out

    def rows(self) -> list[tuple[str, int, str, int, int, float, bool]]:
        """(pci, xid, action, lines, events, last, standing) of every GPU and Xid, sorted."""
        return [
            (
                pci,
                xid,
                self.catalog.action(xid),
                n,
                self.events[(pci, xid)],
                self.last[(pci, xid)],
                self.standing[(pci, xid)],
            )
            for (pci, xid), n in sorted(self.lines.items())
        ]
