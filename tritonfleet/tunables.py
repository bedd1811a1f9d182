"""Operator API: ``python -m tritonfleet.tunables``, the table of every tunable with its default
and what it does (the table of docs/tunables.md); ``markdown()`` returns it and ``read()`` its
rows (name, default, comment).

This is the command's one name in the skeleton, the docs and the messages. It is part of the
public surface ``tritonfleet init`` writes into operators' repositories (docs/architecture.md,
"Operator API"): its names stay. The code lives in tritonfleet.settings.table, whose own
``python -m tritonfleet.settings.table`` keeps working.
"""

from tritonfleet.settings.table import main as _main
from tritonfleet.settings.table import markdown, read

__all__ = ["main", "markdown", "read"]

PROG = "python -m tritonfleet.tunables"


def main(argv: list[str] | None = None) -> None:
    """``python -m tritonfleet.tunables [--help]``: print the table."""
    _main(argv, prog=PROG)


if __name__ == "__main__":
    main()
