"""The ``tritonfleet`` command line: one module a command group (``fleet``: status and rollout;
``validate``, ``check``, ``loadtest``, ``prometheus``, ``tune``, ``quarantine``; ``bootstrap``: bootstrap, pull,
converge; ``deploy``; ``init`` from tritonfleet.cli.scaffold). The modules define their commands and
import nothing from here; ``main`` adds them. Other installed packages add theirs through the
``tritonfleet.commands`` entry point group (the test tooling's ``testbed``).

Errors meant for a person (``tritonfleet.core.errors.TritonfleetError``) become their message and
exit status in one place, :class:`_Commands`: 2 for bad input (arguments, inventory, settings, files),
1 for a run that failed; click's own usage errors exit 2 as well. Anything else is a bug and keeps
its traceback."""

from __future__ import annotations

import importlib.metadata

import click

from .. import __version__
from ..core.errors import TritonfleetError
from ..core.exits import exit_for
from ..core.open_files import raise_nofile
from . import bootstrap, check, deploy, fleet, loadtest, prometheus, quarantine, tune, validate
from .scaffold import init

#: entry point group through which other installed packages add command groups
COMMANDS_GROUP = "tritonfleet.commands"


class _Commands(click.Group):
    """Every command's ``TritonfleetError`` ends it here, in one place: ``tritonfleet <command>:
    <message>`` on stderr and the error's exit status, no traceback (tritonfleet.core.exits)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TritonfleetError as e:
            raise exit_for(e, f"tritonfleet {ctx.invoked_subcommand or ctx.info_name}: ") from None


@click.group(cls=_Commands)
@click.version_option(__version__)
def main() -> None:
    """Take bare NVIDIA GPU hosts to serving Triton, and keep the fleet right."""
    raise_nofile()  # one SSH connection a host: the open-file limit's soft value is often 1024


for _command in (
    loadtest.loadtest_cmd,
    prometheus.prometheus_cmd,
    fleet.rollout_cmd,
    fleet.status_cmd,
    tune.tune_cmd,
    validate.validate_cmd,
    quarantine.quarantine_cmd,
    init,
    bootstrap.bootstrap_cmd,
    bootstrap.pull_group,
    bootstrap.converge_cmd,
    deploy.deploy_cmd,
    check.check_cmd,
):
    main.add_command(_command)


def _add_installed_commands() -> None:
    """The commands other installed packages declare in the ``tritonfleet.commands`` entry point
    group. One whose package is not installed (a declaration left without its package) is left
    out; any other error while loading it is raised, naming it."""
    for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        try:
            command = ep.load()
        except ModuleNotFoundError as e:
            if e.name and ep.module.split(".")[0] == e.name.split(".")[0]:
                continue
            raise
        main.add_command(command, ep.name)


_add_installed_commands()

if __name__ == "__main__":
    main()
