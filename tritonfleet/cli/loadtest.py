"""``tritonfleet loadtest INVENTORY``: real inference load per host, model and concurrency."""

from __future__ import annotations

import json
import sys

import click

from ..core.errors import UsageError
from ..inventory.roster import disconnect, load_inventory


@click.command("loadtest")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option(
    "--limit",
    multiple=True,
    metavar="HOST|GROUP",
    help="Only these hosts or groups (globs; repeatable or comma-separated).",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help="Only this model (repeatable); default: every model the host has ready.",
)
@click.option(
    "--concurrency",
    default="1,4,16,64",
    show_default=True,
    help="Requests kept in flight, one step each (comma-separated).",
)
@click.option(
    "--duration",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1, max=3600),
    help="Seconds of load per step.",
)
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object: {results: [...], client: {...}, errors: [...]}."
)
@click.option(
    "--plot",
    "plot_file",
    metavar="FILE.png",
    default=None,
    help="Draw throughput and p95 against concurrency into FILE.png (needs matplotlib).",
)
def loadtest_cmd(
    inventory: str,
    limit: tuple[str, ...],
    models: tuple[str, ...],
    concurrency: str,
    duration: float,
    protocol: str,
    as_json: bool,
    plot_file: str | None,
) -> None:
    """Send real inference requests to every host's models and measure them.

    Per host, model and concurrency: requests, errors, throughput (inferences/s), p50/p95/p99
    latency, and Triton's own split of the time (queue vs compute, from its metrics, as deltas
    over the step), plus the load generator's CPU cost per request. Inputs (batch 1) are
    generated from each model's configuration. Hosts are measured one after the other; a
    progress line per second goes to stderr. Exit status 1 when a host could not be measured
    or a request failed.
    """
    from ..observability import loadtest

    try:
        conc = loadtest.parse_concurrency(concurrency)
    except loadtest.LoadTestError as e:
        raise UsageError(str(e)) from None
    hosts = load_inventory(inventory, limit=limit or None)
    runs = []
    try:
        for h in hosts:
            runs.append(loadtest.run_host(h, list(models) or None, conc, duration, protocol, echo=loadtest.stderr_echo))
    finally:
        for h in hosts:
            disconnect(h)
    steps = [s for r in runs for s in r.steps]
    errors = [r.error for r in runs if r.error]
    client = loadtest.client_summary(steps)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "protocol": protocol,
                    "duration_s": duration,
                    "concurrency": conc,
                    "results": [s.as_dict() for s in steps],
                    "client": client,
                    "errors": errors,
                },
                indent=2,
            )
        )
    else:
        click.echo(loadtest.table(steps))
        if client["cpu_ms_per_request"]:
            click.echo(
                f"load generator: {client['cpu_ms_per_request']:.3f} ms CPU per request; one "
                f"core of this machine drives about {client['core_rate']:.0f} requests/s "
                "(CLIENT CPU near 100%: the client, not the server, is the limit)"
            )
    for s in steps:
        if s.errors:
            click.echo(
                f"error: {s.host} {s.model} c={s.concurrency}: {s.errors} request(s) failed, first: {s.first_error}",
                err=True,
            )
    for err in errors:
        click.echo(f"error: {err}", err=True)
    if plot_file and steps:
        loadtest.plot(steps, plot_file, f"tritonfleet loadtest {inventory} ({protocol})")
        click.echo(f"plot: {plot_file}", err=True)
    sys.exit(1 if errors or any(s.errors for s in steps) else 0)
