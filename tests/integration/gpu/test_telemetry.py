"""GPU telemetry's textfile against the real node exporter (Debian's prometheus-node-exporter):
what it serves is what the collector wrote, and the unit's command line runs the collector as the
host would (the collector's parsing and rules: tests/unit/gpu/test_telemetry.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.unit.gpu.test_telemetry import answer, one, record, samples
from tritonfleet.gpu import telemetry as t
from tritonfleet.observability import telemetry_units as tu
from tritonfleet.settings.defaults import DEFAULTS
from tritonfleet_testbed.ports import free_port

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"




@pytest.fixture
def node_exporter(tmp_path):
    assert Path(NODE_EXPORTER).exists(), "prometheus-node-exporter is not installed (bash scripts/setup installs it)"
    textfiles = tmp_path / "node-textfiles"
    textfiles.mkdir()
    port = free_port()
    proc = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
                             f"--collector.textfile.directory={textfiles}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def scrape() -> str:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?collect[]=textfile", timeout=5) as r:
                    return r.read().decode()
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the node exporter does not answer"
                time.sleep(0.2)

    try:
        yield textfiles, scrape
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_real_node_exporter_serves_the_textfile_as_written(tmp_path, node_exporter):
    textfiles, scrape = node_exporter
    gpus = t.parse_query(answer("query-telemetry.txt"))
    text = t.render(gpus, True, 0.043, [("0000:00:06", 13, "RESTART_APP", 4, 2, 1.7e9 + 5, True),
                                        ("0000:00:06", 79, "RESTART_BM", 1, 1, 1.7e9, True)], True)
    t.write_atomically(str(textfiles), t.TEXTFILE, text)
    served = samples(scrape())
    assert one(served, "node_textfile_scrape_error") == 0
    ours = samples(text)
    assert ours and {k: v for k, v in served.items() if k[0].startswith("tritonfleet_gpu_")} == ours


def test_the_unit_command_line_runs_the_collector_as_the_host_would(tmp_path, standin, node_exporter):
    """The collector's ExecStart (rendered from the tunables) run here, against the stand-in
    driver and a kernel-message file; the node exporter serves what it writes."""
    textfiles, scrape = node_exporter
    smi = standin("T4")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(record(1, "NVRM: Xid (PCI:0000:00:1e): 48, pid=1, name=x, DBE"))
    settings_ = {**DEFAULTS, "telemetry_textfile_dir": str(textfiles), "nvidia_smi_command": str(smi),
                 "telemetry_kmsg_path": str(kmsg), "telemetry_interval": 0.5}
    args = [a for a, _ in tu.collector_args(settings_)]
    assert args[:2] == [tu.PYTHON, tu.COLLECTOR]
    unit = tu.collector_unit(settings_)
    assert f"ExecStart={tu.command_line(tu.collector_args(settings_))}" in unit.splitlines()
    # run the same arguments with this checkout's file in place of the host's copy
    argv = [sys.executable, str(Path(t.__file__)), *args[2:]]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (textfiles / t.TEXTFILE).exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        with open(kmsg, "a") as f:  # an Xid while it runs: written at once
            f.write(record(2, "NVRM: Xid (PCI:0000:00:1e): 79, GPU has fallen off the bus."))
        while True:
            found = samples(scrape())
            # the Xid is written at once; the driver's answer comes with the next query (later
            # than the Xid on a loaded machine): both are waited for
            if [k for k in found if k[0] == "tritonfleet_gpu_xid_errors_total" and ("xid", "79") in k[1]] and \
                    [k for k in found if k[0] == "tritonfleet_gpu_temperature_celsius"]:
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.1)
        assert one(found, "tritonfleet_gpu_xid_errors_total", xid="48") == 1
        assert one(found, "tritonfleet_gpu_temperature_celsius") == 27
    finally:
        proc.terminate()
        proc.wait(10)
