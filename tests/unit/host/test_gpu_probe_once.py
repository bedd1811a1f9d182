"""A converged host's batch asks nvidia-smi what it must once: the GPU check's host side
(GpuProbe) runs the query and one ``nvidia-smi -q`` whose lines answer the CUDA version and the
persistence check, and the batch leaves out the facts the probe answers (memo.prefetch with
``derives``). On this machine through pyinfra's @local connector, with an nvidia-smi that prints
the real driver's captures (tests/fixtures/nvidia-real-h200-580: driver 580.159.04, one H200) and
counts its runs; each derived answer compared with pyinfra reading that fact on its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.connectors.local import LocalConnector
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.server import Command

from tritonfleet.gpu import facts as gpufacts
from tritonfleet.host import kernel_module as kmod
from tritonfleet.host.gpu_probe import GpuProbe
from tritonfleet.host.layer import persistence_modes
from tritonfleet.pyinfra_ext import memo

FIX = Path(__file__).parents[2] / "fixtures"
REAL = FIX / "nvidia-real-h200-580"
IMAGE = "tritonfleet-test/no-such-image:0"


def without_rc(name: str, root: Path = REAL) -> list[str]:
    return [ln for ln in (root / name).read_text().splitlines() if not ln.startswith("rc=")]


@pytest.fixture
def smi(tmp_path):
    """An nvidia-smi answering with the real captures; its runs, one line each, in ``calls``."""
    calls = tmp_path / "calls"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f"echo \"$*\" >> {calls}\n"
        "case \"$1\" in\n"
        f"  -q) grep -v '^rc=' {REAL / 'smi-q.txt'} ;;\n"
        f"  --query-gpu=driver_version) grep -v '^rc=' {REAL / 'smi-driver-version.txt'} ;;\n"
        f"  --query-gpu=*) grep -v '^rc=' {REAL / 'smi-query-fact.txt'} ;;\n"
        f"  *) grep -v '^rc=' {REAL / 'smi-plain.txt'} ;;\n"
        "esac\n")
    script.chmod(0o755)
    return str(script), calls


@pytest.fixture
def local(monkeypatch):
    inventory = Inventory(([("@local", {})], {}))
    state = State(inventory, Config(), check_for_changes=False)
    connect_all(state)
    host = inventory.get_host("@local")
    commands = []
    real = LocalConnector.run_shell_command

    def counted(self, command, *args, **kwargs):
        commands.append(str(command))
        return real(self, command, *args, **kwargs)

    monkeypatch.setattr(LocalConnector, "run_shell_command", counted)
    with ctx_state.use(state), ctx_host.use(host):
        yield host, commands


def test_the_batch_runs_nvidia_smi_twice_and_answers_the_persistence_check(local, smi):
    host, commands = local
    path, calls = smi
    persistence = (Command, {"command": gpufacts.persistence_command(path)})
    driver = (Command, {"command": gpufacts.driver_version_command(path)})
    module = (Command, {"command": kmod.COMMAND})
    memo.prefetch((GpuProbe, {"image": IMAGE, "smi": path}), persistence, driver, module, (Command, {"command": "true"}))
    assert len(commands) == 1
    # the query and -q, each once: not the plain table, nor the driver version's or -q's own runs
    assert [c.split()[0] for c in calls.read_text().splitlines()] == ["--query-gpu=index,name,uuid,pci.bus_id,"
                                                                    "driver_version,compute_cap,memory.total", "-q"]
    for cls, kwargs in (persistence, driver, module):
        assert memo.known(cls, **kwargs) is not None, kwargs
        assert memo.known(cls, **kwargs) == host.get_fact(cls, **kwargs), kwargs  # as the fact's own command
    assert memo.known(Command, **persistence[1]) == "    Persistence Mode                                   : Enabled"
    assert memo.known(gpufacts.NvidiaGpus, smi=path).gpus[0].name == "NVIDIA H200"
    assert len(commands) == 1 + 3  # only the comparisons above asked again


def test_a_fact_the_probe_could_not_answer_is_read_on_its_own(local, tmp_path):
    host, commands = local
    broken = tmp_path / "nvidia-smi"
    broken.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    broken.chmod(0o755)
    driver = (Command, {"command": gpufacts.driver_version_command(str(broken))})
    memo.prefetch((GpuProbe, {"image": IMAGE, "smi": str(broken)}), driver, (Command, {"command": "true"}))
    assert len(commands) == 1 and memo.known(Command, **driver[1]) is None
    assert "mismatch" in memo.fact(Command, **driver[1])  # read on its own
    assert len(commands) == 2


def filtered(lines: list[str]) -> list[str]:
    """What summary_command leaves of nvidia-smi -q's lines (the real grep on this machine)."""
    out = subprocess.run("f() { cat; }; " + gpufacts.summary_command("f"), shell=True, input="\n".join(lines) + "\n",
                         capture_output=True, text=True, check=False)
    return out.stdout.splitlines()


@pytest.mark.parametrize("name,root,driver,cuda,modes", [
    ("smi-q.txt", REAL, "580.159.04", "13.0", ["Enabled"]),
    ("smi_q_t4_525.89.02_excerpt.txt", FIX / "nvidia", "525.89.02", "12.0", ["Disabled"]),
])
def test_the_cuda_version_and_persistence_mode_from_the_real_q_report(name, root, driver, cuda, modes):
    lines = filtered(without_rc(name, root))
    assert len(lines) < 12  # the header, the GPU's bus id, its persistence mode: not the whole report
    s = gpufacts.parse_summary(lines)
    assert (s["status"], s["driver_version"], s["cuda_version"]) == ("ok", driver, cuda)
    assert gpufacts.parse_summary(without_rc(name, root))["cuda_version"] == cuda  # the whole report too
    assert persistence_modes("\n".join(gpufacts.persistence_lines(lines))) == modes


def test_the_q_header_without_a_cuda_version_and_nvidia_smis_failures():
    # a vGPU host driver's -q header (535.129.03, tests/fixtures/nvidia/SOURCES.md)
    s = gpufacts.parse_summary(["==============NVSMI LOG==============", "Driver Version : 535.129.03",
                                "CUDA Version                              : Not Found"])
    assert (s["status"], s["driver_version"], s["cuda_version"]) == ("ok", "535.129.03", None)
    for name, status in (("smi_no_communication.txt", "no_communication"),
                         ("smi_version_mismatch_570.124.txt", "version_mismatch")):
        assert gpufacts.parse_summary(filtered(without_rc(name, FIX / "nvidia")))["status"] == status
    assert gpufacts.parse_summary(["Timestamp : x"])["status"] == "error"
