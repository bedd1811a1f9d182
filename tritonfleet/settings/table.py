"""The tunables in tritonfleet/settings/defaults.py, with their defaults and comments.

Used for the table in docs/tunables.md (`python -m tritonfleet.tunables`, tritonfleet.tunables) and by the test that
keeps that table, the defaults and the code in step.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from .. import resource

DEFAULTS_FILE = resource("settings", "defaults.py")


def whole_number(value, key: str, where: str = "group data") -> int:
    """``value`` as a whole number >= 1 (as written: "4" or 4, not 4.5, "4x", NaN or infinity);
    ValueError naming the tunable and where it is set otherwise."""
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):  # None, text, NaN, infinity
        n = 0
    if n < 1 or str(value).strip() != str(n):
        raise ValueError(f"{key} must be a whole number >= 1, not {value!r} ({where})")
    return n


def read(path: Path = DEFAULTS_FILE) -> list[tuple[str, str, str]]:
    """[(name, default as written, comment)] in file order."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id[0].islower():
            comment: list[str] = []
            i = node.lineno - 2
            while i >= 0 and lines[i].startswith("# ") and not lines[i].startswith("# ---"):
                comment.insert(0, lines[i][2:].strip())
                i -= 1
            out.append((node.targets[0].id, ast.get_source_segment(text, node.value), " ".join(comment)))
    return out


def markdown() -> str:
    rows = ["| tunable | default | what it does |", "|---|---|---|"]
    for name, default, comment in read():
        rows.append(f"| `{name}` | `{default}` | {comment.replace('|', '/')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None, prog: str = "python -m tritonfleet.settings.table") -> None:
    """The table; ``--help`` says so (and any other argument is refused with exit status 2,
    argparse's usage error). Operators run it as ``python -m tritonfleet.tunables``
    (tritonfleet.tunables); ``python -m tritonfleet.settings.table`` is the same command."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Print every tunable of tritonfleet (tritonfleet/settings/defaults.py) with its default and what it "
        "does, as the markdown table of docs/tunables.md. Group data sets only what differs.",
    )
    parser.parse_args(argv)
    print(markdown())


if __name__ == "__main__":
    main()
