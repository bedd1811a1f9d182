"""The GPU fault collector's own run on a real H200 (driver 580.159.04, open module): the
textfile it wrote there, read with the collector's own expectations
(tests/fixtures/nvidia-real-h200-580-health/collector-run, see its SOURCES.md).

* every series the collector writes for a GPU is there for the real GPU, exactly those the
  collector makes of the driver's answer to its query (what the H200 does not report, retired
  pages, is no series), and nothing else;
* the textfile is the text format the collector writes (its HELP and TYPE lines, no duplicate
  series) and prometheus_client reads it;
* the real ECC, row-remapping and clock-event values agree with the driver's own report of them
  (``nvidia-smi -q -d ECC|ROW_REMAPPER|PERFORMANCE``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tritonfleet.gpu import telemetry as t

RUN = Path(__file__).parents[2] / "fixtures" / "nvidia-real-h200-580-health" / "collector-run"
#: instantaneous gauges: query.txt was a later query than the textfile's last one
MOVING = {"temperature_celsius", "memory_temperature_celsius", "power_draw_watts", "sm_clock_hertz"}
IDENT = ("gpu", "uuid", "pci_bus_id")


def textfile() -> str:
    return (RUN / "textfile.prom").read_text()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(name, sorted labels): value}; a series written twice fails the test."""
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"series written twice: {key}"
            out[key] = s.value
    return out


def query_answer() -> str:
    text, rc = (RUN / "query.txt").read_text().rsplit("rc=", 1)
    assert rc.strip() == "0"
    return text


def real_gpus() -> list[t.GpuReading]:
    return t.parse_query(query_answer())


def smi_q(name: str) -> dict[tuple[str, ...], str]:
    """``nvidia-smi -q`` as {(section, ..., key): value}, its nesting read from the indentation."""
    out: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    for line in (RUN / name).read_text().splitlines():
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        # "GPU 00000000:00:06.0" and "Timestamp : Fri Dec  4 18:44:03 2026" have colons of their own
        key, value = (line.strip(), "") if not re.search(r"\s:\s|\s:$", line) else (key.strip(), value.strip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if value or not sep:
            out[tuple(k for _, k in stack) + (key,)] = value
        stack.append((indent, key))
    return out


def gpu_section(q: dict[tuple[str, ...], str], pci_bus_id: str) -> dict[tuple[str, ...], str]:
    return {k[1:]: v for k, v in q.items() if k[0] == f"GPU {pci_bus_id}"}


def test_the_run_passed_every_check_on_the_real_gpu():
    check = (RUN / "check.txt").read_text()
    assert "DRIVER version      : 580.159.04" in check
    assert "SUMMARY: 12/12 checks passed" in check and "FAIL" not in check
    assert (RUN / "collector.log").read_text() == ""  # no failed query, no unreadable kernel log


def test_the_textfile_is_the_collectors_text_format():
    text = textfile()
    names = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, help_text = line[len("# HELP "):].split(" ", 1)
            assert name.startswith(t.PREFIX) and help_text == t.HELP[name], line
            names.append(name)
        elif line.startswith("# TYPE "):
            name, kind = line[len("# TYPE "):].split(" ")
            assert name == names[-1]
            assert kind == ("counter" if name in t.COUNTERS else "gauge")
    assert len(names) == len(set(names)), "a metric family written twice"
    assert samples(text)  # prometheus_client reads it


def test_every_series_the_collector_makes_of_the_real_answer_is_there_and_nothing_else():
    gpus = real_gpus()
    got = samples(textfile())
    # the collector's own rendering of the driver's answer: the same series, one GPU, healthy
    want = samples(t.render(gpus, True, got[("tritonfleet_gpu_query_duration_seconds", ())], [], True))
    assert set(got) == set(want)
    for key, v in want.items():
        metric = key[0][len(t.PREFIX):]
        if metric not in MOVING:
            assert got[key] == v, key


def test_each_gpu_has_every_field_it_reports_and_none_it_does_not():
    """Per GPU: a series for every field of the query the H200 answers; none for the ``[N/A]``
    ones (it remaps rows and retires no pages: nvidia-smi --help-query-retired-pages)."""
    got = samples(textfile())
    gpus = real_gpus()
    raw = query_answer().strip().split(", ")
    assert len(raw) == len(t.FIELDS) and len(gpus) == 1
    g = gpus[0]
    ident = (("gpu", g.index), ("pci_bus_id", g.pci_bus_id), ("uuid", g.uuid))
    assert got[("tritonfleet_gpu_info", tuple(sorted((*ident, ("pci", g.pci)))))] == 1
    assert got[("tritonfleet_gpu_count", ())] == 1
    assert got[("tritonfleet_gpu_query_success", ())] == 1
    assert got[("tritonfleet_gpu_kernel_log_readable", ())] == 1
    assert not [k for k in got if k[0].startswith("tritonfleet_gpu_xid")]  # a healthy GPU: no Xid
    for (name, kind, metric, labels, _), value in zip(t.FIELDS, raw, strict=True):
        if kind == "id":
            continue
        key = (metric, tuple(sorted((*ident, *labels.items()))))
        if value.startswith("["):
            assert key not in got, f"{name} is {value} on the H200: no series"
        else:
            assert key in got, f"{name} = {value}: no series {key}"
    reported = [f for f, v in zip(t.FIELDS, raw, strict=True) if f[1] != "id" and not v.startswith("[")]
    assert {f[0] for f in t.FIELDS if f[0].startswith("retired_pages")} & {f[0] for f in reported} == set()
    assert {f[0] for f in t.FIELDS if f[0].startswith("remapped_rows")} <= {f[0] for f in reported}


def value_of(got, metric: str, gpu: t.GpuReading, **labels: str) -> float:
    ident = {"gpu": gpu.index, "pci_bus_id": gpu.pci_bus_id, "uuid": gpu.uuid, **labels}
    return got[(t.PREFIX + metric, tuple(sorted(ident.items())))]


def count(text: str) -> int:
    return int(text.split()[0])


def test_ecc_as_the_driver_reports_it():
    got, (g,) = samples(textfile()), real_gpus()
    q = gpu_section(smi_q("q-ecc.txt"), g.pci_bus_id)
    assert value_of(got, "ecc_mode_enabled", g) == (1 if q[("ECC Mode", "Current")] == "Enabled" else 0)
    for period in ("Volatile", "Aggregate"):
        e = {k[-1]: count(v) for k, v in q.items() if k[:2] == ("ECC Errors", period) and len(k) == 3
             and v[0].isdigit()}
        corrected = e["SRAM Correctable"] + e["DRAM Correctable"]
        uncorrected = e["SRAM Uncorrectable Parity"] + e["SRAM Uncorrectable SEC-DED"] + e["DRAM Uncorrectable"]
        assert value_of(got, "ecc_errors_total", g, type="corrected", period=period.lower()) == corrected
        assert value_of(got, "ecc_errors_total", g, type="uncorrected", period=period.lower()) == uncorrected


def test_row_remapping_as_the_driver_reports_it():
    got, (g,) = samples(textfile()), real_gpus()
    q = gpu_section(smi_q("q-rowremap.txt"), g.pci_bus_id)
    rows = {k[-1]: v for k, v in q.items() if k[0] == "Remapped Rows" and len(k) == 2}
    flag = {"Yes": 1, "No": 0}
    assert value_of(got, "remapped_rows", g, cause="correctable") == count(rows["Correctable Error"])
    assert value_of(got, "remapped_rows", g, cause="uncorrectable") == count(rows["Uncorrectable Error"])
    assert value_of(got, "remapped_rows_pending", g) == flag[rows["Pending"]]
    assert value_of(got, "remapped_rows_failure", g) == flag[rows["Remapping Failure Occurred"]]


#: ``nvidia-smi -q``'s names of the clock event reasons -> the collector's reason label, and the
#: bit of nvml.h's nvmlClocksEventReason* each sets in clocks_event_reasons.active
REASONS = {"Idle": ("gpu_idle", 0x1), "SW Power Cap": ("sw_power_cap", 0x4), "HW Slowdown": ("hw_slowdown", 0x8),
           "SW Thermal Slowdown": ("sw_thermal_slowdown", 0x20), "HW Thermal Slowdown": ("hw_thermal_slowdown", 0x40),
           "HW Power Brake Slowdown": ("hw_power_brake_slowdown", 0x80)}


def test_clock_event_reasons_as_the_driver_reports_them():
    got, (g,) = samples(textfile()), real_gpus()
    q = gpu_section(smi_q("q-perf.txt"), g.pci_bus_id)
    shown = {k[-1]: v for k, v in q.items() if k[0] == "Clocks Event Reasons" and len(k) > 1}
    assert set(REASONS) <= set(shown)
    mask = 0
    for name, (reason, bit) in REASONS.items():
        active = {"Active": 1, "Not Active": 0}[shown[name]]
        assert value_of(got, "clocks_event_reason_active", g, reason=reason) == active, name
        mask |= bit if active else 0
    # the other reasons (applications clocks, sync boost, display clock) are not active here either
    assert all(v == "Not Active" for k, v in shown.items() if k not in REASONS)
    assert value_of(got, "clocks_event_reasons", g) == mask


@pytest.mark.parametrize("fixture", ["q-ecc.txt", "q-rowremap.txt", "q-perf.txt"])
def test_the_driver_reports_are_of_the_same_gpu(fixture):
    (g,) = real_gpus()
    q = smi_q(fixture)
    assert q[("Driver Version",)] == "580.159.04" and q[("Attached GPUs",)] == "1"
    assert {k[0] for k in q if k[0].startswith("GPU ")} == {f"GPU {g.pci_bus_id}"}


def test_the_real_nvrm_records_are_no_xid_and_a_real_xid_line_is():
    """The kernel's NVRM records of the healthy H200 (driver load, an FBHUB interrupt cleared, the
    persistence-mode notice) are no Xid report for the collector; the same NVRM prefix with an Xid
    in the format of NVIDIA's Xid catalog is."""
    head, *lines = (RUN / "nvrm.txt").read_text().splitlines()
    assert head == "357 records read from /dev/kmsg (readable)"
    records = [line.split(" ", 1)[1] for line in lines if line.strip()]
    assert len(records) == 3 and all(r.startswith("NVRM: ") for r in records)
    assert [t.parse_xid(r) for r in records] == [None, None, None]
    xid = t.parse_xid("NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=tritonserver, GPU has fallen off the bus.")
    assert xid is not None and (xid.pci, xid.xid) == ("0000:00:06", 79)
