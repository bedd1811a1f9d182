"""``python -m tritonfleet_testbed up|down|list|destroy``: the testbed commands without the
``tritonfleet`` command line (the same as ``tritonfleet testbed ...``)."""

from .cli import testbed

testbed(prog_name="python -m tritonfleet_testbed")
