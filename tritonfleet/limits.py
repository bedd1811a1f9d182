"""Operator API: the control machine's open-file limit, for an inventory of many hosts.

``raise_nofile()`` (called at the top of ``inventories/prod.py``) raises the soft limit to the
hard one and returns both; ``check_nofile(hosts)`` stops a run whose limit is too low for its
number of hosts, naming the fix.

This module is part of the public surface ``tritonfleet init`` writes into operators'
repositories (docs/architecture.md, "Operator API"): its names stay. The code lives in
tritonfleet.core.open_files.
"""

from tritonfleet.core.open_files import check_nofile, raise_nofile

__all__ = ["check_nofile", "raise_nofile"]
