"""``tritonfleet.limits`` moved to ``tritonfleet.core.open_files``.

This module stays so that what operators' deploy files, inventories and commands name keeps
working (``tritonfleet init`` of earlier versions wrote them)."""

from tritonfleet.core.open_files import *  # noqa: F403
