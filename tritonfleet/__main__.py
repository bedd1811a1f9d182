"""The ``tritonfleet`` command (its console script) and ``python -m tritonfleet``.

pyinfra's command line patches the standard library for gevent when ``pyinfra_cli`` is imported
(its ``__init__``), and every command that reads an inventory imports it. Patched after ``ssl``
was imported (by the command modules' own imports), modules that took ssl's names stay
unpatched, and gevent warns so (MonkeyPatchWarning, "may lead to errors, including
RecursionError") on every rollout, status or loadtest. As pyinfra's own command line does
("API scripts should also patch gevent at the start of their execution", pyinfra_cli/__init__.py),
the command patches first, then imports the command line. Importing ``tritonfleet.cli`` itself
(tests, other programs) patches nothing.
"""

from __future__ import annotations


def main() -> None:
    from gevent import monkey

    monkey.patch_all()
    from .cli import main as cli

    cli()


if __name__ == "__main__":
    main()
