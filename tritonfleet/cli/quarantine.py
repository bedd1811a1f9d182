"""``tritonfleet quarantine``: the receiver that takes failing hosts out of the load balancer
(``serve``), its systemd unit (``unit``), and the operator's commands against it (``list``,
``release``, ``hold``). See tritonfleet.fleet.quarantine and docs/operations.md. A
``TritonfleetError`` ends the command in the group (tritonfleet.cli.main), no traceback."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import sys
from pathlib import Path

import click

from ..core.errors import UsageError

DEFAULT_LISTEN = "127.0.0.1:9095"
DEFAULT_STATE_DIR = ".tritonfleet/quarantine"


def _hosts(inventory: str, data: tuple[str, ...], limit: tuple[str, ...] = ()):
    from ..fleet import inventory as fleet
    from .fleet import _data

    try:
        return fleet.load_inventory(inventory, data=_data(data), limit=list(limit) or None)
    except fleet.FleetError as e:
        raise UsageError(str(e)) from e


def _url(inventory: str, data: tuple[str, ...], url: str | None) -> str:
    if url:
        return url
    hosts = _hosts(inventory, data)
    found = hosts[0].get("quarantine_url") if hosts else None
    if not found:
        raise UsageError(f"no quarantine_url in {inventory}'s data: set it in group data (e.g. "
                         f"\"http://{DEFAULT_LISTEN}\") or pass --url")
    return str(found)


@click.group("quarantine")
def quarantine_cmd() -> None:
    """Hosts taken out of the load balancer by GPU health alerts, within a budget."""


@quarantine_cmd.command("serve")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="ADDRESS:PORT",
              help="Where the webhook and the API listen (whoever reaches it can drain hosts).")
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(file_okay=False),
              help="state.json and events.jsonl (every action) live here.")
@click.option("--alertmanager", default="", metavar="URL",
              help="Alertmanager's URL: the firing quarantine alerts are read from its API every round too.")
@click.option("--limit", multiple=True, help="host or group names (globs; repeat or comma-separate)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, as pyinfra's --data")
def serve_cmd(inventory: str, listen: str, state_dir: str, alertmanager: str, limit: tuple[str, ...],
              data: tuple[str, ...]) -> None:
    """Run the receiver: Alertmanager's webhook (POST /alerts) in, drains and returns out.

    Runs until stopped (SIGTERM, Ctrl-C), in the operator's repository (its inventory, group data
    and model repository, which the warm inference gate builds its requests from)."""
    from ..fleet import quarantine

    rec = quarantine.Receiver(_hosts(inventory, data, limit), Path(state_dir), alertmanager=alertmanager,
                              echo=lambda text: click.echo(text, nl=True))
    with contextlib.suppress(KeyboardInterrupt):
        quarantine.serve(rec, listen)


@quarantine_cmd.command("unit")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="ADDRESS:PORT")
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True)
@click.option("--alertmanager", default="", metavar="URL")
@click.option("--user", default="", help="User= of the unit (default: root; any user who can read the "
                                         "inventory's SSH key and reach the load balancer's API)")
def unit_cmd(inventory: str, listen: str, state_dir: str, alertmanager: str, user: str) -> None:
    """Print a systemd unit that runs `tritonfleet quarantine serve` from this directory.

    tritonfleet quarantine unit inventories/prod.py > /etc/systemd/system/tritonfleet-quarantine.service
    """
    from ..observability.telemetry_units import quarantine_unit

    exe = shutil.which("tritonfleet") or str(Path(sys.executable).with_name("tritonfleet"))
    workdir = os.getcwd()
    args = [exe, "quarantine", "serve", str(Path(inventory).resolve()), f"--listen={listen}",
            f"--state-dir={(Path(workdir) / state_dir).resolve()}"]
    if alertmanager:
        args.append(f"--alertmanager={alertmanager}")
    click.echo(quarantine_unit(args, workdir, user), nl=False)  # a UnitError ends it in the group (exit 2)


def _table(state: dict) -> str:
    from ..fleet.quarantine.client import status_line

    rows = [("HOST", "STATE")]
    rows += [(h, status_line(e)) for h, e in state.get("hosts", {}).items()]
    if len(rows) == 1:
        rows.append(("-", "no host is quarantined"))
    width = max(len(r[0]) for r in rows)
    out = [f"{r[0].ljust(width)}  {r[1]}" for r in rows]
    budget = state.get("budget") or {}
    if budget:
        out.append("budget: " + ", ".join(f"{g} {b['out']}/{b['limit']} out" for g, b in budget.items()))
    firing = state.get("firing") or []
    if firing:
        out.append("firing quarantine alerts:")
        out += [f"  {f['host']}: {f['alert']}: {f['summary']}" + (" (acknowledged)" if f.get("acknowledged") else "")
                for f in firing]
    return "\n".join(out)


@quarantine_cmd.command("list")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--url", default=None, help="the receiver's URL (default: quarantine_url of the inventory)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE")
@click.option("--events", is_flag=True, help="also the receiver's last actions")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(inventory: str, url: str | None, data: tuple[str, ...], events: bool, as_json: bool) -> None:
    """Quarantined hosts (since, why, held), the budget, the firing quarantine alerts."""
    from ..fleet.quarantine.client import fetch_state

    state = fetch_state(_url(inventory, data, url))
    if as_json:
        click.echo(json.dumps(state, indent=2))
        return
    click.echo(_table(state))
    if events:
        for ev in state.get("events", []):
            click.echo(f"{ev['time']} {ev['host']} {ev['action']}: {ev['text']}")


def _ask(inventory: str, host: str, action: str, url: str | None, data: tuple[str, ...], reason: str = "") -> None:
    from ..fleet.quarantine.client import ask

    result = ask(_url(inventory, data, url), host, action, reason=reason, by=getpass.getuser())
    click.echo(f"{host}: {result.get('result', '')}")
    sys.exit(0 if result.get("ok") else 1)


@quarantine_cmd.command("release")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.argument("host")
@click.option("--url", default=None, help="the receiver's URL (default: quarantine_url of the inventory)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE")
def release_cmd(inventory: str, host: str, url: str | None, data: tuple[str, ...]) -> None:
    """Return HOST to the load balancer once its warm inference gate passes.

    Its firing quarantine alerts are acknowledged (they count again when they fire anew). Exit
    status 1 when the gate fails: the host stays out, with the gate's finding."""
    _ask(inventory, host, "release", url, data)


@quarantine_cmd.command("hold")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.argument("host")
@click.option("--reason", default="", help="why (shown in status)")
@click.option("--url", default=None, help="the receiver's URL (default: quarantine_url of the inventory)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE")
def hold_cmd(inventory: str, host: str, reason: str, url: str | None, data: tuple[str, ...]) -> None:
    """Keep HOST out of the load balancer until released (drained now if it serves: outside the
    budget, an operator's decision)."""
    _ask(inventory, host, "hold", url, data, reason)
