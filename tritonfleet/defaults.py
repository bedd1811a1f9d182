"""Operator API: every tunable's default, by name (``DEFAULTS``: all of them as a dict).

Group data reads it where it must name a setting pyinfra itself reads
(``inventories/group_data/all.py``: ``ssh_strict_host_key_checking = _defaults.ssh_strict_host_key_checking``);
everything else set nowhere takes its default without being named. ``python -m tritonfleet.tunables``
prints them all with what each does.

This module is part of the public surface ``tritonfleet init`` writes into operators'
repositories (docs/architecture.md, "Operator API"): its names stay. The table lives in
tritonfleet.settings.defaults.
"""

from tritonfleet.settings.defaults import *  # noqa: F403 - every tunable, by its name
from tritonfleet.settings.defaults import DEFAULTS

__all__ = ["DEFAULTS", *DEFAULTS]  # noqa: PLE0604 - the tunables' names
