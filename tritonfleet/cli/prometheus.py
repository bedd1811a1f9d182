"""``tritonfleet prometheus INVENTORY [--out DIR]``: Prometheus targets, scrape job, rules and a
Grafana dashboard for every Triton host of the inventory (see tritonfleet.observability.prometheus)."""

from __future__ import annotations

from pathlib import Path

import click

from ..inventory.roster import load_inventory, select


@click.command("prometheus")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    "out",
    default="prometheus",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory to write the files into.",
)
@click.option(
    "--prometheus-dir",
    default=None,
    metavar="PATH",
    help="Where the directory will be on the Prometheus server (paths in the scrape job "
    "and prometheus.yml). Default: the absolute path of --out.",
)
@click.option("--job", default="triton", show_default=True, help="Prometheus job name.")
@click.option(
    "--scrape-interval",
    default="15s",
    show_default=True,
    help="Scrape interval of the job (and rule evaluation in prometheus.yml).",
)
@click.option(
    "--rate-window",
    default="5m",
    show_default=True,
    help="Window of rate() in the recording rules (at least 4 scrape intervals).",
)
@click.option(
    "--limit",
    multiple=True,
    metavar="HOST|GROUP",
    help="Update only these hosts' target entries (globs; repeatable or comma-separated); "
    "every other host's entry stays as it is.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace files in DIR that tritonfleet prometheus did not write (or that were changed "
    "since it wrote them). Without it such files are left alone and nothing is written.",
)
@click.option(
    "--health-interval",
    default="5s",
    show_default=True,
    help="Scrape and rule evaluation interval of GPU health (node exporter textfiles).",
)
@click.option(
    "--alertmanager",
    default="",
    metavar="HOST:PORT|URL",
    help="The Alertmanager Prometheus sends its alerts to (prometheus.yml's alerting section): "
    "HOST:PORT or http(s)://HOST:PORT, as `quarantine serve --alertmanager` takes it.",
)
@click.option(
    "--quarantine-url",
    default="",
    metavar="URL",
    help="The quarantine receiver (tritonfleet quarantine serve) as Alertmanager reaches it: "
    "writes alertmanager.yml routing quarantine alerts to it (needs --alertmanager).",
)
@click.option(
    "--quarantine-token-file",
    default="",
    metavar="PATH",
    help="The receiver's token file as Alertmanager reads it (alertmanager.yml's credentials_file; "
    "default: quarantine_token_file of the inventory).",
)
def prometheus_cmd(
    inventory: str,
    out: str,
    prometheus_dir: str | None,
    job: str,
    scrape_interval: str,
    rate_window: str,
    limit: tuple[str, ...],
    force: bool,
    health_interval: str,
    alertmanager: str,
    quarantine_url: str,
    quarantine_token_file: str,
) -> None:
    """Write Prometheus file_sd targets, the scrape job, recording and alerting rules and a
    Grafana dashboard for the inventory's Triton hosts.

    Targets are each host's health_host (or ssh_hostname) and triton_metrics_port, labelled
    host, gpu_class and group. Regenerate after every inventory change: target files of groups
    that are gone are removed. The command owns only what it wrote (DIR/.tritonfleet-prometheus.json
    records it): a file it did not write is never removed, and never replaced without --force.
    With --limit only the named hosts' target entries change; the rules and the dashboard always
    cover the whole inventory.
    """
    out_dir = Path(out)
    hosts = load_inventory(inventory)
    only = {h.name for h in select(hosts, limit, inventory)} if limit else None
    # after the inventory: pyinfra patches sockets on import
    from ..observability import gpu_health_rules, prometheus

    opts = prometheus.Options(
        job=job,
        scrape_interval=scrape_interval,
        rate_window=rate_window,
        prometheus_dir=prometheus_dir or str(out_dir.resolve()),
        health_interval=health_interval,
        alertmanager=alertmanager,
        quarantine_url=quarantine_url,
        quarantine_token_file=quarantine_token_file or (str(hosts[0].get("quarantine_token_file")) if hosts else ""),
    )
    gen = gpu_health_rules.extend(prometheus.generate(hosts, opts, only), hosts, opts)
    for w in gen.warnings:
        click.echo(f"warning: {w}", err=True)
    done = prometheus.write(gen, out_dir, force=force)
    for rel in done.replaced:
        click.echo(f"replaced {out_dir / rel} (--force: tritonfleet prometheus had not written it)")
    for rel in done.remove:
        click.echo(f"removed {out_dir / rel} (its group is no longer in {inventory})")
    for msg in done.kept:
        click.echo(f"warning: {msg}", err=True)
    groups: dict[str, int] = {}
    for t in gen.targets:
        groups[t.labels.get("group", "ungrouped")] = groups.get(t.labels.get("group", "ungrouped"), 0) + 1
    n_alerts = sum(1 for g in gen.rules["groups"] for r in g["rules"] if "alert" in r)
    n_records = sum(1 for g in gen.rules["groups"] for r in g["rules"] if "record" in r)
    click.echo(
        f"{out_dir}: {len(gen.targets)} targets{' updated' if only is not None else ''} ("
        + ", ".join(f"{g} {n}" for g, n in groups.items())
        + f"), {n_records} recording and {n_alerts} alerting rules, dashboard "
        f"grafana/{job}-fleet.json"
    )
    n_health = sum(1 for f in gen.files if f.startswith("targets/health/"))
    click.echo(
        f"  GPU health: job {job}-health ({n_health} target file(s) under targets/health/), "
        f"{len((gen.health_rules or {}).get('rules', []))} alerting rules every {health_interval}"
        + (", alertmanager.yml" if quarantine_url else "")
    )
    for t in gen.targets:
        labels = " ".join(f"{k}={v}" for k, v in t.labels.items())
        click.echo(f"  {t.target:<24} {labels}")
