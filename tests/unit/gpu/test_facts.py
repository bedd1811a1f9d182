"""GPU facts and checks against real nvidia-smi output (tests/fixtures/nvidia, see SOURCES.md)."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from tritonfleet.gpu import facts as gpu
from tritonfleet.gpu.rules import GPU_CLASSES, check_gpus, driver_supported, triton_release
from tritonfleet_testbed.standin_repo import parse_smi_list

FIX = Path(__file__).parents[2] / "fixtures" / "nvidia"


def lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


# fixture -> (status, driver, cuda, [(name, memory_total_mib)])
SUMMARIES = {
    "smi_t4_470.82.01.txt": ("ok", "470.82.01", "11.4", [("Tesla T4", 16127)]),
    "smi_t4_525.85.12_indented.txt": ("ok", "525.85.12", "12.0", [("Tesla T4", 15360)]),
    "smi_t4x4_535.183.01.txt": ("ok", "535.183.01", "12.2", [("Tesla T4", 15360)] * 4),
    "smi_t4_550.54.15.txt": ("ok", "550.54.15", "12.4", [("Tesla T4", 15360)]),
    "smi_l4_535.288.01.txt": ("ok", "535.288.01", "12.2", [("NVIDIA L4", 23034)]),
    "smi_l4_570.133.07.txt": ("ok", "570.133.07", "12.8", [("NVIDIA L4", 23034)]),
    "smi_l4x3_580.159.04_excerpt.txt": ("ok", "580.159.04", "13.0", [("NVIDIA L4", 23034)] * 3),
    "smi_rtx_a1000_610.43.02_kmd.txt": ("ok", "610.43.02", "13.3", [("NVIDIA RTX A1000 6GB Lap...", 6144)]),
    "smi_no_communication.txt": ("no_communication", None, None, []),
    "smi_version_mismatch_550.144.txt": ("version_mismatch", None, None, []),
    "smi_version_mismatch_570.124.txt": ("version_mismatch", None, None, []),
    "smi_no_devices.txt": ("no_gpu", None, None, []),
    "smi_L_l4.txt": ("error", None, None, []),
    "smi_q_t4_525.89.02_excerpt.txt": ("ok", "525.89.02", "12.0", []),  # -q: its header, no GPU rows
}


def test_every_smi_fixture_is_covered():
    assert {p.name for p in FIX.glob("smi_*.txt")} == set(SUMMARIES)


@pytest.mark.parametrize("name", sorted(SUMMARIES))
def test_parse_summary(name):
    status, driver, cuda, gpus = SUMMARIES[name]
    s = gpu.parse_summary(lines(name))
    assert s["status"] == status, s
    assert s["driver_version"] == driver
    assert s["cuda_version"] == cuda
    assert [(g["name"], g["memory_total_mib"]) for g in s["gpus"]] == gpus
    if status != "ok":
        assert s["message"]


def test_summary_rows_carry_bus_ids_and_persistence():
    s = gpu.parse_summary(lines("smi_t4x4_535.183.01.txt"))
    assert [g["pci_bus_id"] for g in s["gpus"]] == [
        "00000000:00:1B.0", "00000000:00:1C.0", "00000000:00:1D.0", "00000000:00:1E.0"]
    assert [g["index"] for g in s["gpus"]] == [0, 1, 2, 3]
    old = gpu.parse_summary(lines("smi_t4_470.82.01.txt"))["gpus"][0]
    assert (old["persistence_mode"], old["pci_bus_id"]) == ("On", "00000000:14:00.0")


def test_version_mismatch_message_names_the_library():
    s = gpu.parse_summary(lines("smi_version_mismatch_550.144.txt"))
    assert "550.144" in s["message"] and "reboot" in s["message"]


def test_summary_cuda_na_is_none():
    text = lines("smi_l4_535.288.01.txt")
    text[1] = text[1].replace("CUDA Version: 12.2", "CUDA Version: N/A ")
    s = gpu.parse_summary(text)
    assert s["status"] == "ok" and s["cuda_version"] is None


# query fixtures: (fields, status, [(index, name, memory, cc, cc_source)])
QUERIES = {
    "query_compute_cap_l4_570.133.07.csv": (("compute_cap",), "ok", [(0, "", None, "8.9", "nvidia-smi")]),
    "query_cc_mode_driver_name_index_570.86.15.csv": (
        ("compute_cap", "compute_mode", "driver_version", "name", "index"), "ok",
        [(0, "NVIDIA TITAN V", None, "7.0", "nvidia-smi"),
         (1, "NVIDIA RTX 5880 Ada Generation", None, "8.9", "nvidia-smi")]),
    "query_index_name_memory_cc_t4x2_noheader.csv": (
        ("index", "name", "memory.total", "compute_cap"), "ok",
        [(0, "Tesla T4", 15360, "7.5", "nvidia-smi"), (1, "Tesla T4", 15360, "7.5", "nvidia-smi")]),
    "query_name_memory_cc_driver_t4_noheader.csv": (
        ("name", "memory.total", "compute_cap", "driver_version"), "ok",
        [(0, "Tesla T4", 15360, "7.5", "nvidia-smi")]),
    "query_name_memory_l4_noheader.csv": (
        ("name", "memory.total"), "ok", [(0, "NVIDIA L4", 23034, "8.9", "name table")]),
    "query_compute_cap_invalid.txt": (gpu.QUERY_FIELDS, "error", []),
    "query_id_invalid.txt": (("id", "name", "compute_cap"), "error", []),
}


def test_every_query_fixture_is_covered():
    assert {p.name for p in FIX.glob("query_*")} == set(QUERIES)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_parse_query(name):
    fields, status, expected = QUERIES[name]
    q = gpu.parse_query(lines(name), fields)
    assert q.status == status, q
    assert [(g.index, g.name, g.memory_total_mib, g.compute_cap, g.compute_cap_source) for g in q.gpus] == expected


def test_invalid_field_is_reported_for_retry():
    q = gpu.parse_query(lines("query_compute_cap_invalid.txt"))
    assert q.invalid_field == "compute_cap" and "compute_cap" in q.message
    assert gpu.parse_query(lines("query_id_invalid.txt"), ("id",)).invalid_field == "id"


@pytest.mark.parametrize("name,status", [
    ("smi_no_communication.txt", "no_communication"),
    ("smi_version_mismatch_570.124.txt", "version_mismatch"),
    ("smi_no_devices.txt", "no_gpu"),
])
def test_query_failures_are_data(name, status):
    q = gpu.parse_query(lines(name) + ["rc=9"])
    assert q.status == status and q.gpus == [] and q.message and q.rc == 9


@pytest.mark.parametrize("text", [
    "sh: 1: nvidia-smi: not found",
    "bash: line 1: nvidia-smi: command not found",
    'docker: Error response from daemon: failed to create task for container: failed to create shim task: '
    'OCI runtime create failed: runc create failed: unable to start container process: exec: "nvidia-smi": '
    "executable file not found in $PATH: unknown.",
])
def test_missing_nvidia_smi_is_no_driver(text):
    assert gpu.parse_query([text]).status == "no_driver"


def test_query_garbage_and_exit_codes_are_errors():
    q = gpu.parse_query(["docker: Error response from daemon: could not select device driver \"\" "
                         "with capabilities: [[gpu]]."])
    assert q.status == "error" and "could not select device driver" in q.message
    assert gpu.parse_query([]).status == "no_gpu"
    assert gpu.parse_query(["0, NVIDIA L4, GPU-1, 00000000:31:00.0, 535.183.01, 8.9, 23034", "rc=3"]).status == "error"


def test_compute_capability_table():
    assert gpu.compute_capability_for("Tesla T4") == "7.5"
    assert gpu.compute_capability_for("NVIDIA L4") == "8.9"
    assert gpu.compute_capability_for("NVIDIA A10G") == "8.6"
    assert gpu.compute_capability_for("NVIDIA A100-SXM4-40GB") == "8.0"
    assert gpu.compute_capability_for("NVIDIA A100 80GB PCIe") == "8.0"
    assert gpu.compute_capability_for("NVIDIA L40S") == "8.9"
    assert gpu.compute_capability_for("GeForce GTX 780") is None
    assert gpu.compute_capability_for(None) is None


def test_parse_list():
    assert parse_smi_list(lines("smi_L_l4.txt")) == [
        {"index": 0, "name": "NVIDIA L4", "uuid": "GPU-3a23c669-1f69-c64e-cf85-44e9b07e7a2a"}]


# ---------------------------------------------------------------- the facts' shell commands

def run_fact(fact, path_dirs: list[Path]):
    env = {"PATH": ":".join([str(p) for p in path_dirs] + ["/usr/bin", "/bin"]), "LC_ALL": "C"}
    p = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True, env=env, check=False)
    assert p.returncode == 0, p.stderr
    return fact.process(p.stdout.splitlines())


def fake_smi(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    f = d / "nvidia-smi"
    f.write_text("#!/bin/sh\n" + body)
    f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return d


def test_fact_nvidia_gpus_without_nvidia_smi(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    q = run_fact(gpu.NvidiaGpus(), [empty])
    assert (q.status, q.rc) == ("no_driver", 127)


def test_fact_nvidia_gpus_ok(tmp_path):
    d = fake_smi(tmp_path, 'echo "0, NVIDIA L4, GPU-3a23c669-1f69-c64e-cf85-44e9b07e7a2a, 00000000:31:00.0, '
                           '535.288.01, 8.9, 23034"\n')
    q = run_fact(gpu.NvidiaGpus(), [d])
    assert q.ok and q.rc == 0
    g = q.gpus[0]
    assert (g.name, g.compute_cap, g.memory_total_mib, g.pci_bus_id, g.driver_version) == (
        "NVIDIA L4", "8.9", 23034, "00000000:31:00.0", "535.288.01")


def test_fact_nvidia_gpus_old_driver_falls_back_to_name_table(tmp_path):
    # an R470 nvidia-smi: no compute_cap field (exit 2, real message)
    d = fake_smi(tmp_path, 'case "$*" in *compute_cap*) cat "' + str(FIX / "query_compute_cap_invalid.txt")
                 + '"; exit 2;; esac\n'
                 'echo "0, Tesla T4, GPU-84b0bf9a-67bf-493c-9214-4fad8b125a6d, 00000000:00:1E.0, 470.82.01, 15109"\n')
    q = run_fact(gpu.NvidiaGpus(), [d])
    assert q.ok, q
    assert (q.gpus[0].compute_cap, q.gpus[0].compute_cap_source) == ("7.5", "name table")


def test_fact_nvidia_gpus_no_communication(tmp_path):
    d = fake_smi(tmp_path, f'cat "{FIX / "smi_no_communication.txt"}"; exit 9\n')
    q = run_fact(gpu.NvidiaGpus(), [d])
    assert (q.status, q.rc) == ("no_communication", 9)


# ---------------------------------------------------------------- gpucheck

def test_gpu_classes():
    assert GPU_CLASSES["T4"]["compute_capability"] == "7.5"
    assert GPU_CLASSES["L4"]["compute_capability"] == "8.9"
    assert "Tesla T4" in GPU_CLASSES["T4"]["names"]


def test_check_gpus_ok_from_real_output():
    q = gpu.parse_query(lines("query_name_memory_l4_noheader.csv"), ("name", "memory.total"))
    s = gpu.parse_summary(lines("smi_l4_535.288.01.txt"))
    assert check_gpus("tb2-l4", "l4", q.gpus, s["cuda_version"]) == []
    t4 = [{"index": 0, "name": "Tesla T4", "compute_cap": "7.5"}]
    assert check_gpus("tb1-t4", "T4", t4, "12.2", None, None) == []


def test_check_gpus_messages_name_host_expected_found():
    t4 = [{"index": 0, "name": "Tesla T4", "compute_cap": "7.5"}]
    errs = check_gpus("h1", "L4", t4, "12.2")
    assert len(errs) == 1 and "h1" in errs[0] and "L4" in errs[0] and "Tesla T4" in errs[0]
    errs = check_gpus("h1", "T4", [], "12.2")
    assert errs == ["h1: expected a T4 (Tesla T4 or NVIDIA T4, compute capability 7.5) GPU, found no GPU"]
    errs = check_gpus("h1", "A100", t4, "12.2")
    assert "unknown GPU class" in errs[0] and "T4, L4" in errs[0]
    errs = check_gpus("h1", "T4", t4, "11.4")
    assert errs == ["h1: driver supports CUDA 11.4, expected CUDA >= 12.0"]
    errs = check_gpus("h1", "T4", t4, None)
    assert "no CUDA version" in errs[0]
    errs = check_gpus("h1", "T4", t4, "12.2", min_cc="8.0")
    assert errs == ["h1: GPU 0 (Tesla T4) has compute capability 7.5, expected >= 8.0"]
    errs = check_gpus("h1", "T4", [{"index": 0, "name": "Tesla T4", "compute_cap": "8.6"}], "12.2")
    assert "expected 7.5 for class T4" in errs[0]
    errs = check_gpus("h1", "T4", [{"index": 0, "name": "Tesla T4", "compute_cap": None}], "12.2")
    assert "reports no compute capability" in errs[0]
    errs = check_gpus("h1", "T4", t4, "12.10", min_cuda="12.9")
    assert errs == []


@pytest.mark.parametrize("version,ok", [
    ("535", True), ("535.183.01", True), ("535.183.01-1", True), ("535.86.05", True),
    ("535.54.03", False), ("520", False), ("520.61.05", False), ("550", False), ("550.90.07-1", False),
    ("555", False), ("560", True), ("560.35.03-1", True), ("570.133.07", True),
    ("545", True), ("545.23.08", True), ("545.23", True), ("545.20", False),
    ("470", True), ("470.57.02", True), ("470.42.01", False), ("525.85.12", True), ("525.60.13", False),
    ("450.51.06", False), ("not-a-version", False),
])
def test_driver_supported_triton_24_08(version, ok):
    good, reason = driver_supported(version, "nvcr.io/nvidia/tritonserver:24.08-py3")
    assert good is ok, reason
    assert reason


def test_driver_supported_reasons_and_tags():
    ok, reason = driver_supported("550", "nvcr.io/nvidia/tritonserver:24.08-py3")
    assert not ok and "560" in reason and "R535 >= 535.86" in reason
    ok, reason = driver_supported("535.54.03", "24.08")
    assert not ok and "535.86" in reason
    ok, reason = driver_supported("535", "nvcr.io/nvidia/tritonserver:23.01-py3")
    assert not ok and "23.01" in reason and "24.08" in reason
    ok, reason = driver_supported("535", "nvcr.io/nvidia/tritonserver:latest")
    assert not ok and "no driver requirements known" in reason
    assert driver_supported("535", "24.08", datacenter=False)[0] is False
    assert driver_supported("555", "nvcr.io/nvidia/tritonserver:24.07-py3")[0] is True
    assert triton_release("registry.local:5000/nvidia/tritonserver:24.08-py3-sdk") == "24.08"
    assert triton_release("24.10") == "24.10"
    assert triton_release("tritonserver") is None
