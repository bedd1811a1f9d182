"""The GPU fault collector (tritonfleet.gpu.telemetry): the driver query against real driver 580
output (H200) and against the testbed's stand-in driver, Xid reports in every format the driver
prints (generated), the kernel-message source followed as it grows, the textfile read back by
prometheus_client's parser (by the real node exporter, and the collector run with exactly the
command line of its unit: tests/integration/gpu/test_telemetry.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tritonfleet.gpu import telemetry as t
from tritonfleet.observability import telemetry_units as tu
from tritonfleet.settings.defaults import DEFAULTS
from tritonfleet_testbed import standin_repo

REAL = Path(__file__).parents[2] / "fixtures" / "nvidia-real-h200-580-health"


def answer(name: str) -> str:
    """A captured command's output without its ``rc=`` line."""
    return (REAL / name).read_text().rsplit("\nrc=", 1)[0] + "\n"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def one(found: dict, name: str, **labels) -> float:
    hits = [v for (n, lab), v in found.items() if n == name and all(dict(lab).get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


# ---- the driver query ---------------------------------------------------------------------

def test_the_query_is_exactly_the_captured_real_one():
    assert t.QUERY == (REAL / "telemetry-fields.txt").read_text().strip()
    # the header of the same query with units names the same fields in the same order
    header = answer("query-telemetry-header.txt").splitlines()[0].split(", ")
    names = [h.split(" [")[0].replace("clocks.current.sm", "clocks.sm") for h in header]
    assert names == [f[0] for f in t.FIELDS]


def test_real_h200_answer():
    gpus = t.parse_query(answer("query-telemetry.txt"))
    assert len(gpus) == 1
    g = gpus[0]
    assert (g.index, g.uuid, g.pci_bus_id, g.pci) == ("0", "GPU-8214eaab-afa1-ccd4-70bb-d732ee7a8f14",
                                                     "00000000:00:06.0", "0000:00:06")
    v = {(m, lab): x for (m, lab), x in g.values.items()}
    assert v[(t.PREFIX + "temperature_celsius", ())] == 44 and v[(t.PREFIX + "memory_temperature_celsius", ())] == 43
    assert v[(t.PREFIX + "power_draw_watts", ())] == 80.66 and v[(t.PREFIX + "power_limit_watts", ())] == 700
    assert v[(t.PREFIX + "sm_clock_hertz", ())] == 345e6 and v[(t.PREFIX + "sm_clock_max_hertz", ())] == 1980e6
    assert v[(t.PREFIX + "clocks_event_reasons", ())] == 1
    assert v[(t.PREFIX + "clocks_event_reason_active", (("reason", "gpu_idle"),))] == 1
    assert v[(t.PREFIX + "clocks_event_reason_active", (("reason", "hw_thermal_slowdown"),))] == 0
    assert v[(t.PREFIX + "pcie_link_generation", ())] == 5 and v[(t.PREFIX + "pcie_link_width_max", ())] == 16
    assert v[(t.PREFIX + "ecc_mode_enabled", ())] == 1
    assert v[(t.PREFIX + "ecc_errors_total", (("period", "volatile"), ("type", "uncorrected")))] == 0
    assert v[(t.PREFIX + "remapped_rows_failure", ())] == 0 and v[(t.PREFIX + "remapped_rows_pending", ())] == 0
    # the H200 retires no pages (it remaps rows): [N/A] is no sample, not a zero
    assert not [k for k in v if k[0].startswith("retired_pages")]


def test_the_old_clock_reason_names_answer_the_same():
    """Driver 580 still answers clocks_throttle_reasons.* (the pre-R535 names)."""
    mask, *_ = answer("query-throttle-old-names.txt").strip().split(", ")
    assert t.value(mask, "mask") == 1


@pytest.mark.parametrize("raw", ["[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "", "  "])
def test_unreported_values_are_no_sample(raw):
    for kind in ("num", "mhz", "mask", "flag"):
        assert t.value(raw, kind) is None


def test_an_error_instead_of_rows_is_refused():
    with pytest.raises(ValueError, match="unexpected nvidia-smi answer: Unable to determine the device handle"):
        t.parse_query("Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system "
                      "to recover this GPU\n")


# ---- the stand-in driver answers the same query ---------------------------------------------



@pytest.mark.parametrize("shell", ["dash", "busybox sh"])
def test_standin_answers_the_query_like_the_driver(standin, shell):
    smi = standin("L4", ECC_UNCORRECTED_VOLATILE="2", REASON_HW_THERMAL_SLOWDOWN="Active", REASON_GPU_IDLE="Not Active")
    out = subprocess.run([*shell.split(), str(smi), f"--query-gpu={t.QUERY}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    (g,) = t.parse_query(out)
    assert g.pci == "0000:31:00" and g.uuid == standin_repo.GPU_PROFILES["L4"]["GPU_UUID"]
    assert g.values[(t.PREFIX + "ecc_errors_total", (("period", "volatile"), ("type", "uncorrected")))] == 2
    assert g.values[(t.PREFIX + "clocks_event_reason_active", (("reason", "hw_thermal_slowdown"),))] == 1
    assert g.values[(t.PREFIX + "clocks_event_reasons", ())] == 0x40  # nvml.h: nvmlClocksThrottleReasonHwThermalSlowdown
    assert (t.PREFIX + "memory_temperature_celsius", ()) not in g.values  # [N/A] on a GDDR6 GPU
    # with units and header, shaped like the real capture's header
    head = subprocess.run([*shell.split(), str(smi), f"--query-gpu={t.QUERY}", "--format=csv"], capture_output=True,
                          text=True, check=True).stdout.splitlines()[0]
    assert head == answer("query-telemetry-header.txt").splitlines()[0]


# ---- Xid reports --------------------------------------------------------------------------

hexs = st.integers(0, 0xFFFF)


@settings(max_examples=200, deadline=None)
@given(domain=hexs, bus=st.integers(0, 255), dev=st.integers(0, 31), xid=st.integers(1, 200),
       form=st.sampled_from(["pid", "nopid", "gi", "gici", "old"]), pid=st.integers(1, 4_000_000),
       name=st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=20),
       msg=st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=80))
def test_every_xid_form_the_driver_prints_is_read(domain, bus, dev, xid, form, pid, name, msg):
    """kernel_rc.c's krcReportXid forms (with and without the process, MIG attribution) and the
    older one without "PCI:" (NVIDIA's Xid document)."""
    pci = f"{domain:04x}:{bus:02x}:{dev:02x}"
    attr = {"pid": f"PCI:{pci}", "nopid": f"PCI:{pci}", "gi": f"PCI:{pci} GPU-I:03", "gici": f"PCI:{pci} GPU-I:03 GPU-CI:01",
            "old": pci}[form]
    tail = f"pid={pid}, name={name}, {msg}" if form in ("pid", "gi", "gici") else msg
    ev = t.parse_xid(f"NVRM: Xid ({attr}): {xid}, {tail}")
    assert ev is not None and (ev.pci, ev.xid) == (pci, xid)


@pytest.mark.parametrize("line", [
    # real lines from public reports of real GPUs (NVIDIA's document, open-gpu-kernel-modules#1151)
    ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.", ("0000:2b:00", 79)),
    ("NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH "
     "TIMEOUT, Info 0x58005", ("0000:cb:00", 109)),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     ("0000:01:00", 94)),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", ("0000:03:00", 14)),
])
def test_real_xid_lines(line):
    text, want = line
    ev = t.parse_xid(text)
    assert (ev.pci, ev.xid) == want


def test_the_real_driver_messages_without_an_xid_are_none():
    for record in answer("kmsg.txt").splitlines():
        rec = t.parse_kmsg_record(record)
        if rec:
            assert t.parse_xid(rec[1]) is None
    assert [t.parse_kmsg_record(r)[0] for r in answer("kmsg.txt").splitlines()[:3]] == [559445, 681164, 681177]


def test_a_record_with_dictionary_lines_is_its_first_line():
    assert t.parse_kmsg_record("3,900,123456,-;NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
                               " SUBSYSTEM=pci\n DEVICE=+pci:0000:01:00.0\n") == (
        123456, "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.")


def record(seq: int, text: str, usec: int = 1_000_000) -> str:
    return f"3,{seq},{usec},-;{text}\n"


def test_a_file_source_is_followed_as_it_grows_and_read_again_when_replaced(tmp_path):
    src = tmp_path / "kmsg"
    log = t.KernelLog(str(src))
    assert log.read() == [] and not log.readable and "cannot open" in log.error
    src.write_text(answer("kmsg.txt").split("crw")[0])
    assert len(log.read()) == 5 and log.readable
    with open(src, "a") as f:  # half a record: waits for its end
        f.write("3,400,2000000,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1, name=x, GPU has fal")
    assert log.read() == []
    with open(src, "a") as f:
        f.write("len off the bus.\n SUBSYSTEM=pci\n")
    assert [t.parse_xid(m).xid for _, m in log.read()] == [79]
    src.write_text(record(1, "NVRM: Xid (PCI:0000:00:06): 48, DBE"))  # replaced: shorter, from the start
    got = log.read()
    assert log.restarted and [t.parse_xid(m).xid for _, m in got] == [48]


def test_a_character_device_source_reads_records_until_none_is_left():
    log = t.KernelLog("/dev/null")  # a character device that has no record
    assert log.read() == [] and log.device and log.readable


# ---- the textfile, read back -----------------------------------------------------------------

def collector(tmp_path, smi: str, kmsg: Path) -> t.Collector:
    out = tmp_path / "textfiles"
    out.mkdir(exist_ok=True)
    return t.Collector(str(out), smi, str(kmsg), 1, 10)


def test_xids_are_counted_per_gpu_and_number_and_start_over_with_the_source(tmp_path, standin):
    smi = standin("T4")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(record(1, "NVRM: loading NVIDIA UNIX Open Kernel Module")
                    + record(2, "NVRM: Xid (PCI:0000:00:1e): 79, pid=9, name=tritonserver, GPU has fallen off the bus.",
                             5_000_000)
                    + record(3, "NVRM: Xid (PCI:0000:00:1e): 13, Graphics SM Warp Exception", 6_000_000)
                    + record(4, "NVRM: Xid (PCI:0000:00:1e): 79, GPU has fallen off the bus.", 7_000_000))
    c = collector(tmp_path, str(smi), kmsg)
    c.once()
    found = samples((Path(c.textfile_dir) / t.TEXTFILE).read_text())
    assert one(found, "tritonfleet_gpu_xid_errors_total", xid="79", pci="0000:00:1e") == 2
    assert one(found, "tritonfleet_gpu_xid_errors_total", xid="13") == 1
    assert one(found, "tritonfleet_gpu_xid_last_timestamp_seconds", xid="79") == pytest.approx(c.btime + 7, abs=0.01)
    assert one(found, "tritonfleet_gpu_info", pci="0000:00:1e") == 1  # the Xid's pci joins the GPU's
    assert one(found, "tritonfleet_gpu_query_success") == 1 and one(found, "tritonfleet_gpu_count") == 1
    kmsg.write_text(record(1, "NVRM: loading NVIDIA UNIX Open Kernel Module"))  # a new boot's log
    c.once()
    found = samples((Path(c.textfile_dir) / t.TEXTFILE).read_text())
    assert not [k for k in found if k[0].startswith("tritonfleet_gpu_xid")]


def test_a_failing_driver_query_is_reported_and_its_values_dropped(tmp_path, standin):
    smi = tmp_path / "broken-smi"
    smi.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    smi.chmod(0o755)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    c = collector(tmp_path, str(smi), kmsg)
    c.once()
    found = samples((Path(c.textfile_dir) / t.TEXTFILE).read_text())
    assert one(found, "tritonfleet_gpu_query_success") == 0 and one(found, "tritonfleet_gpu_count") == 0
    assert not [k for k in found if k[0] == "tritonfleet_gpu_temperature_celsius"]


@settings(max_examples=100, deadline=None)
@given(value=st.text(max_size=40))
def test_a_systemd_word_is_one_argument_or_refused(value):
    """What systemd would split or expand never reaches a unit unquoted (systemd.service,
    "Command lines"); shlex's split stands in for systemd's (same double-quote rule)."""
    try:
        word = tu.systemd_word(value, "x")
    except tu.UnitError:
        assert any(c in value for c in "\"'\\`;") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
        return
    assert "\n" not in word
    parts = shlex.split(word.replace("$$", "\0").replace("%%", "\1"))
    assert [p.replace("\0", "$").replace("\1", "%") for p in parts] == [value]


def test_interval_settings_are_checked():
    for key in ("telemetry_interval", "probe_timeout"):
        bad = {**DEFAULTS, key: 0}
        with pytest.raises(tu.UnitError, match=key):
            tu.files(bad, [8000])
    assert os.path.basename(tu.COLLECTOR) == "gpu_telemetry.py"


def test_the_host_scripts_need_nothing_but_pythons_standard_library(tmp_path):
    """They run with the host's python3 (3.10 or newer), where tritonfleet is not installed; the
    health-signal spec they read (tritonfleet.gpu.signals) and the collector's Xid ledger
    (tritonfleet.gpu.xids, with NVIDIA's Xid catalog) and its direct path to the quarantine
    receiver (tritonfleet.gpu.fault_push) are shipped next to them, stdlib-only too."""
    import ast

    from tritonfleet.gpu import fault_push, signals, xids
    from tritonfleet.observability import inference_probe

    spec = "tritonfleet.gpu.signals"  # the one tritonfleet module they load (the host's copy: SPEC_FILE)
    for module in (t, inference_probe, signals, xids, fault_push):
        tree = ast.parse(Path(module.__file__).read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], module.__name__
        assert names - {"__future__"} <= sys.stdlib_module_names, names - sys.stdlib_module_names
        loaded = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and getattr(n.func, "attr", "") == "import_module" and isinstance(n.args[0], ast.Constant)}
        assert loaded <= {spec}, loaded
        siblings = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and getattr(n.func, "id", "") == "_sibling"}
        assert siblings <= {"signals", "xids", "fault_push"}, siblings
    assert Path(tu.SIGNALS).name == signals.SPEC_FILE and tu.sources()[tu.SIGNALS] == Path(signals.__file__).read_text()
    # and they run from a copy alone, away from the package, with the system's python3 (as on a host)
    for path, text in tu.sources().items():
        (tmp_path / Path(path).name).write_text(text)
    for path in (tu.COLLECTOR, tu.PROBE):
        copy = tmp_path / Path(path).name
        res = subprocess.run(["/usr/bin/python3", "-I", str(copy), "--help"], capture_output=True, text=True)
        assert res.returncode == 0 and "--textfile-dir" in res.stdout, res.stderr
    # the collector runs once from the copies, reading the catalog's copy beside them
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(record(1, "NVRM: Xid (PCI:0000:00:1e): 119, Timeout after 6s of waiting for RPC response"))
    once = ["/usr/bin/python3", "-I", str(tmp_path / Path(tu.COLLECTOR).name), f"--textfile-dir={textfiles}",
            f"--kmsg={kmsg}", "--nvidia-smi=false", "--once"]
    res = subprocess.run(once, capture_output=True, text=True)
    assert 'xid="119"' in (textfiles / t.TEXTFILE).read_text() and "(RESET_GPU)" in res.stderr, res.stderr
    # without the catalog's copy the collector stops, naming the file
    (tmp_path / xids.CATALOG_FILE).unlink()
    res = subprocess.run(once, capture_output=True, text=True)
    assert res.returncode == 2 and f"{tmp_path}/{xids.CATALOG_FILE}: cannot read" in res.stderr, res.stderr
    # without the spec's copy they stop, naming the file
    (tmp_path / signals.SPEC_FILE).unlink()
    res = subprocess.run(["/usr/bin/python3", "-I", str(tmp_path / Path(tu.COLLECTOR).name), "--help"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and signals.SPEC_FILE in res.stderr, res.stderr


def test_systemd_accepts_the_units(tmp_path):
    """systemd's own parser (systemd-analyze verify) finds nothing to complain about in the two
    units and the receiver's."""
    from tritonfleet.observability import telemetry_units as units

    texts = {f"{units.COLLECTOR_UNIT}.service": units.collector_unit(DEFAULTS),
             f"{units.PROBE_UNIT}.service": units.probe_unit(DEFAULTS, [8000, 8010]),
             "tritonfleet-quarantine.service": units.quarantine_unit(
                 [sys.executable, "-m", "tritonfleet.cli", "quarantine", "serve", "/srv/fleet/inventories/prod.py",
                  "--listen=127.0.0.1:9095"], "/srv/fleet", "tritonfleet")}
    for name, text in texts.items():
        path = tmp_path / name
        path.write_text(text)
        res = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
        assert res.returncode == 0 and res.stderr.strip() == "", (name, res.stderr)
    broken = tmp_path / "broken.service"
    broken.write_text(texts[f"{units.COLLECTOR_UNIT}.service"].replace("Restart=always", "Restart=sometimes"))
    assert "Failed to parse" in subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True,
                                               text=True).stderr
