"""The one quoting rule for every value that reaches a remote shell.

Every value interpolated into a shell command (a path, an image, a unit, a model name, a release
id, a URL) goes through :func:`q` (``shlex.quote``), whatever its source: tunables, the model
repository, the host's own records. A value never changes the words of the command it is put in;
``tests/unit/core/test_shell.py`` feeds hostile values through every command-building function.
"""

from __future__ import annotations

import shlex
from urllib.parse import quote as _url_quote


def q(value: object) -> str:
    """``value`` as one shell word (single-quoted unless it only holds safe characters)."""
    return shlex.quote(str(value))


def words(*values: object) -> str:
    """Each of ``values`` as one shell word, joined by spaces."""
    return " ".join(q(v) for v in values)


def url_segment(value: object) -> str:
    """``value`` as one URL path segment (percent-encoded: no '/', '?', '#' or '%' survives)."""
    return _url_quote(str(value), safe="")
