"""bench/pull_bare.py counts the bytes a host fetched from the origin in nginx's own access log:
checked against a real nginx (Debian's, as the bench runs it) serving generated files to this
machine, only this address's requests counted."""

from __future__ import annotations

import importlib.util
import os

import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet import ROOT
from tritonfleet_testbed.origin_server import OriginServer

_spec = importlib.util.spec_from_file_location("pull_bare", f"{ROOT}/bench/pull_bare.py")
pull_bare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pull_bare)


@settings(max_examples=5, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 300_000), min_size=1, max_size=6))
def test_the_bytes_counted_are_those_nginx_served_to_the_address(tmp_path_factory, sizes):
    tmp = tmp_path_factory.mktemp("origin")
    (tmp / "root").mkdir()
    for i, size in enumerate(sizes):
        (tmp / "root" / f"f{i}").write_bytes(os.urandom(size))
    srv = OriginServer(tmp / "root", tmp / "nginx")
    try:
        got = sum(len(requests.get(f"{srv.url}/f{i}", timeout=10).content) for i in range(len(sizes)))
        missing = requests.get(f"{srv.url}/missing", timeout=10)
        assert missing.status_code == 404
    finally:
        srv.stop()
    n, size = pull_bare.origin_bytes(tmp / "nginx" / "access.log", "127.0.0.1")
    assert got == sum(sizes)
    assert (n, size) == (len(sizes) + 1, sum(sizes) + len(missing.content))  # the 404's page too
    assert pull_bare.origin_bytes(tmp / "nginx" / "access.log", "127.0.0.2") == (0, 0)
