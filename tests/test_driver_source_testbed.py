"""The driver a host already has, on a real test host over SSH: a .run install's traces (its
uninstaller, owned by no package, and the installer's backup log) are detected by pre-flight,
which refuses with the migration help and leaves the host unchanged; `tritonfleet status` shows
the source. (Generated dpkg states and the migration's commands: tests/test_driver_source.py.)"""

from __future__ import annotations

import pytest
from testbed_util import host_state, mark, pyinfra_raw, ssh, status_of

from tritonfleet import driver_source as ds

pytestmark = pytest.mark.testbed

REFUSED = "tritonfleet pre-flight failed, no host was changed"
RUN_TRACES = (f"printf '#!/bin/sh\\necho uninstalled\\n' > {ds.RUN_UNINSTALLER} && chmod 755 {ds.RUN_UNINSTALLER} "
              f"&& mkdir -p /var/lib/nvidia && printf '580.95.05\\n/usr/bin/nvidia-smi\\n' > {ds.RUN_LOG}")


def test_run_install_is_detected_refused_and_shown(testbed):
    h = testbed.hosts[0]
    ssh(h, RUN_TRACES)
    try:
        before = mark(h)
        res = pyinfra_raw("-y", "--limit", h.name, "inventories/testbed.py", "deploys/host.py")
        out = res.stdout + res.stderr
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        assert res.returncode != 0 and REFUSED in out, out[-3000:]
        assert "Starting operation" not in out
        for text in (f"{h.name}: the host already has an NVIDIA driver (runfile 580.95.05",
                     f"NVIDIA's .run installer (files outside any package manager): {ds.RUN_UNINSTALLER}, {ds.RUN_LOG}",
                     "nvidia_driver_migrate = True", f"{ds.RUN_UNINSTALLER} --silent", "docs/driver-sources.md"):
            assert text in " ".join(out.split()), (text, out[-3000:])
        assert host_state(h) == before
        _, row = status_of(h.name)
        assert row["driver_source"].startswith("runfile"), row
        assert any(d.startswith("driver source runfile") for d in row["drift"]), row["drift"]
    finally:
        ssh(h, f"rm -rf {ds.RUN_UNINSTALLER} /var/lib/nvidia")
    _, row = status_of(h.name)
    assert not (row["driver_source"] or "").startswith("runfile"), row
