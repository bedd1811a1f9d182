"""``tritonfleet quarantine``: the receiver that takes failing hosts out of the load balancer
(``serve``), its systemd unit (``unit``), its token (``token``), and the operator's commands
against it (``list``, ``release``, ``hold``). See tritonfleet.fleet.quarantine and docs/operations.md. A
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
from ..inventory import roster
from ..observability.options import alertmanager_url
from ..settings.defaults import quarantine_token_file as DEFAULT_TOKEN_FILE
from .fleet import parse_data

DEFAULT_LISTEN = "127.0.0.1:9095"
DEFAULT_STATE_DIR = ".tritonfleet/quarantine"


def _hosts(inventory: str, data: tuple[str, ...], limit: tuple[str, ...] = ()):
    try:
        return roster.load_inventory(inventory, data=parse_data(data), limit=list(limit) or None)
    except roster.FleetError as e:
        raise UsageError(str(e)) from e


def _url(
    inventory: str, data: tuple[str, ...], url: str | None, token_file: str | None = None, host: str | None = None
) -> tuple[str, str]:
    """The receiver's URL (--url, else quarantine_url) and its token (--token-file, else
    quarantine_token_file); ``host`` must be one of the inventory (UsageError, exit 2)."""
    from ..fleet.quarantine.client import read_token

    hosts = _hosts(inventory, data) if (not url or not token_file or host) else []
    if host is not None and host not in {h.name for h in hosts}:
        raise UsageError(f"{host} is not a host of {inventory}")
    found = url or (hosts[0].get("quarantine_url") if hosts else None)
    if not found:
        raise UsageError(
            f"no quarantine_url in {inventory}'s data: set it in group data (e.g. "
            f'"http://{DEFAULT_LISTEN}") or pass --url'
        )
    path = token_file or (str(hosts[0].get("quarantine_token_file")) if hosts else DEFAULT_TOKEN_FILE)
    return str(found), read_token(path)


TOKEN_HELP = "the receiver's bearer token file (default: quarantine_token_file of the inventory)"


@click.group("quarantine")
def quarantine_cmd() -> None:
    """Hosts taken out of the load balancer by GPU health alerts, within a budget."""


@quarantine_cmd.command("serve")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="ADDRESS:PORT",
    help="Where the webhook and the API listen (every request but /-/healthy needs the token).",
)
@click.option(
    "--state-dir",
    default=DEFAULT_STATE_DIR,
    show_default=True,
    type=click.Path(file_okay=False),
    help="state.json and events.jsonl (every action) live here.",
)
@click.option(
    "--alertmanager",
    default="",
    metavar="HOST:PORT|URL",
    help="Alertmanager (HOST:PORT or http(s)://HOST:PORT): the firing quarantine alerts are read "
    "from its API every round too.",
)
@click.option(
    "--token-file",
    default=None,
    metavar="PATH",
    help="The bearer token every request but /-/healthy must carry, mode 0600 (default: "
    "quarantine_token_file of the inventory; `tritonfleet quarantine token` writes one).",
)
@click.option(
    "--alertmanager-token-file",
    default=None,
    metavar="PATH",
    help="A second token, for Alertmanager's webhook (POST /alerts) only: the audit trail then "
    "names 'alertmanager' and 'operator' apart.",
)
@click.option(
    "--public-read",
    is_flag=True,
    help="GET /v1/quarantine without a token (it names the fleet's hosts and why they are out).",
)
@click.option(
    "--push-secret-file",
    default=None,
    metavar="PATH",
    help="The direct path: the hosts' collectors POST critical Xids to /v1/hosts/HOST/fault, each "
    "with the HMAC of its name under this secret (quarantine_push_secret_file; the telemetry "
    "step gives each host its token).",
)
@click.option(
    "--reboot-deploy",
    default="deploys/reboot.py",
    show_default=True,
    metavar="PATH",
    help="With quarantine_remediate: the deploy file run (pyinfra, one host) to reboot a host whose GPU "
    "fault a reset did not clear; when it is not there, the receiver only says `needs-reboot`.",
)
@click.option("--limit", multiple=True, help="host or group names (globs; repeat or comma-separate)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, as pyinfra's --data")
def serve_cmd(
    inventory: str,
    listen: str,
    state_dir: str,
    alertmanager: str,
    token_file: str | None,
    alertmanager_token_file: str | None,
    public_read: bool,
    push_secret_file: str | None,
    reboot_deploy: str,
    limit: tuple[str, ...],
    data: tuple[str, ...],
) -> None:
    """Run the receiver: Alertmanager's webhook (POST /alerts) in, drains and returns out.

    Runs until stopped (SIGTERM, Ctrl-C), in the operator's repository (its inventory, group data
    and model repository, which the warm inference gate builds its requests from). Refuses to
    start without its token file (missing, empty, or readable by others)."""
    from ..fleet import quarantine
    from ..fleet.quarantine.client import read_token
    from ..fleet.quarantine.remediation import PyinfraRebooter
    from ..fleet.quarantine.server import Caller

    am = alertmanager_url(alertmanager) if alertmanager else ""
    hosts = _hosts(inventory, data, limit)
    callers = [Caller("operator", read_token(token_file or str(hosts[0].get("quarantine_token_file"))))]
    if alertmanager_token_file:
        callers.append(Caller("alertmanager", read_token(alertmanager_token_file), webhook_only=True))
    push_secret = read_token(push_secret_file) if push_secret_file else ""
    rebooter = PyinfraRebooter(
        str(Path(inventory).resolve()),
        str(Path(reboot_deploy).resolve()),
        Path(state_dir).resolve() / "reboots",
        dict(d.split("=", 1) for d in data if "=" in d),
        timeout=float(hosts[0].get("nvidia_reboot_timeout")) + 600,
    )
    rec = quarantine.Receiver(
        hosts, Path(state_dir), alertmanager=am, echo=lambda text: click.echo(text, nl=True), rebooter=rebooter
    )
    with contextlib.suppress(KeyboardInterrupt):
        quarantine.serve(rec, listen, callers, public_read, push_secret)


@quarantine_cmd.command("token")
@click.option(
    "--out",
    "out",
    default=DEFAULT_TOKEN_FILE,
    show_default=True,
    metavar="PATH",
    help="The file to write (replaced if it exists).",
)
def token_cmd(out: str) -> None:
    """Write a new random bearer token for the receiver into a file of mode 0600.

    The receiver (`serve --token-file`), Alertmanager (alertmanager.yml's credentials_file) and the
    operators' commands (quarantine_token_file) read the same file; restart the receiver after a new one."""
    from ..fleet.quarantine.client import write_token

    try:
        path = write_token(out)
    except OSError as e:
        raise UsageError(f"{out}: cannot write the token: {e.strerror}") from e
    click.echo(f"{path}: a new quarantine token (mode 0600)")


@quarantine_cmd.command("unit")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="ADDRESS:PORT")
@click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True)
@click.option("--alertmanager", default="", metavar="HOST:PORT|URL")
@click.option("--token-file", default="", metavar="PATH", help="written into the unit's serve line")
@click.option("--alertmanager-token-file", default="", metavar="PATH", help="written into the unit's serve line")
@click.option("--push-secret-file", default="", metavar="PATH", help="written into the unit's serve line")
@click.option(
    "--user",
    default="",
    help="User= of the unit (default: root; any user who can read the "
    "inventory's SSH key and reach the load balancer's API)",
)
def unit_cmd(
    inventory: str,
    listen: str,
    state_dir: str,
    alertmanager: str,
    token_file: str,
    alertmanager_token_file: str,
    push_secret_file: str,
    user: str,
) -> None:
    """Print a systemd unit that runs `tritonfleet quarantine serve` from this directory.

    tritonfleet quarantine unit inventories/prod.py > /etc/systemd/system/tritonfleet-quarantine.service
    """
    from ..observability.telemetry_units import quarantine_unit

    exe = shutil.which("tritonfleet") or str(Path(sys.executable).with_name("tritonfleet"))
    workdir = os.getcwd()
    args = [
        exe,
        "quarantine",
        "serve",
        str(Path(inventory).resolve()),
        f"--listen={listen}",
        f"--state-dir={(Path(workdir) / state_dir).resolve()}",
    ]
    if alertmanager:
        args.append(f"--alertmanager={alertmanager_url(alertmanager)}")
    if token_file:
        args.append(f"--token-file={Path(token_file).resolve()}")
    if alertmanager_token_file:
        args.append(f"--alertmanager-token-file={Path(alertmanager_token_file).resolve()}")
    if push_secret_file:
        args.append(f"--push-secret-file={Path(push_secret_file).resolve()}")
    click.echo(quarantine_unit(args, workdir, user), nl=False)  # a UnitError ends it in the group (exit 2)


def _table(state: dict) -> str:
    from ..fleet.quarantine.client import latency_note, status_line

    rows = [("HOST", "STATE")]
    rows += [(h, status_line(e) + latency_note(e)) for h, e in state.get("hosts", {}).items()]
    if len(rows) == 1:
        rows.append(("-", "no host is quarantined"))
    width = max(len(r[0]) for r in rows)
    out = [
        f"CIRCUIT BREAKER OPEN for group {g} since {b['open_since']} (more than {b['fraction']:.0%} of its hosts "
        f"faulted within {b['window']:g} s): no host of it is taken out; recovered hosts still return"
        for g, b in (state.get("breaker") or {}).items()
    ]
    out += [f"{r[0].ljust(width)}  {r[1]}" for r in rows]
    budget = state.get("budget") or {}
    if budget:
        out.append("budget: " + ", ".join(f"{g} {b['out']}/{b['limit']} out" for g, b in budget.items()))
    firing = state.get("firing") or []
    if firing:
        out.append("firing quarantine alerts:")
        out += [
            f"  {f['host']}: {f['alert']}: {f['summary']}" + (" (acknowledged)" if f.get("acknowledged") else "")
            for f in firing
        ]
    return "\n".join(out)


@quarantine_cmd.command("list")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--url", default=None, help="the receiver's URL (default: quarantine_url of the inventory)")
@click.option("--token-file", default=None, metavar="PATH", help=TOKEN_HELP)
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE")
@click.option("--events", is_flag=True, help="also the receiver's last actions")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(
    inventory: str, url: str | None, token_file: str | None, data: tuple[str, ...], events: bool, as_json: bool
) -> None:
    """Quarantined hosts (since, why, held), the budget, the firing quarantine alerts."""
    from ..fleet.quarantine.client import fetch_state

    found, token = _url(inventory, data, url, token_file)
    state = fetch_state(found, token=token)
    if as_json:
        click.echo(json.dumps(state, indent=2))
        return
    click.echo(_table(state))
    if events:
        for ev in state.get("events", []):
            click.echo(f"{ev['time']} {ev['host']} {ev['action']}: {ev['text']}")


def _ask(
    inventory: str,
    host: str,
    action: str,
    url: str | None,
    token_file: str | None,
    data: tuple[str, ...],
    reason: str = "",
    force: bool = False,
) -> None:
    from ..fleet.quarantine.client import ask

    found, token = _url(inventory, data, url, token_file, host=host)
    result = ask(found, host, action, reason=reason, by=getpass.getuser(), token=token, force=force)
    click.echo(f"{host}: {result.get('result', '')}")
    sys.exit(0 if result.get("ok") else 1)


@quarantine_cmd.command("release")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.argument("host")
@click.option("--url", default=None, help="the receiver's URL (default: quarantine_url of the inventory)")
@click.option("--token-file", default=None, metavar="PATH", help=TOKEN_HELP)
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE")
def release_cmd(inventory: str, host: str, url: str | None, token_file: str | None, data: tuple[str, ...]) -> None:
    """Return HOST to the load balancer once its warm inference gate passes.

    Its firing quarantine alerts are acknowledged (they count again when they fire anew). Exit
    status 1 when the gate fails: the host stays out, with the gate's finding."""
    _ask(inventory, host, "release", url, token_file, data)


@quarantine_cmd.command("hold")
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.argument("host")
@click.option("--reason", default="", help="why (shown in status; required with --force)")
@click.option("--force", is_flag=True, help="hold it even beyond the group's quarantine budget (recorded)")
@click.option("--url", default=None, help="the receiver's URL (default: quarantine_url of the inventory)")
@click.option("--token-file", default=None, metavar="PATH", help=TOKEN_HELP)
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE")
def hold_cmd(
    inventory: str, host: str, reason: str, force: bool, url: str | None, token_file: str | None, data: tuple[str, ...]
) -> None:
    """Keep HOST out of the load balancer until released (drained now if it serves), within its
    group's quarantine budget (the receiver's hosts and the servers already out in HAProxy);
    --force --reason TEXT holds it beyond the budget, recorded in the audit trail."""
    if force and not reason.strip():
        raise UsageError("hold --force needs --reason TEXT (why the budget is overridden)")
    _ask(inventory, host, "hold", url, token_file, data, reason, force)
