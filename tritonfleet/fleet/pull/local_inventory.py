# The inventory of a self-converging host's own run (tritonfleet converge,
# tritonfleet.fleet.pull.host_run): this host alone, under its inventory name, through pyinfra's
# local connector (tritonfleet.pyinfra_ext.self_connector SelfConnector), in its groups, with the
# data its release holds for it. The file is named by $TRITONFLEET_PULL_HOST_DATA (written by the
# run: {"name", "groups", "data"}).
import json as _json
import os as _os

from tritonfleet.core.open_files import raise_nofile as _raise_nofile

_raise_nofile()
_path = _os.environ.get("TRITONFLEET_PULL_HOST_DATA")
if not _path:
    raise SystemExit("TRITONFLEET_PULL_HOST_DATA is not set: this inventory is for `tritonfleet converge` only")
with open(_path) as _f:
    _host = _json.load(_f)
_entry = [(f"@tritonfleet-self/{_host['name']}", _host["data"])]
for _group in _host["groups"] or ["pull"]:
    globals()[_group] = _entry
