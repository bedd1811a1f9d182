"""``tritonfleet tune INVENTORY [--model M]``: per model, queue vs compute time, batch efficiency,
utilization and the runbook's advice on dynamic batching, from the fleet's live metrics."""

from __future__ import annotations

import fnmatch
import json
import sys

import click

from ..core.errors import UsageError
from ..inventory.roster import disconnect, load_inventory


@click.command("tune")
@click.argument("inventory", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--loadtest",
    "loadtest_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="FILE.json",
    help="Judge a `tritonfleet loadtest --json` run instead of live metrics (INVENTORY, if "
    "given, supplies the hosts' thresholds; else tritonfleet's defaults).",
)
@click.option("--model", "models", multiple=True, metavar="M", help="Only this model (repeatable).")
@click.option(
    "--window",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds between the two reads whose difference is judged; 0: totals since each server started.",
)
@click.option("--per-host", is_flag=True, help="A row per host and model instead of per group.")
@click.option(
    "--limit",
    multiple=True,
    metavar="HOST|GROUP",
    help="Only these hosts or groups (globs; repeatable or comma-separated).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def tune_cmd(
    inventory: str | None,
    loadtest_file: str | None,
    models: tuple[str, ...],
    window: float,
    per_host: bool,
    limit: tuple[str, ...],
    as_json: bool,
) -> None:
    """Read every host's Triton metrics and judge each model's dynamic batching.

    Reports per model mean queue and compute time per request, batch efficiency (inferences
    per execution), the largest batch run, GPU (or, for KIND_CPU models, CPU) utilization and
    advice: lower max_queue_delay_microseconds when queue time dominates at low utilization,
    raise it when batches stay small on a busy GPU, preferred batch sizes never reached.
    Exit status 1 when a host could not be read (the others are still reported).

    With --loadtest FILE.json (the output of `tritonfleet loadtest --json`), the rows are the
    load test's steps (host, model, concurrency) and every advice item cites the figures it used;
    a sweep adds where throughput levels off and which steps were limited by the load generator.
    """
    if loadtest_file:
        _from_loadtest(inventory, loadtest_file, set(models), limit, as_json)
        return
    if not inventory:
        raise click.UsageError("give an INVENTORY (live metrics) or --loadtest FILE.json")

    hosts = load_inventory(inventory, limit=limit or None)
    from ..observability import tune  # after the inventory: pyinfra patches sockets on import

    try:
        reads, seconds = tune.read_fleet(hosts, window, set(models) or None)
        result, errors = tune.rows(reads, seconds, per_host)
    finally:
        for h in hosts:
            disconnect(h)
    missing = set(models) - {r.model for r in result}
    if as_json:
        click.echo(json.dumps({"window_s": seconds, "rows": [r.as_dict() for r in result], "errors": errors}, indent=2))
    else:
        span = f"over {seconds:.1f}s" if seconds else "since each server started"
        click.echo(f"{len(result)} model rows from {len(hosts) - len(errors)} of {len(hosts)} hosts, {span}")
        click.echo(tune.table(result, per_host))
    for e in errors:
        click.echo(
            f"error: {e} (check that this machine reaches the host's Triton ports: "
            "health_host / ssh_hostname, triton_http_port, triton_metrics_port; or set "
            'health_via = "ssh")',
            err=True,
        )
    for m in sorted(missing):
        click.echo(f"warning: model {m} is loaded on none of the hosts read", err=True)
    sys.exit(1 if errors else 0)


def _from_loadtest(inventory: str | None, path: str, models: set[str], limit: tuple[str, ...], as_json: bool) -> None:
    from ..observability import tune

    hint = "give the file `tritonfleet loadtest --json` wrote"
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: {e} ({hint})") from None
    if not isinstance(doc, dict):
        raise UsageError(
            f"{path}: a JSON {type(doc).__name__}, not the object `tritonfleet loadtest --json` writes ({hint})"
        )
    default = tune.default_thresholds()
    by_host: dict[str, tune.Thresholds] = {}
    if inventory:
        by_host = {h.name: tune.Thresholds.of(h) for h in load_inventory(inventory)}
    patterns = [p for item in limit for p in item.split(",") if p]
    if isinstance(doc.get("results"), list):
        doc["results"] = [
            r
            for r in doc["results"]
            if (not models or r.get("model") in models)
            and (not patterns or any(fnmatch.fnmatch(str(r.get("host")), p) for p in patterns))
        ]
    try:
        result = tune.loadtest_rows(doc, f"loadtest {path}", lambda h: by_host.get(h, default))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{path}: {type(e).__name__}: {e} ({hint})") from None
    if as_json:
        click.echo(json.dumps({"source": path, "rows": [r.as_dict() for r in result], "errors": []}, indent=2))
    else:
        click.echo(f"{len(result)} rows from the load test in {path}")
        click.echo(tune.table(result, per_host=True))
