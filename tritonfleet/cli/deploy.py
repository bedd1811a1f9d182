"""``tritonfleet deploy``: a deploy over every core of the control machine (tritonfleet.fleet.runner.workers)."""

from __future__ import annotations

import sys

import click

from ..inventory import roster
from .fleet import parse_data


@click.command("deploy")
@click.argument("inventory")
@click.argument("deploy")
@click.option("--limit", multiple=True, help="host or group names (globs; repeat or comma-separate)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, as pyinfra's --data")
@click.option("--dry", is_flag=True, help="show what would change, change nothing (pyinfra --dry)")
@click.option(
    "-y",
    "--yes",
    "yes",
    is_flag=True,
    help="accepted as pyinfra's -y: tritonfleet deploy never asks before it changes hosts",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="pyinfra processes the hosts are spread over (default: fleet_workers, 0 = one per CPU)",
)
def deploy_cmd(
    inventory: str,
    deploy: str,
    limit: tuple[str, ...],
    data: tuple[str, ...],
    dry: bool,
    workers: int | None,
    yes: bool = False,
) -> None:
    """Run DEPLOY on INVENTORY as `pyinfra -y` does, the hosts spread over one pyinfra process per
    CPU (each its own share of the hosts, its own deploy locks), their results merged: one
    summary, the failure report of every failed host. Exit status: the worst of the processes.
    """
    from ..fleet.runner import workers as spread

    values = parse_data(data)
    roster.check_deploy_file(deploy)
    hosts = roster.load_inventory(inventory, data=values, limit=list(limit))
    sys.exit(
        spread.deploy(
            inventory,
            deploy,
            [h.name for h in hosts],
            values,
            dry=dry,
            workers=workers,
            settings=hosts[0] if hosts else None,
            echo=lambda m: click.echo(m, err=True),
            limited=bool(limit),
        )
    )
