"""`tritonfleet check`: everything an operator wired around the fleet, checked from the control
machine without touching a host (no SSH): the inventory and its settings, the model origin, the
image mirror, pull mode's origin and signing key, Prometheus's and Alertmanager's files, the
quarantine receiver and the load balancer's runtime API.

A check is a function of :class:`Wiring` that returns :class:`Row` s (ok / warn / fail, what it
found, the fix); :data:`CHECKS` is their table, in the order they run and print. Adding a check is
one function and one line there. Read-side only: nothing here imports operations or steps
(tests/unit/test_layers.py), and nothing changes a host. The one write is to the model origin:
the empty object under its own sha256 (content-addressed, so harmless), which proves uploads work.
"""

from __future__ import annotations

from collections.abc import Callable

from ...core.errors import TritonfleetError
from .pull_origin import pull_origin_rows
from .rows import FAIL, OK, WARN, Row, Wiring, inventory_rows, load_rows
from .services import load_balancer_rows, prometheus_rows, quarantine_rows
from .sources import image_mirror_rows, model_origin_rows

__all__ = [
    "CHECKS",
    "FAIL",
    "OK",
    "WARN",
    "Row",
    "Wiring",
    "exit_status",
    "image_mirror_rows",
    "inventory_rows",
    "load_balancer_rows",
    "load_rows",
    "model_origin_rows",
    "prometheus_rows",
    "pull_origin_rows",
    "quarantine_rows",
    "run",
    "table",
]


#: the checks, in the order they run and print: (name, function)
CHECKS: list[tuple[str, Callable[[Wiring], list[Row]]]] = [
    ("inventory", inventory_rows),
    ("model origin", model_origin_rows),
    ("image mirror", image_mirror_rows),
    ("pull origin", pull_origin_rows),
    ("prometheus", prometheus_rows),
    ("quarantine", quarantine_rows),
    ("load balancer", load_balancer_rows),
]


def run(w: Wiring) -> list[Row]:
    """Every check's rows; a check that raises a TritonfleetError is one failed row of its own."""
    rows = []
    for name, fn in CHECKS:
        try:
            rows += fn(w)
        except TritonfleetError as e:
            rows.append(Row(FAIL, name, str(e), "as the message says"))
    return rows


def exit_status(rows: list[Row]) -> int:
    """0: nothing failed (warnings allowed); 1: some check failed."""
    return 1 if any(r.status == FAIL for r in rows) else 0


def table(rows: list[Row]) -> str:
    """One line a row: STATUS  CHECK  what, then the fix indented on the next line."""
    width = max((len(r.check) for r in rows), default=0)
    out = []
    for r in rows:
        out.append(f"{r.status.upper():<4}  {r.check:<{width}}  {r.what}")
        if r.fix and r.status != OK:
            out.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    return "\n".join(out)
