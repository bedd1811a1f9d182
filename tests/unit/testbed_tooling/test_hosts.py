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


def test_each_debian_release_has_its_own_hosts(tmp_path, monkeypatch):
    from tritonfleet_testbed import hosts

    old = hosts.make_host(1)
    new = [hosts.make_host(i, "trixie") for i in (hosts.FIRST_INDEX["trixie"], hosts.FIRST_INDEX["trixie"] + 1)]
    assert old.suite == "bookworm" and [h.suite for h in new] == ["trixie", "trixie"]
    names = {old.name, *(h.name for h in new)}
    assert len(names) == 3 and len({old.address, *(h.address for h in new)}) == 3
    assert len({old.netns, *(h.netns for h in new)}) == 3 and len({old.veth, *(h.veth for h in new)}) == 3
    # a state file from before releases were recorded: its hosts are Debian 12's
    monkeypatch.setattr(hosts, "STATE_FILE", tmp_path / "state.json")
    raw = {"hosts": [{k: v for k, v in vars(old).items() if k != "suite"}]}
    (tmp_path / "state.json").write_text(json.dumps(raw))
    assert hosts.State.load().hosts[0].suite == "bookworm"
    with pytest.raises(hosts.TestbedError, match="no testbed hosts of Debian 'sid'"):
        hosts.base_tarball("sid")
