"""``tritonfleet status`` and ``tritonfleet rollout``: the fleet commands."""

from __future__ import annotations

import json
import math
import sys

import click

from ..core.errors import TritonfleetError
from ..fleet import probe
from ..fleet.pull.origin import PullSite
from ..inventory import roster
from ..pyinfra_ext import compat


def _pyinfra_checked(*features: str) -> None:
    """The pyinfra internals these commands rely on are the checked ones (tritonfleet.pyinfra_ext.compat):
    a changed one is a PyinfraChanged, a TritonfleetError that ends the command (tritonfleet.cli.main)."""
    compat.ensure(*features)


def parse_data(pairs: tuple[str, ...]) -> dict:
    """--data key=value, parsed the way pyinfra parses it (JSON, numbers, booleans)."""
    from pyinfra_cli.util import parse_cli_arg

    if pairs:
        _pyinfra_checked("cli_args")
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected key=value", param_hint="--data")
        out[key] = parse_cli_arg(value)
    return out


def _short_time(rec: dict | None) -> str:
    if not rec:
        return "-"
    return f"{rec.get('time', '?').replace('T', ' ').rstrip('Z')} {rec.get('action', '')}".strip()


def _drift_text(st: probe.HostStatus) -> str:
    """The DRIFT column: an unreachable host says why (the connection's own words), as --json does."""
    if not st.reachable and st.error:
        return "; ".join(f"unreachable: {st.error}" if d == "unreachable" else d for d in st.drift or ["unreachable"])
    return "; ".join(st.drift) if st.drift else "none"


def status_table(rows: list[probe.HostStatus], rollout: dict[str, str] | None = None) -> str:
    """``rollout``: {host: its state in a running rollout} (tritonfleet.fleet.rollout.state); a
    ROLLOUT column when any host has one."""
    head: tuple[str, ...] = (
        "HOST",
        "CLASS",
        "REACH",
        "GPU",
        "DRIVER",
        "SOURCE",
        "TOOLKIT",
        "DOCKER",
        "IMAGE",
        "UNIT",
        "MODELS",
        "RELEASE",
        "LAST DEPLOY",
        "REBOOT",
        "MODULE",
        "DRIFT",
    )
    table: list[tuple[str, ...]] = [head]
    quarantine = any(st.quarantine for st in rows)
    if quarantine:  # only when the receiver reports a host out: the table is otherwise unchanged
        from ..fleet.quarantine.client import status_line

        head = (*head[:-1], "QUARANTINE", head[-1])
        table = [head]
    if rollout:  # only while a rollout runs (or died unfinished): the table is otherwise unchanged
        head = (*head[:-1], "ROLLOUT", head[-1])
        table = [head]
    for st in rows:
        # reported/expected (gpu_count, else the host's GPU record) when something is expected
        count = f"{len(st.gpus)}/{st.gpu_expected}" if st.gpu_expected else str(len(st.gpus))
        gpu = (
            f"{count}x {st.gpus[0]}"
            if st.gpus
            else (f"0/{st.gpu_expected}" if st.gpu_expected else "-")
            if st.reachable
            else ""
        )
        n_models = len(st.models_ready) + len(st.models_not_ready)
        unit = st.unit_state or "-"
        if st.instances_expected is not None:  # one Triton per GPU: instances up/expected
            unit = f"{'active' if unit == 'active' else 'DOWN'} {len(probe.up_instances(st))}/{st.instances_expected}"
        table.append(
            (
                st.host,
                st.gpu_class or "-",
                "yes" if st.reachable else "NO",
                gpu,
                st.driver or "-",
                st.driver_source or "-",
                st.toolkit or "-",
                st.docker or "-",
                (st.image or "-").rsplit("/", 1)[-1],
                unit,
                f"{len(st.models_ready)}/{n_models} ready" if st.reachable else "-",
                st.release or "-",
                _short_time(st.last_deploy),
                st.reboot if st.reachable else "-",
                st.module if st.reachable else "-",
                *([status_line(st.quarantine) if st.quarantine else "-"] if quarantine else []),
                *([rollout.get(st.host, "-")] if rollout else []),
                _drift_text(st),
            )
        )
    widths = [max(len(str(r[i])) for r in table) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + str(r[-1]) for r in table
    )


class Percent(click.ParamType):
    """A percentage: 5 or 5% (as --batch takes 25%)."""

    name = "percent"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        text = str(value).strip()
        try:
            pct = float(text[:-1] if text.endswith("%") else text)
        except ValueError:
            pct = math.nan
        if not math.isfinite(pct):
            self.fail(f"{value!r} is not a percentage (5 or 5%)", param, ctx)
        return pct


@click.command("status")
@click.argument("inventory")
@click.option("--limit", multiple=True, help="host or group names (globs; repeat or comma-separate)")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, as pyinfra's --data")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per host")
@click.option(
    "--pull",
    "pull_origin",
    default=None,
    metavar="ORIGIN",
    help="self-converging hosts: their reports on this origin directory (no SSH)",
)
def status_cmd(
    inventory: str, limit: tuple[str, ...], data: tuple[str, ...], as_json: bool, pull_origin: str | None
) -> None:
    """One row a host: reachable, GPUs, driver, toolkit, Docker, Triton image, unit, models ready,
    live release, last deploy, and drift from what the inventory asks for.

    Read-only. Exit status 0 when every host is reachable and matches the inventory (and the
    quarantine receiver of quarantine_url, when set, answers with its token), 1 otherwise.
    """
    hosts = roster.load_inventory(inventory, data=parse_data(data), limit=list(limit))
    if pull_origin:  # pull mode (tritonfleet.fleet.pull.status): what each host reported, read from the origin
        sys.exit(pull_status(hosts, pull_origin, as_json))
    from ..fleet.runner import workers  # the hosts spread over worker processes (fleet_workers)

    rows = workers.parallel(hosts, probe.probe)
    for h in hosts:
        roster.disconnect(h)
    receiver_ok = add_quarantine(hosts, rows)
    from ..fleet.rollout import state

    rollout = state.host_column()  # the hosts' states in a running rollout (its state file)
    if as_json:
        click.echo(json.dumps([{**r.to_json(), "rollout": rollout.get(r.host)} for r in rows], indent=2))
    else:
        click.echo(status_table(rows, rollout))
        for r in rows:  # the full report of a run that failed on the host (and nothing healthy since)
            if r.last_failure:
                click.echo(f"\n{r.last_failure['text']}")
    sys.exit(0 if receiver_ok and all(r.reachable and not r.drift for r in rows) else 1)


def pull_status(hosts: list, origin_dir: str, as_json: bool) -> int:
    """`tritonfleet status --pull ORIGIN`: the hosts' own reports (no SSH). Exit status 0 when
    every host ran its desired release successfully and recently."""
    from ..fleet.pull.reports import short
    from ..fleet.pull.status import status

    rows = status(hosts, PullSite(origin_dir))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        table = [("HOST", "DESIRED", "RUNS", "RESULT", "LAST RUN", "DRIFT")]
        for r in rows:
            age = "-" if r["age_seconds"] is None else f"{r['finished']} ({r['age_seconds'] // 60} min ago)"
            table.append(
                (
                    r["host"],
                    short(r["desired"]),
                    short(r["release"]),
                    r["result"] or "-",
                    age,
                    "; ".join(r["drift"]) or "none",
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
        for row in table:
            click.echo("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)) + "  " + row[-1])
    return 0 if all(not r["drift"] for r in rows) else 1


def add_quarantine(hosts: list[roster.FleetHost], rows: list[probe.HostStatus]) -> bool:
    """Hosts the quarantine receiver (quarantine_url) holds out of the load balancer: their row's
    quarantine and a drift line (a host out of service is not as the inventory wants it). False
    (status exits 1) when the receiver cannot be read: not reached, or its token refused or unreadable."""
    from ..fleet.quarantine.client import fetch_state, read_token, status_line

    url = hosts[0].get("quarantine_url") if hosts else None
    if not url:
        return True
    try:
        state = fetch_state(str(url), token=read_token(str(hosts[0].get("quarantine_token_file"))))
    except TritonfleetError as e:
        click.echo(f"error: {e}", err=True)
        return False
    for st in rows:
        entry = (state.get("hosts") or {}).get(st.host)
        if entry:
            st.quarantine = entry
            st.drift.append(status_line(entry))
    return True


@click.command("rollout")
@click.argument("inventory", required=False)
@click.argument("deploy", required=False)
@click.option("--limit", multiple=True, help="host or group names (globs; repeat or comma-separate)")
@click.option(
    "--canary",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="hosts deployed first, as a batch of their own",
)
@click.option("--batch", default="25%", show_default=True, help="batch size after the canary: N hosts or P%")
@click.option(
    "--max-fail",
    default="0",
    show_default=True,
    metavar="N|P%",
    help="failed hosts tolerated before the rollout halts: N hosts or P% of the targets (rounded down)",
)
@click.option(
    "--dry",
    is_flag=True,
    help="probe and plan only (pyinfra --dry on every reachable target): print the batches and what "
    "would change, change nothing; exit status 0 when the plan is clean",
)
@click.option(
    "--gate-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="seconds each host has to pass the health gate after its batch (default: health_timeout)",
)
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="override data, passed to pyinfra")
@click.option(
    "--perf-gate",
    is_flag=True,
    help="measure a short fixed load on each canary before and after its update (perf_gate_* "
    "tunables); a throughput drop or p95 rise beyond them rolls the canary back and halts",
)
@click.option(
    "--stage",
    is_flag=True,
    help="before the first batch, fetch the new image and model release onto every target "
    "(deploys/stage.py: nothing restarts); a host that cannot stage is left out",
)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option(
    "--resume",
    is_flag=True,
    help="go on with a rollout whose control process died, from its journal (the newest "
    "unfinished one under .tritonfleet/rollouts/, or --journal)",
)
@click.option(
    "--journal",
    "journal",
    default=None,
    metavar="PATH",
    help="with --resume: the rollout's journal (or its log directory)",
)
@click.option(
    "--roll-back",
    "roll_back",
    is_flag=True,
    help="with --resume: roll every host the rollout reached back to what it served before",
)
@click.option(
    "--canary-weight",
    "canary_weight",
    type=Percent(),
    default=None,
    metavar="PERCENT",
    help="traffic canary: HAProxy's weights give the canary hosts PERCENT of their backend's traffic while "
    "Prometheus figures are compared with the other hosts' (canary_* tunables); promote, extend or "
    "roll back",
)
@click.option(
    "--pause",
    "pause",
    is_flag=True,
    help="hold the running rollout (the newest, or --journal) before its next batch or canary verdict",
)
@click.option("--continue", "unpause", is_flag=True, help="let a paused rollout go on")
@click.option(
    "--release-holds",
    "release_holds",
    is_flag=True,
    help="remove the driver holds of the targets first (a failed driver change's hold: "
    "`tritonfleet status` shows it), so this rollout may move their driver again",
)
def rollout_cmd(
    inventory: str | None,
    deploy: str | None,
    limit: tuple[str, ...],
    canary: int,
    batch: str,
    max_fail: str,
    dry: bool,
    gate_timeout: float | None,
    data: tuple[str, ...],
    perf_gate: bool,
    stage: bool,
    as_json: bool,
    resume: bool,
    journal: str | None,
    roll_back: bool,
    canary_weight: float | None = None,
    pause: bool = False,
    unpause: bool = False,
    release_holds: bool = False,
) -> None:
    """Roll DEPLOY out over INVENTORY: canary first, then batches in inventory order, each gated on
    health. A failed host is rolled back to what it served before; more failures than --max-fail
    halt the rollout, leaving the hosts not reached yet untouched.

    The rollout writes a journal as it goes (.tritonfleet/rollouts/<time>/journal.jsonl); its
    pyinfra runs die with it. After a crash, `tritonfleet rollout --resume` runs the cut batch
    again and goes on, or with --roll-back returns every host it reached to what it served before.

    A change of nvidia_driver_branch (or container_toolkit_version) runs a CUDA kernel on every GPU
    of each host it moved after its batch; a host that fails goes back to its branch and is held
    there (--release-holds lets a later rollout try again).

    Behind HAProxy, rollout_max_unavailable / rollout_min_available hold a batch until the backend
    can spare it; --canary-weight gives the canary a share of the traffic and judges it from
    Prometheus (docs/fleet-operations.md). Each host's state is in `tritonfleet status` while the
    rollout runs; `tritonfleet rollout --pause` holds it before its next batch, `--continue` goes on.

    Exit status: 0 when every host ends on the new version; 1 on any failure, rollback or halt.
    """
    from ..fleet.rollout import RolloutError, exit_status, rollout, table
    from ..fleet.rollout import resume as resume_rollout

    echo = (lambda msg: click.echo(msg, err=True)) if as_json else click.echo
    if pause or unpause:  # a running rollout's pause file (tritonfleet.fleet.rollout.state)
        from ..fleet.rollout import state

        if pause and unpause or inventory or deploy or resume:
            raise RolloutError("--pause and --continue take no INVENTORY, DEPLOY or --resume (only --journal)")
        click.echo(state.pause(journal) if pause else state.unpause(journal))
        return
    _pyinfra_checked("rollout_json")
    if resume:
        if dry:
            raise RolloutError("--dry plans a new rollout: it does not go with --resume")
        if inventory or deploy or limit or data:
            raise RolloutError("--resume takes everything from the journal: no INVENTORY, DEPLOY, --limit or --data")
        report = resume_rollout(journal, roll_back=roll_back, echo=echo)
    else:
        if roll_back or journal:
            raise RolloutError("--roll-back and --journal go with --resume")
        if not inventory or not deploy:
            raise RolloutError("INVENTORY and DEPLOY are required (or --resume)")
        report = rollout(
            inventory,
            deploy,
            limit=list(limit),
            canary=canary,
            batch=batch,
            max_fail=max_fail,
            data=parse_data(data),
            gate_timeout=gate_timeout,
            echo=echo,
            perf_gate=perf_gate,
            stage=stage,
            canary_weight=canary_weight,
            plan_only=dry,
            release_holds=release_holds,
        )
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(table(report))
    sys.exit(exit_status(report, plan_only=dry))
