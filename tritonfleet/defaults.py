"""``tritonfleet.defaults`` moved to ``tritonfleet.settings.defaults``.

This module stays so that what operators' deploy files, inventories and commands name keeps
working (``tritonfleet init`` of earlier versions wrote them)."""

from tritonfleet.settings.defaults import *  # noqa: F403
