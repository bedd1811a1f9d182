"""``tritonfleet check INVENTORY``: what an operator wired around the fleet, checked from the
control machine without touching a host (tritonfleet.fleet.wiring)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..core.errors import TritonfleetError, UsageError
from ..inventory import roster
from .fleet import parse_data


@click.command("check")
@click.argument("inventory")
@click.option("--limit", multiple=True, help="host or group names (globs; repeat or comma-separate)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, as pyinfra's --data")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per finding")
@click.option(
    "--pull-origin",
    "pull_origin",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    metavar="DIR",
    help="pull mode's origin directory: its layout, pointers and reports",
)
@click.option(
    "--sign-key",
    "sign_key",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="KEY",
    help="pull mode's signing key (the private half): its .pub and the pointers' signatures",
)
@click.option(
    "--bootstrap-dir",
    "bootstrap_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    metavar="DIR",
    help="with --sign-key: what `tritonfleet bootstrap --out DIR` wrote (the key each host trusts)",
)
@click.option(
    "--prometheus-dir",
    "prometheus_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    metavar="DIR",
    help="the files `tritonfleet prometheus --out DIR` wrote",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="seconds each request or socket may take",
)
def check_cmd(
    inventory: str,
    limit: tuple[str, ...],
    data: tuple[str, ...],
    as_json: bool,
    pull_origin: str | None,
    sign_key: str | None,
    bootstrap_dir: str | None,
    prometheus_dir: str | None,
    timeout: float,
) -> None:
    """Check the wiring around the fleet without touching a host (no SSH): the inventory and its
    settings, the model origin (answers, takes uploads, holds the local release's objects), the
    image mirror, pull mode's origin and signing key (--pull-origin, --sign-key), Prometheus's and
    Alertmanager's files (--prometheus-dir), the quarantine receiver (quarantine_url: answers,
    wants its token) and HAProxy's runtime API. Each finding names what is wrong and the fix.

    The model origin's check uploads one object, the empty file under its own sha256.

    Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed, 2 for bad input
    (the options, or an inventory or setting refused: its rows, then the one-line error).
    """
    from ..fleet import wiring

    if sign_key and not pull_origin:
        raise click.BadParameter("goes with --pull-origin", param_hint="--sign-key")
    if bootstrap_dir and not sign_key:
        raise click.BadParameter("goes with --sign-key", param_hint="--bootstrap-dir")
    overrides = parse_data(data)
    try:
        hosts, load_rows = roster.load_inventory(inventory, data=overrides, limit=list(limit)), []
    except TritonfleetError as e:
        hosts, load_rows = None, wiring.load_rows(inventory, e)
    w = wiring.Wiring(
        inventory,
        hosts,
        load_rows,
        Path(pull_origin) if pull_origin else None,
        Path(sign_key) if sign_key else None,
        Path(prometheus_dir) if prometheus_dir else None,
        timeout,
        Path(bootstrap_dir) if bootstrap_dir else None,
    )
    rows = wiring.run(w)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        click.echo(wiring.table(rows))
    if hosts is None:
        raise UsageError(
            f"{inventory} did not load ({len(load_rows)} refusal(s) above): the checks of the hosts' "
            "settings did not run"
        )
    sys.exit(wiring.exit_status(rows))
