"""Every parser of the driver's answers reads real output of a real GPU, and the stand-in driver
answers in the same format where the two overlap.

The captures (tests/fixtures/nvidia-real-h200-580, see its SOURCES.md) come from one NVIDIA H200
with driver 580.159.04 and NVIDIA's open kernel module: the fleet's driver branch, a GPU class the
fleet does not serve. Each file is one command's output, then ``rc=<exit status>`` as its last
line, as the facts' own commands write it. The stand-in driver (tritonfleet_testbed/standin)
answers for the test hosts; here it runs locally as driver 580.159.04 and its answers are
compared with the real ones field by field: the shape of each value, not the value (the stand-in
is a T4 or an L4, not an H200).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tritonfleet.gpu import facts as gpu
from tritonfleet.gpu import guard as gpuguard
from tritonfleet.gpu import placement as gpucount
from tritonfleet.gpu import rules as gpucheck
from tritonfleet.host import kernel_module as kmod
from tritonfleet.host.facts import SecureBoot
from tritonfleet.host.layer import persistence_modes
from tritonfleet_testbed.standin_repo import STANDIN, _template, gpu_profile, parse_smi_list

REAL = Path(__file__).parents[2] / "fixtures" / "nvidia-real-h200-580"
DRIVER, CUDA = "580.159.04", "13.0"
UUID = r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
BUS = r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]"
VERSION = r"\d{3}\.\d{2,3}(\.\d{2})?"
#: the shape of each --query-gpu field's value (format, not value)
SHAPES = {"index": r"\d+", "name": r"(Tesla|NVIDIA) [A-Z]\w*", "uuid": UUID, "pci.bus_id": BUS,
          "driver_version": VERSION, "compute_cap": r"\d+\.\d", "memory.total": r"\d+( MiB)?"}


def real(name: str) -> list[str]:
    """A capture's lines, its own ``rc=`` line kept (the parsers read it as the facts write it)."""
    return (REAL / name).read_text().splitlines()


def output(name: str) -> tuple[list[str], int]:
    """(the command's output lines, its exit status): the capture without its last rc= line."""
    lines = real(name)
    assert lines[-1].startswith("rc="), f"{name}: no rc= line at the end"
    return lines[:-1], int(lines[-1][3:])


def test_every_capture_is_read_here_or_named_as_unread():
    read = {"smi-query-fact.txt", "smi-query-header.txt", "smi-record.txt", "smi-driver-version.txt",
            "smi-plain.txt", "smi-L.txt", "smi-q.txt", "smi-persistence.txt", "smi-bad-field.txt",
            "proc-version.txt", "kmod-fact.txt", "secure-boot.txt"}
    # read by no parser of tritonfleet: the deploy never runs these commands (topo, MIG, --version,
    # the device nodes, the container's OS and packages); kept as the capture's context
    unread = {"smi-topo.txt", "smi-mig.txt", "smi-version.txt", "dev-nvidia.txt", "os-release.txt",
              "packages.txt", "SOURCES.md"}
    assert {p.name for p in REAL.iterdir()} == read | unread


# ---------------------------------------------------------------- every parser reads them

def test_the_gpu_fact_reads_the_real_query():
    q = gpu.parse_query(real("smi-query-fact.txt"))
    assert q.ok and q.rc == 0, q
    [g] = q.gpus
    assert (g.index, g.name, g.uuid, g.pci_bus_id, g.driver_version, g.compute_cap, g.memory_total_mib,
            g.compute_cap_source) == (0, "NVIDIA H200", "GPU-99a62ee6-3258-17cd-89b4-0c89c9f209b9",
                                      "00000000:00:06.0", DRIVER, "9.0", 143771, "nvidia-smi")
    # the same query with the header and units
    assert gpu.parse_query(real("smi-query-header.txt")).gpus == q.gpus


def test_the_gpu_check_names_a_real_gpu_of_a_class_the_fleet_does_not_serve():
    q = gpu.parse_query(real("smi-query-fact.txt"))
    summary = gpu.parse_summary(real("smi-plain.txt"))
    problems = gpucheck.check_gpus("h200", "T4", q.gpus, summary["cuda_version"])
    assert problems and "NVIDIA H200" in " ".join(problems), problems
    assert problems[0].startswith("h200: ")


def test_the_record_query_is_the_gpu_record():
    q = gpu.parse_query(real("smi-record.txt"), fields=gpucount.RECORD_FIELDS)
    assert q.ok
    lines, _ = output("smi-record.txt")
    assert gpucount.parse_record(lines) == [{"index": 0, "pci_bus_id": "00000000:00:06.0",
                                             "uuid": "GPU-99a62ee6-3258-17cd-89b4-0c89c9f209b9",
                                             "name": "NVIDIA H200"}]
    assert gpucount.record_lines(q.gpus) == lines


def test_the_driver_version_query():
    q = gpu.parse_query(real("smi-driver-version.txt"), fields=("driver_version",))
    assert q.ok and [g.driver_version for g in q.gpus] == [DRIVER]


def test_the_summary_table():
    s = gpu.parse_summary(real("smi-plain.txt"))
    assert (s["status"], s["nvidia_smi_version"], s["driver_version"], s["cuda_version"]) == ("ok", DRIVER, DRIVER, CUDA)
    assert s["gpus"] == [{"index": 0, "name": "NVIDIA H200", "persistence_mode": "On",
                          "pci_bus_id": "00000000:00:06.0", "memory_used_mib": 0, "memory_total_mib": 143771}]


def test_the_gpu_list_and_the_gpu_loss_guard():
    lines, _ = output("smi-L.txt")
    assert parse_smi_list(lines) == [{"index": 0, "name": "NVIDIA H200",
                                      "uuid": "GPU-99a62ee6-3258-17cd-89b4-0c89c9f209b9"}]
    same = "\n".join(["@@host", *real("smi-L.txt"), "@@container", *real("smi-L.txt"), "@@end"])
    assert gpuguard.verdict(gpuguard.parse(same))[0] == "ok"
    lost = "\n".join(["@@host", *real("smi-L.txt"), "@@container", "Failed to initialize NVML: Unknown Error",
                      "rc=255", "@@end"])
    assert gpuguard.verdict(gpuguard.parse(lost))[0] == "lost"


def test_persistence_mode_from_the_grep_and_from_the_whole_report():
    lines, _ = output("smi-persistence.txt")
    assert persistence_modes("\n".join(lines)) == ["Enabled"]
    q_lines, _ = output("smi-q.txt")
    grep = [ln for ln in q_lines if "persistence mode" in ln.lower()]
    assert persistence_modes("\n".join(grep)) == ["Enabled"]
    # two GPUs, one of them off: not all enabled
    assert persistence_modes("    Persistence Mode : Enabled\n    Persistence Mode : Disabled") == ["Enabled", "Disabled"]


def test_the_bad_field_error():
    q = gpu.parse_query(real("smi-bad-field.txt"), fields=("index", "no_such_field"))
    assert (q.status, q.invalid_field, q.rc) == ("error", "no_such_field", 2)
    assert "no_such_field" in q.message


def test_the_kernel_module_line_of_the_open_module():
    proc = real("proc-version.txt")[0]
    assert kmod.from_proc(proc) == "open" and kmod.proc_version(proc) == DRIVER
    state = kmod.parse(real("kmod-fact.txt"))
    # modinfo was absent there: no installed flavour, the loaded one from /proc
    assert (state.installed, state.loaded, state.license) == (None, "open", "")
    assert state.summary() == "open (loaded)" and state.problem("open") is None
    assert "loaded module is open" in state.problem("proprietary")


def test_secure_boot_without_mokutil_or_efi():
    assert SecureBoot().process(real("secure-boot.txt")) is False


# ---------------------------------------------------------------- the stand-in against them

@pytest.fixture
def standin(tmp_path):
    """The stand-in nvidia-smi as driver 580.159.04 (an L4 with persistence on, as the deploy
    leaves it); returns run(*args) -> (lines, exit status)."""
    script = tmp_path / "nvidia-smi"
    script.write_text(_template("nvidia-smi.sh", DRIVER_VERSION=DRIVER, CUDA_VERSION=CUDA))
    (tmp_path / "etc/nvidia-standin").mkdir(parents=True)
    (tmp_path / "etc/nvidia-standin/gpu.env").write_text(
        gpu_profile("L4") + 'PERSISTENCE_MODE="On"\nMIG_MODE="Disabled"\n')

    def run(*args: str) -> tuple[list[str], int]:
        p = subprocess.run(["sh", str(script), *args], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(tmp_path),
                                "NVIDIA_STANDIN_BOOT_TIME": "0"})
        return (p.stdout + p.stderr).splitlines(), p.returncode
    return run


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.split(",")]


def assert_same_shape(fields, real_line: str, standin_line: str) -> None:
    r, s = cells(real_line), cells(standin_line)
    assert len(r) == len(s) == len(fields), (real_line, standin_line)
    assert real_line.count(", ") == standin_line.count(", ")
    for f, rv, sv in zip(fields, r, s, strict=True):
        for who, v in (("real", rv), ("stand-in", sv)):
            assert re.fullmatch(SHAPES[f], v), f"{f}: the {who} value {v!r} is not {SHAPES[f]}"


def test_standin_query_answers_like_the_real_driver(standin):
    args = gpu.QUERY_COMMAND.split()[1:]
    lines, rc = standin(*args)
    (real_line,), real_rc = output("smi-query-fact.txt")[0][:1], 0
    assert rc == real_rc and len(lines) == 1
    assert_same_shape(gpu.QUERY_FIELDS, real_line, lines[0])
    # with the header and units: the header line is the same text
    lines, rc = standin(args[0], "--format=csv")
    real_lines, real_rc = output("smi-query-header.txt")
    assert rc == real_rc and lines[0] == real_lines[0]
    assert_same_shape(gpu.QUERY_FIELDS, real_lines[1], lines[1])
    # the GPU record's query
    lines, rc = standin(f"--query-gpu={','.join(gpucount.RECORD_FIELDS)}", "--format=csv,noheader")
    real_lines, real_rc = output("smi-record.txt")
    assert rc == real_rc
    assert_same_shape(gpucount.RECORD_FIELDS, real_lines[0], lines[0])
    # the driver version alone
    lines, rc = standin("--query-gpu=driver_version", "--format=csv,noheader")
    assert (rc, [re.fullmatch(VERSION, ln) is not None for ln in lines]) == (0, [True])


def test_standin_bad_field_error_is_the_real_one(standin):
    lines, rc = standin("--query-gpu=index,no_such_field", "--format=csv,noheader,nounits")
    assert (lines, rc) == output("smi-bad-field.txt")


def test_standin_gpu_list_line_is_the_real_format(standin):
    lines, rc = standin("-L")
    real_lines, real_rc = output("smi-L.txt")
    pattern = rf"GPU \d+: (Tesla|NVIDIA) \w+ \(UUID: {UUID}\)"
    assert rc == real_rc and len(lines) == 1
    assert re.fullmatch(pattern, real_lines[0]) and re.fullmatch(pattern, lines[0]), (real_lines, lines)


def skeleton(line: str) -> str:
    """A table line's frame: the box characters where they are, everything else a space."""
    return re.sub(r"[^|+=\-]", " ", line)


def test_standin_summary_table_has_the_real_frame(standin):
    lines, rc = standin()
    real_lines, real_rc = output("smi-plain.txt")
    assert rc == real_rc and len(lines) == len(real_lines)
    for i, (r, s) in enumerate(zip(real_lines, lines, strict=True)):
        if i == 0:  # the date line: a date, then the same padding
            assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}", s) and len(r) == len(s), (r, s)
            continue
        assert len(r) == len(s) and skeleton(r) == skeleton(s), f"line {i + 1}:\nreal:     {r!r}\nstand-in: {s!r}"
    # the lines without values are the same text
    fixed = [i for i, r in enumerate(real_lines) if "H200" not in r and "MiB" not in r and i > 0
             and "Disabled" not in r and "Driver Version" not in r]
    assert [lines[i] for i in fixed] == [real_lines[i] for i in fixed]
    # and the parser reads both alike
    assert {k for g in gpu.parse_summary(lines)["gpus"] for k in g} == {k for g in gpu.parse_summary(real_lines)["gpus"] for k in g}


def test_standin_query_report_puts_its_fields_where_the_real_one_does(standin):
    lines, rc = standin("-q")
    real_lines, real_rc = output("smi-q.txt")
    assert rc == real_rc

    def labelled(ls):
        out = []
        for ln in ls:
            m = re.match(r"^( *)(\S.*?) *: ", ln)
            if m:
                out.append((m.group(2), ln[:m.end()]))  # the label and where its value starts
        return out

    theirs = labelled(real_lines)
    mine = labelled(lines)
    assert mine, lines
    where = {label: prefix for label, prefix in theirs}
    order = [label for label, _ in theirs]
    for label, prefix in mine:
        assert label in where, f"the stand-in's -q has {label!r}, the real one does not"
        assert prefix == where[label], f"{label}: real {where[label]!r}, stand-in {prefix!r}"
    seen = [order.index(label) for label, _ in mine if label in ("Product Name", "Persistence Mode", "GPU UUID")]
    assert seen == sorted(seen)
    assert persistence_modes("\n".join(ln for ln in lines if "Persistence Mode" in ln)) == ["Enabled"]
    # the GPU check's host side reads -q cut by gpufacts.summary_command: both answer alike
    for report in (lines, real_lines):
        cut = subprocess.run("f() { cat; }; " + gpu.summary_command("f"), shell=True, input="\n".join(report) + "\n",
                             capture_output=True, text=True, check=True).stdout.splitlines()
        summary = gpu.parse_summary(cut)
        assert (summary["status"], summary["driver_version"], summary["cuda_version"]) == ("ok", DRIVER, CUDA)
        assert persistence_modes("\n".join(gpu.persistence_lines(cut))) == ["Enabled"]


def test_standin_module_line_is_the_real_format(tmp_path):
    kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    root = tmp_path / "root"
    (root / f"lib/modules/{kernel}/build").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(root)}
    dkms = tmp_path / "dkms.sh"
    dkms.write_text(_template("nvidia-standin-dkms.sh", DRIVER_VERSION=DRIVER, LICENSE="Dual MIT/GPL",
                              DESCRIPTION="NVIDIA Open UNIX Kernel Module"))
    load = tmp_path / "load.sh"
    load.write_text((STANDIN / "nvidia-standin-load-module.sh").read_text())
    for script in (dkms, load):
        assert subprocess.run(["sh", str(script)], env=env, capture_output=True).returncode == 0
    mine = (root / "proc/driver/nvidia/version").read_text().splitlines()
    theirs, _ = output("proc-version.txt")
    line = (r"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  (?P<v>\S+)  Release Build  "
            r"\(\S*@\S*\)  .*")
    for ls in (theirs, mine):
        m = re.fullmatch(line, ls[0])
        assert m and m.group("v") == DRIVER, ls[0]
        assert re.fullmatch(r"GCC version:  gcc version \d+\.\d+\.\d+ .*", ls[1]), ls[1]
    assert kmod.from_proc(mine[0]) == kmod.from_proc(theirs[0]) == "open"
