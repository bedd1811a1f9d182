"""``tritonfleet.pyinfra_patches`` moved to ``tritonfleet.pyinfra_ext.install``.

This module stays so that what operators' deploy files, inventories and commands name keeps
working (``tritonfleet init`` of earlier versions wrote them)."""

from tritonfleet.pyinfra_ext.install import *  # noqa: F403
