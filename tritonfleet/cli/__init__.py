"""The ``tritonfleet`` command line. Each sub-command lives in its own module."""

from __future__ import annotations

import click

from . import __version__


@click.group()
@click.version_option(__version__)
def main() -> None:
    """Take bare NVIDIA GPU hosts to serving Triton, and keep the fleet right."""


def _register() -> None:
    # Sub-command modules register themselves on ``main``; import them here so a broken
    # optional piece names itself instead of breaking the whole CLI.
    from . import fleet_cli, loadtest_cli, prometheus_cli, tune_cli, validate_cli  # noqa: F401

    _add_installed_commands()


#: entry point group through which other installed packages add command groups (the test
#: tooling's ``testbed``)
COMMANDS_GROUP = "tritonfleet.commands"


def _add_installed_commands() -> None:
    """The commands other installed packages declare in the ``tritonfleet.commands`` entry point
    group. One whose package is not installed (a declaration left without its package) is left
    out; any other error while loading it is raised, naming it."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=COMMANDS_GROUP):
        try:
            command = ep.load()
        except ModuleNotFoundError as e:
            if e.name and ep.module.split(".")[0] == e.name.split(".")[0]:
                continue
            raise
        main.add_command(command, ep.name)


_register()

if __name__ == "__main__":
    main()
