"""bench/driver_change.py reads a driver change's phases from what the rollout, dpkg and the host's
journal recorded: each phase is the span between the right two records, and a record that is not
there stops the benchmark naming it (never a phase of zero)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tritonfleet import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
import driver_change  # noqa: E402

T0 = 1_796_544_796.0  # the batch starts (2026-12-06 08:13:16 UTC)


def entry(t: float, who: str, msg: str, field: str = "_SYSTEMD_UNIT") -> str:
    return json.dumps({"__REALTIME_TIMESTAMP": str(int((T0 + t) * 1e6)), field: who, "MESSAGE": msg})


OLD = [entry(9.0, "systemd-logind", "The system will reboot now!", "SYSLOG_IDENTIFIER")]
NEW = [
    entry(13.0, "systemd-journald.service", "Journal started"),
    entry(13.2, "ssh.service", "Server listening on 0.0.0.0 port 22."),
    entry(13.5, "docker.service", "Started docker.service - Docker Application Container Engine.", "UNIT"),
    entry(13.6, "triton.service", "Started triton.service - Triton Inference Server (triton-server).", "UNIT"),
    entry(14.0, "triton.service", "== Triton Inference Server =="),
    entry(15.0, "triton.service", 'I1206 http_server.cc:4713] "Started HTTPService at 0.0.0.0:8000"'),
    entry(16.0, "init.scope", "Started docker-aa11.scope - libcontainer container aa11.", "UNIT"),  # the GPU check
    entry(18.5, "init.scope", "Started docker-bb22.scope - libcontainer container bb22.", "UNIT"),  # the validation
]
DPKG = "\n".join([
    "2026-12-06 08:13:15 startup packages remove",  # before the batch: not this move's
    "2026-12-06 08:13:20 startup packages remove",
    "2026-12-06 08:13:22 configure nvidia-kernel-open-dkms:amd64 570.133.07-1 <none>",
    "2026-12-06 08:13:23 status installed nvidia-kernel-open-dkms:amd64 570.133.07-1",
    "2026-12-06 08:13:23 status installed nvidia-open-570:amd64 570.133.07-1",
])
LOG = "[tb1-t4] rebooted (boot id c042)\n    tb1-t4: healthy in 1.1s (2 models ready, metrics served)\n"


def test_each_phase_is_the_span_between_its_records():
    events = {"batch": T0, "batch-done": T0 + 19.0}
    got = driver_change.phases(events, LOG, driver_change.dpkg_lines(DPKG, T0),
                               driver_change.journal("\n".join(OLD)), driver_change.journal("\n".join(NEW)))
    expect = {
        "deploy start to the first package change": 4.0,
        "driver packages (apt: the old branch out, the new in)": 3.0,
        "module build (the DKMS package's configure)": 1.0,
        "last package to the reboot (holds, pins, the reboot check)": 2.0,
        "reboot: shutdown to sshd listening in the new boot": 4.2,
        "Docker: boot to docker.service started": 0.5,
        "image: triton.service started to the container's first line": 0.4,
        "Triton: first line to HTTP service started (models loaded)": 1.0,
        "warm gate: the deploy's health gate (live, ready, models, metrics, first inference)": 1.1,
        "CUDA validation container (vectorAdd in the Triton image)": 0.5,
        "reboot to Triton serving": 6.0,
        "reboot to validated (the rollout's batch done)": 10.0,
        "whole move (the rollout's batch)": 19.0,
        "image loaded (docker load) during the move": 0.0,
    }
    assert got == pytest.approx(expect, abs=1e-3)


def test_a_missing_record_stops_the_benchmark_naming_it():
    events = {"batch": T0, "batch-done": T0 + 19.0}
    no_http = [e for e in NEW if "HTTPService" not in e]
    with pytest.raises(SystemExit, match="Triton's HTTP service"):
        driver_change.phases(events, LOG, driver_change.dpkg_lines(DPKG, T0),
                             driver_change.journal("\n".join(OLD)), driver_change.journal("\n".join(no_http)))
