"""Testbed instances (TRITONFLEET_TESTBED=N) never share a name, address or NAT table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

NAMES = ("STATE_DIR", "CGROUP_ROOT", "BRIDGE", "SUBNET", "GATEWAY", "NFT_TABLE", "NETNS_PREFIX", "VETH_PREFIX")


def _constants(instance: str | None) -> dict:
    env = {"PATH": "/usr/bin:/bin"}
    if instance is not None:
        env["TRITONFLEET_TESTBED"] = instance
    code = ("import json; from tritonfleet_testbed import hosts as h; "
            f"print(json.dumps({{n: str(getattr(h, n)) for n in {NAMES!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_default_instance_keeps_the_historic_names():
    c = _constants(None)
    assert c["BRIDGE"] == "tfbr0" and c["SUBNET"] == "10.77.0" and c["NFT_TABLE"] == "tritonfleet_testbed"
    assert c["STATE_DIR"] == "/var/lib/tritonfleet/testbed" and c["NETNS_PREFIX"] == "tf-tb"


def test_instances_share_nothing():
    a, b = _constants("0"), _constants("3")
    for name in NAMES:
        assert a[name] != b[name], name
    assert b["SUBNET"] == "10.77.3" and b["GATEWAY"] == "10.77.3.1" and b["BRIDGE"] == "tfbr3"


def test_out_of_range_instance_is_refused():
    with pytest.raises(subprocess.CalledProcessError):
        _constants("12")
