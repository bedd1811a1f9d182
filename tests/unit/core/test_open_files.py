"""tritonfleet.core.open_files: the open-file limit is raised to the hard limit at the start of a run, and
a fleet that still would not fit is refused before any host is connected, naming the limit and
the fix. Each case runs in its own interpreter (a process cannot raise its hard limit again)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_soft_limit_raised_to_hard_and_pyinfra_follows():
    res = _py("""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))
        import pyinfra.api.state as st
        assert st.MAX_PARALLEL == round((256 - 10) / 3), st.MAX_PARALLEL
        from tritonfleet.core.open_files import raise_nofile
        assert raise_nofile() == (4096, 4096)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (4096, 4096)
        assert st.MAX_PARALLEL == round((4096 - 10) / 3)
        print("ok")
    """)
    assert res.stdout.strip() == "ok", res.stderr


@pytest.mark.parametrize("hosts,fits", [(1, True), (300, True), (400, False), (5000, False)])
def test_fleet_beyond_the_hard_limit_is_refused(hosts, fits):
    res = _py(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 1024))
        from tritonfleet.core.open_files import LimitError, check_nofile
        try:
            check_nofile({hosts}, "this deploy")
        except LimitError as e:
            print("refused:", e)
        else:
            print("fits")
    """)
    assert res.returncode == 0, res.stderr
    if fits:
        assert res.stdout.strip() == "fits"
    else:
        out = res.stdout
        assert out.startswith("refused:") and f"{hosts} SSH connections" in out
        assert "limit is 1024 (hard limit 1024)" in out and "ulimit -Hn" in out and "docs/scale.md" in out


def test_fleet_commands_refuse_with_the_inventory_named(tmp_path):
    inv = tmp_path / "big.py"
    inv.write_text("t4 = [(f'h{i}', {'ssh_hostname': '192.0.2.1'}) for i in range(400)]\n")
    res = _py(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 1024))
        from tritonfleet.inventory import roster
        try:
            roster.load_inventory({str(inv)!r})
        except roster.FleetError as e:
            print("refused:", e)
    """)
    assert res.stdout.startswith("refused: reading 400 host(s) of " + str(inv)), res.stdout + res.stderr


def test_fleet_parallel_bounds_the_hosts_read_at_once():
    import threading
    import time

    from tritonfleet.inventory import roster

    hosts = [roster.FleetHost(f"h{i}", ["t4"], {"fleet_parallel": 3}, None) for i in range(10)]
    lock, now, peak = threading.Lock(), [0], [0]

    def read(h):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return h.name

    assert roster.parallel(hosts, read) == [h.name for h in hosts]
    assert peak[0] == 3
    for bad in (0, "many", 2.5):
        with pytest.raises(roster.FleetError, match="fleet_parallel must be a whole number"):
            roster.parallel([roster.FleetHost("h", [], {"fleet_parallel": bad}, None)], read)
