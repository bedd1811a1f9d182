# The fake fleet of bench/fakefleet.py: every host at its loopback address, with the data of the
# testbed host its answers were recorded from (bench/fakefleet.json), in that host's GPU group.
# TRITONFLEET_FAKEFLEET names the hosts file `fakefleet.py serve` wrote.
import json
import os

from tritonfleet.core.open_files import raise_nofile

raise_nofile()  # before pyinfra sizes its pools and connects (tritonfleet/core/open_files.py)

_path = os.environ.get("TRITONFLEET_FAKEFLEET")
if not _path:
    raise SystemExit("TRITONFLEET_FAKEFLEET is not set: start `python bench/fakefleet.py serve` (bench/run.py scale does)")
with open(_path) as _f:
    _fleet = json.load(_f)

_hosts = [(name, {**_fleet["data"], "ssh_hostname": addr, "ssh_port": _fleet["port"]}) for name, addr in _fleet["hosts"]]
t4 = _hosts if _fleet["group"] == "t4" else []
l4 = _hosts if _fleet["group"] == "l4" else []
