"""``tritonfleet.tunables`` moved to ``tritonfleet.settings.table``.

This module stays so that what operators' deploy files, inventories and commands name keeps
working (``tritonfleet init`` of earlier versions wrote them)."""

from tritonfleet.settings.table import *  # noqa: F403

if __name__ == "__main__":
    import runpy

    runpy.run_module("tritonfleet.settings.table", run_name="__main__")
