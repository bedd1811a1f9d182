"""``tritonfleet.tunables`` moved to ``tritonfleet.settings.table``.

This module stays so that what operators' deploy files, inventories and commands name keeps
working (``tritonfleet init`` of earlier versions wrote them), ``python -m tritonfleet.tunables`` too."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("tritonfleet.settings.table", run_name="__main__")
else:
    from tritonfleet.settings.table import *  # noqa: F403
