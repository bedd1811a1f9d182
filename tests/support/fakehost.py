"""Run tritonfleet deploy steps against pyinfra's @fake connector and return the commands."""

from __future__ import annotations

import runpy

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops

from tritonfleet import ROOT
from tritonfleet.settings.defaults import DEFAULTS


def defaults(*groups: str) -> dict:
    """The package's defaults under the repository's group data (all, then ``groups``)."""
    data = dict(DEFAULTS)
    for g in ("all", *groups):
        ns = runpy.run_path(str(ROOT / "inventories" / "group_data" / f"{g}.py"))
        data.update({k: v for k, v in ns.items() if not k.startswith("_")})
    return data


# what a fake host answers unless a test says otherwise: Secure Boot off (mokutil answers)
DEFAULT_RESPONSES = {"mokutil --sb-state": "SecureBoot disabled"}


def run_fake(deploy_func, responses: dict, data: dict | None = None, groups=("t4",), yes: bool = False,
             dry: bool = False, **kwargs):
    """``yes``: no change detection before execution (`pyinfra -y`), so each fact is read as often
    as a real run reads it; ``dry``: planned only, nothing executed (`pyinfra --dry`)."""
    responses = {**responses, **{k: v for k, v in DEFAULT_RESPONSES.items() if k not in responses}}
    host_data = {**defaults(*groups), "fake_delay": 0, "fake_delay_jitter": 0,
                 "fake_responses": responses, **(data or {})}
    inventory = Inventory(([("@fake/gpu1", host_data)], {}), **{g: (["@fake/gpu1"], {}) for g in groups})
    host = inventory.get_host("@fake/gpu1")
    state = State(inventory, Config(), check_for_changes=not yes)
    connect_all(state)
    record_uploads(host)
    add_deploy(state, deploy_func, **kwargs)
    if dry:
        return host, host.connector.executed_commands, state
    try:
        run_ops(state)
    except PyinfraError:  # "No hosts remaining": the (only) host failed
        pass
    return host, host.connector.executed_commands, state


def record_uploads(host) -> None:
    """Keep what the fake host is sent: ``host.connector.uploads`` = {remote path: text}."""
    connector = host.connector
    connector.uploads = {}
    put_file = connector.put_file

    def recording_put_file(src, dest, *args, **kwargs):
        if hasattr(src, "read"):
            src.seek(0)  # as pyinfra's get_file_io does (--diff has read it already)
            data = src.read()
            src.seek(0)
        else:
            with open(src, "rb") as f:
                data = f.read()
        connector.uploads[dest] = data.decode() if isinstance(data, bytes) else data
        return put_file(src, dest, *args, **kwargs)

    connector.put_file = recording_put_file
