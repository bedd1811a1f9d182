"""The rows every check of `tritonfleet check` returns, what the checks are given (:class:`Wiring`),
the inventory's own check, and the helpers the others share."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import TritonfleetError
from ...inventory.roster import FleetHost

OK, WARN, FAIL = "ok", "warn", "fail"
#: the quarantine receiver's bearer token, where the tunable quarantine_token_file is not set
DEFAULT_TOKEN_FILE = "/etc/tritonfleet/quarantine.token"
GROUP_DATA = "inventories/group_data/all.py"


@dataclass(frozen=True)
class Row:
    """One finding: ``status`` ok / warn / fail, the ``check`` it belongs to, ``what`` was found
    and the ``fix`` ("" when there is nothing to do)."""

    status: str
    check: str
    what: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Wiring:
    """What `tritonfleet check` was given: the loaded hosts (None: the inventory did not load,
    ``load_rows`` say why) and the paths the inventory does not know."""

    inventory: str
    hosts: list[FleetHost] | None
    load_rows: list[Row] = field(default_factory=list)
    pull_origin: Path | None = None
    sign_key: Path | None = None
    prometheus_dir: Path | None = None
    timeout: float = 5.0
    bootstrap_dir: Path | None = None  # what `tritonfleet bootstrap --out DIR` wrote: the hosts' signers


def hosts_text(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")


def grouped(check: str, found: list[tuple[str, str, str, str]]) -> list[Row]:
    """Rows of per-host findings ``(host, status, what, fix)``: hosts with the same finding on
    one row (``what (hosts: a, b)``), in the order first found."""
    by: dict[tuple[str, str, str], list[str]] = {}
    for host, status, what, fix in found:
        by.setdefault((status, what, fix), []).append(host)
    return [
        Row(status, check, f"{what} (hosts: {hosts_text(names)})", fix) for (status, what, fix), names in by.items()
    ]


def distinct(hosts: list[FleetHost], key: Callable[[FleetHost], Any]) -> dict[Any, list[FleetHost]]:
    """{each true value of ``key``: the hosts with it}."""
    out: dict[Any, list[FleetHost]] = {}
    for h in hosts:
        if value := key(h):
            out.setdefault(value, []).append(h)
    return out


def http_get(
    url: str, timeout: float, headers: dict[str, str] | None = None, method: str = "GET", limit: int = 2000
) -> tuple[int | None, str]:
    """(HTTP status, body's start) of a request to ``url`` with no proxy; (None, why) when
    nothing answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        req = urllib.request.Request(url, headers=headers or {}, method=method)
        with opener.open(req, timeout=timeout) as r:
            return r.status, r.read(limit).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(limit).decode(errors="replace")
    except (OSError, ValueError) as e:
        return None, str(getattr(e, "reason", e))


# --------------------------------------------------------------------------- inventory


def inventory_rows(w: Wiring) -> list[Row]:
    """The inventory and every setting load (tritonfleet.inventory.roster, tritonfleet.settings.check):
    one row a refusal, from the loader's own message."""
    if w.hosts is None:
        return w.load_rows
    return [Row(OK, "inventory", f"{w.inventory}: {len(w.hosts)} host(s), every setting accepted")]


def load_rows(inventory: str, error: TritonfleetError) -> list[Row]:
    """The loader's refusal as rows: one a refused setting (the settings check's lines)."""
    lines = str(error).splitlines()
    if len(lines) > 1 and lines[0].startswith("settings refused"):
        return [
            Row(
                FAIL,
                "inventory",
                line.strip(),
                f"change the setting where the line says ({inventory}, its group data or --data)",
            )
            for line in lines[1:]
            if line.strip()
        ]
    return [Row(FAIL, "inventory", str(error), f"fix {inventory} (or its group data) as the message says")]
