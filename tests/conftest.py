"""The suite's layout and the session fixtures for tests on the local testbed (real hosts, real
SSH, real Triton).

Tests live like the source: ``tests/unit/<domain>/`` (pure: no server, no heavy program, fast),
``tests/integration/<domain>/`` (every test there is marked ``integration`` by its directory: it
starts real servers or programs on loopback: tritonserver, HAProxy, nginx, Prometheus, the
registry, the command line), ``tests/testbed/`` (every test there is marked ``testbed`` by its
directory: it runs real hosts), ``tests/support/`` (the helpers).

``testbed``: the hosts, brought up bare once per session and removed at its end (the teardown
checks that nothing is left behind). ``deployed``: the full deploy from bare on all of them,
run once; tests that change a host put it back (or leave it serving the same release).

TRITONFLEET_TEST_REUSE_TESTBED=1 (for a developer's quick loop, never in CI) keeps running test
hosts instead of starting from bare, and leaves them up at the end.
"""

from __future__ import annotations

# The process is patched for gevent first, as the tritonfleet command and pyinfra's own command
# line do before anything imports ssl ("API scripts should also patch gevent at the start of
# their execution", pyinfra_cli/__init__.py). Tests that load an inventory or run a deploy
# in-process import pyinfra_cli, which patches then anyway; patched that late, after ssl was
# imported, clients built on ssl later (boto3's, for the model origin) recursed without end.
from gevent import monkey

monkey.patch_all()

import os
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import settings

from tritonfleet_testbed import standin_repo

# No test is a timing (speed is measured in bench/, never asserted in a test): hypothesis's
# per-example deadline (200 ms) failed generated cases on a loaded machine with nothing wrong.
settings.register_profile("tritonfleet", deadline=None)
settings.load_profile("tritonfleet")

TESTBED_HOSTS = 3
TIMINGS: dict[str, float] = {}
TESTBED_DIR = Path(__file__).resolve().parent / "testbed"
INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config, items):
    """The tiers' markers by directory: every test under tests/testbed/ is marked ``testbed``,
    every test under tests/integration/ ``integration``, none else."""
    for item in items:
        parents = Path(str(item.path)).resolve().parents
        if TESTBED_DIR in parents:
            item.add_marker(pytest.mark.testbed)
        elif INTEGRATION_DIR in parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def testbed():
    from tritonfleet_testbed import hosts
    from tritonfleet_testbed.cli import bring_up

    reuse = os.environ.get("TRITONFLEET_TEST_REUSE_TESTBED") == "1"  # developers' fast loop only
    if not reuse:
        hosts.down()  # from bare: no host left from an earlier run
    t0 = time.monotonic()
    state = bring_up(TESTBED_HOSTS)
    TIMINGS[f"testbed up ({TESTBED_HOSTS} hosts)"] = time.monotonic() - t0
    yield state
    if reuse:
        return
    t0 = time.monotonic()
    hosts.down()
    TIMINGS["testbed down"] = time.monotonic() - t0
    print("\ntestbed timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in TIMINGS.items()))
    # nothing may be left behind: hosts, mounts, namespaces, bridge, NAT table, cgroups
    leftovers = []
    if Path("/run/netns").exists():
        leftovers += [str(p) for p in Path("/run/netns").glob(f"{hosts.NETNS_PREFIX}*")]
    if Path(f"/sys/class/net/{hosts.BRIDGE}").exists():
        leftovers.append(f"bridge {hosts.BRIDGE}")
    nft = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    if hosts.NFT_TABLE in nft.split():
        leftovers.append(f"nft table {hosts.NFT_TABLE}")
    if str(hosts.STATE_DIR / "hosts") in Path("/proc/mounts").read_text():
        leftovers.append("overlay mounts")
    if hosts.CGROUP_ROOT.exists():
        leftovers.append(str(hosts.CGROUP_ROOT))
    assert not leftovers, f"testbed down left: {leftovers}"


@pytest.fixture(scope="session")
def deployed(testbed):
    """Every testbed host taken from bare to serving by the full deploy (once a session)."""
    from tests.support.testbed import pyinfra

    t0 = time.monotonic()
    res, data = pyinfra("deploys/triton.py")
    TIMINGS[f"deploy from bare ({TESTBED_HOSTS} hosts)"] = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-6000:]
    assert data.get("results", {}).get("failed_hosts") == [], res.stderr[-4000:]
    return testbed, res, data


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The testbed's stand-in nvidia-smi with a T4 (its gpu.env: the "hardware"): the GPU telemetry
    collector's tests, unit and integration, read it."""
    root = tmp_path / "root"
    (root / "etc/nvidia-standin").mkdir(parents=True)
    (root / "run/nvidia-standin").mkdir(parents=True)
    (root / "run/nvidia-standin/module-version").write_text("580.159.04\n")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(standin_repo.smi_answer("580.159.04"))
    smi.chmod(0o755)
    monkeypatch.setenv("NVIDIA_STANDIN_ROOT", str(root))

    def gpu(cls: str = "T4", **faults: str) -> Path:
        extra = "".join(f"{k}='{v}'\n" for k, v in faults.items())
        (root / "etc/nvidia-standin/gpu.env").write_text(standin_repo.gpu_profile(cls) + extra)
        return smi

    return gpu
