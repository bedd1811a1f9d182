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
    from .scaffold import init
    from .testbed import cli as testbed_cli  # noqa: F401

    main.add_command(init)


_register()

if __name__ == "__main__":
    main()
