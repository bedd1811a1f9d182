"""``tritonfleet bootstrap``, ``tritonfleet pull publish|rollout`` (the control side of pull mode)
and ``tritonfleet converge`` (a self-converging host's own run, started by its timer)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..core.errors import UsageError
from ..fleet.pull.origin import INCLUDE, SIGNERS_DOC, PullSite
from ..inventory import roster
from .fleet import parse_data

ORIGIN_HELP = "the origin directory (served to the hosts over HTTP(S))"


@click.command("bootstrap")
@click.argument("inventory")
@click.option("--origin", "origin_dir", required=True, help=ORIGIN_HELP)
@click.option("--url", required=True, help="the origin's address as the hosts reach it (http:// or https://)")
@click.option(
    "--out", default="bootstrap", show_default=True, help="where to write <host>/bootstrap.sh and <host>/user-data"
)
@click.option(
    "--wheelhouse",
    required=True,
    type=click.Path(path_type=Path),
    help="wheels of the agent's dependencies (pip download), for the hosts' Python",
)
@click.option(
    "--wheel",
    required=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="tritonfleet's wheel, the version this machine runs (in a checkout: pip wheel --no-deps -w dist .)",
)
@click.option(
    "--sign-key",
    type=click.Path(path_type=Path),
    help="the key whose signed release pointers the hosts follow: its public half (key.pub) is enough "
    "here, the private key works too (or --release)",
)
@click.option("--release", help="pin the hosts to this release (sha256) instead of following pointers")
@click.option(
    "--reports", "reports_url", default=None, help="where hosts PUT their reports (default: <url>/reports; '' for none)"
)
@click.option("--limit", multiple=True, help="host or group names (globs; repeat or comma-separate)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, as pyinfra's --data")
@click.option("--rekey", is_flag=True, help="make new report keys for the hosts (default: keep those in --out)")
def bootstrap_cmd(
    inventory, origin_dir, url, out, wheelhouse, wheel, sign_key, release, reports_url, limit, data, rekey
) -> None:
    """Hosts that converge themselves: publish the pinned agent on the origin, and write for every
    host of INVENTORY a plain script and cloud-init user-data that install it, write the host's
    pull configuration and start its systemd timer. The host then needs no command from here.
    """
    from ..fleet.pull import bootstrap

    written = bootstrap.bootstrap(
        inventory,
        PullSite(origin_dir, url),
        url,
        Path(out),
        wheelhouse=wheelhouse,
        wheel=wheel,
        key=sign_key,
        release=release,
        reports_url=reports_url,
        limit=list(limit),
        data=parse_data(data),
        rekey=rekey,
        echo=lambda m: click.echo(m, err=True),
    )
    click.echo(
        f"bootstrap for {len(written)} host(s) in {out}/<host>/: bootstrap.sh (run as root) and user-data (cloud-init)"
    )


@click.group("pull")
def pull_group() -> None:
    """Pull mode: publish releases the hosts converge to themselves, and roll them out."""


@pull_group.command("publish")
@click.argument("inventory")
@click.argument("deploy")
@click.option("--origin", "origin_dir", required=True, help=ORIGIN_HELP)
@click.option(
    "--sign-key",
    type=click.Path(path_type=Path),
    help="sign pointers for the hosts (else: release only): the private key, or key.pub with the private "
    "key in ssh-agent",
)
@click.option("--include", multiple=True, help="repository paths the release holds (default: deploys, files)")
@click.option("--limit", multiple=True, help="the hosts to point at the release (a wave; default: all)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, as pyinfra's --data")
def publish_cmd(inventory, deploy, origin_dir, sign_key, include, limit, data) -> None:
    """Publish the current directory's repository as a release; with --sign-key, point the hosts
    (--limit: a wave of them) at it, without waiting for them. Prints the release id."""
    from ..fleet.pull.release import host_entries, publish_release
    from ..fleet.pull.signing import check_sign_key, publish_desired

    origin = PullSite(origin_dir)
    roster.check_deploy_file(deploy)
    if sign_key:
        check_sign_key(sign_key)
    hosts = roster.load_inventory(inventory, data=parse_data(data), limit=list(limit))
    with origin.lock("pull publish"):
        sha = publish_release(origin, hosts, deploy, Path.cwd(), tuple(include) or INCLUDE)
        if sign_key:
            entries, _ = host_entries(hosts, Path.cwd())
            gen = publish_desired(
                origin,
                sign_key,
                {h.name: sha for h in hosts},
                f"publish-{sha[:8]}",
                entries,
                float(hosts[0].get("pull_pointer_ttl")) if hosts else None,
            )
            click.echo(f"pointed {len(hosts)} host(s) at it (generation {gen})", err=True)
    click.echo(sha)


@pull_group.command("rollout")
@click.argument("inventory")
@click.argument("deploy")
@click.option("--origin", "origin_dir", required=True, help=ORIGIN_HELP)
@click.option(
    "--sign-key",
    required=True,
    type=click.Path(path_type=Path),
    help="the key the hosts trust: the private key, or key.pub with the private key in ssh-agent",
)
@click.option("--include", multiple=True, help="repository paths the release holds (default: deploys, files)")
@click.option("--limit", multiple=True, help="host or group names (globs; repeat or comma-separate)")
@click.option("--canary", default=1, show_default=True, help="hosts moved first, as a batch of their own")
@click.option("--batch", default="25%", show_default=True, help="batch size after the canary: N hosts or P%")
@click.option(
    "--max-fail",
    default="0",
    show_default=True,
    metavar="N|P%",
    help="failed hosts tolerated before the rollout halts: N hosts or P% of the targets (rounded down)",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="seconds a batch's hosts have to report the new release (default: pull_report_timeout)",
)
@click.option("--poll", type=float, default=1.0, show_default=True, help="seconds between looks at the reports")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, as pyinfra's --data")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def pull_rollout_cmd(
    inventory, deploy, origin_dir, sign_key, include, limit, canary, batch, max_fail, timeout, poll, data, as_json
) -> None:
    """Roll the current directory's repository out to self-converging hosts: canary first, then
    batches, each published and awaited through the hosts' reports; a failed host goes back to
    the release it ran, more failures than --max-fail halt the rollout.

    Exit status: 0 when every host ends on the new release; 1 on any failure, rollback or halt.
    """
    from ..fleet.pull.rollout import rollout
    from ..fleet.rollout.report import exit_status, table

    echo = (lambda msg: click.echo(msg, err=True)) if as_json else click.echo
    report = rollout(
        inventory,
        deploy,
        PullSite(origin_dir),
        sign_key,
        limit=list(limit),
        canary=canary,
        batch=batch,
        max_fail=max_fail,
        data=parse_data(data),
        timeout=timeout,
        include=tuple(include) or INCLUDE,
        echo=echo,
        poll=poll,
    )
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else table(report))
    sys.exit(exit_status(report))


@pull_group.command("refresh")
@click.option("--origin", "origin_dir", required=True, help=ORIGIN_HELP)
@click.option("--sign-key", required=True, type=click.Path(path_type=Path), help="the key the hosts trust")
@click.option("--ttl", type=float, default=None, help="seconds the new pointers stay valid (default: pull_pointer_ttl)")
def refresh_cmd(origin_dir, sign_key, ttl) -> None:
    """Re-sign every live pointer of the origin (the same release and host data, a new generation
    and expiry): run it from a timer well within pull_pointer_ttl, or the hosts report a stale
    origin and stop following."""
    from ..fleet.pull.signing import refresh

    origin = PullSite(origin_dir)
    with origin.lock("pull refresh"):
        gen, hosts = refresh(origin, sign_key, ttl)
    click.echo(f"re-signed {len(hosts)} pointer(s) (generation {gen})")


@pull_group.command("rotate-key")
@click.option("--origin", "origin_dir", required=True, help=ORIGIN_HELP)
@click.option(
    "--sign-key",
    required=True,
    type=click.Path(path_type=Path),
    help="a key the hosts trust now: it signs the new list",
)
@click.option("--new-key", type=click.Path(path_type=Path), help="add this key to the hosts' release signers")
@click.option("--retire", type=click.Path(path_type=Path), help="remove this key from the hosts' release signers")
def rotate_key_cmd(origin_dir, sign_key, new_key, retire) -> None:
    """Change the release signers the hosts trust, with an overlap: --new-key NEW (signed by the
    old key: both verify), then pointers signed by NEW (pull refresh --sign-key NEW), then
    --retire OLD (signed by NEW). Each host installs the list on its next converge."""
    from ..fleet.pull.signing import rotate_key

    if not new_key and not retire:
        raise UsageError("give --new-key (add a signer) or --retire (remove one)")
    origin = PullSite(origin_dir)
    with origin.lock("pull rotate-key"):
        doc = rotate_key(origin, sign_key, new_key, retire)
    click.echo(f"signers generation {doc['generation']}: {len(doc['keys'])} key(s) published in {SIGNERS_DOC}")


@click.command("converge")
@click.option(
    "--config",
    "config_path",
    default=None,
    type=click.Path(path_type=Path),
    help="this host's pull configuration (default /etc/tritonfleet/pull.json)",
)
@click.option("--force", is_flag=True, help="run the deploy now even when nothing is due")
@click.option("--install", is_flag=True, help="install and start the systemd timer (the bootstrap's last step)")
@click.option("--state", "show_state", is_flag=True, help="print this host's last converge state (JSON)")
def converge_cmd(config_path, force, install, show_state) -> None:
    """On a self-converging host: converge it to its desired release when a run is due (new
    release or generation, the converge interval, --force), and report the result (state file,
    node exporter textfile, the origin's reports/). Its systemd timer runs this."""
    from ..fleet.pull import bootstrap, host_fetch, host_run

    path = config_path or host_run.CONFIG
    if show_state:
        click.echo(json.dumps(host_fetch.load_state(), indent=1, sort_keys=True))
        return
    cfg = host_run.load_config(path)
    if install:
        bootstrap.install(cfg)
        click.echo(f"{bootstrap.UNIT}.timer enabled; the first run started")
        return
    sys.exit(host_run.converge(path, force=force, echo=click.echo))
