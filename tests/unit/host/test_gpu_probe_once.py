"""A converged host's batch asks nvidia-smi what it must once: the GPU check's host side
(GpuProbe) runs the query and one ``nvidia-smi -q`` whose lines answer the CUDA version and the
persistence check, and the batch leaves out the facts the probe answers (memo.prefetch with
``derives``). On this machine through pyinfra's @local connector, with an nvidia-smi that prints
the real driver's captures (tests/fixtures/nvidia-real-h200-580: driver 580.159.04, one H200) and
counts its runs; each derived answer compared with pyinfra reading that fact on its own."""

from __future__ import annotations

import os
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
from tritonfleet.host.facts import DockerImageId
from tritonfleet.host.gpu_probe import (
    IMAGE_PREFIX,
    GpuProbe,
    depends_command,
    image_ids,
    images_command,
    probe_args,
    probe_images,
)
from tritonfleet.host.layer import persistence_modes
from tritonfleet.pyinfra_ext import memo

FIX = Path(__file__).parents[2] / "fixtures"
REAL = FIX / "nvidia-real-h200-580"
IMAGE = "tritonfleet-test/no-such-image:0"
# how GpuProbe feeds the test image's ID line to the digest (GpuProbe.command)
PROBE_ID = "printf '%s\\n' \"$ids\" | head -n 1"


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


TEST_IMAGE, TRITON_IMAGE = "nvidia/cuda:12.8.1-base-ubuntu22.04", "nvcr.io/nvidia/tritonserver:24.08-py3"
IDS = {TEST_IMAGE: "sha256:" + "1" * 64, TRITON_IMAGE: "sha256:" + "2" * 64}


def fake_docker(bin_dir: Path, have: dict[str, str]) -> Path:
    """A docker whose ``image inspect --format '{{.Id}}' NAME...`` does what docker/cli's does
    (cli/command/inspect/inspector.go, Inspect, commit e0dfb46e22c4): the found images' IDs, one
    line each in the order asked; a missing one's error on stderr and exit status 1; an empty line
    when none was found. Its runs, one line each, in bin_dir/docker-calls."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "docker"
    cases = "".join(f"    {name}) echo {image_id}; found=1 ;;\n" for name, image_id in have.items())
    script.write_text(
        "#!/bin/sh\n"
        f"echo \"$*\" >> {bin_dir / 'docker-calls'}\n"
        "[ \"$1 $2 $3\" = 'image inspect --format' ] || exit 2\n"
        "shift 4; rc=0; found=0\n"
        "for name in \"$@\"; do\n"
        "  case \"$name\" in\n"
        f"{cases}"
        "    *) echo \"Error: No such image: $name\" >&2; rc=1 ;;\n"
        "  esac\n"
        "done\n"
        "[ $found = 1 ] || echo\n"
        "exit $rc\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("have", [IDS, {TEST_IMAGE: IDS[TEST_IMAGE]}, {TRITON_IMAGE: IDS[TRITON_IMAGE]}, {}, None])
def test_one_docker_image_inspect_for_both_images_and_the_same_digest(tmp_path, have):
    """The probe's one inspect gives each image its own line and feeds the recorded answer's
    digest exactly what the test image's own inspect did (an answer recorded before stays valid)."""
    bin_dir = tmp_path / "bin"
    if have is not None:  # None: no docker at all
        fake_docker(bin_dir, have)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    images = probe_images(TEST_IMAGE, (TRITON_IMAGE,))
    shell = (f"q=query; {images_command(images)}; printf '%s\\n' \"$ids\" | sed 's/^/{IMAGE_PREFIX}/'; "
             f"echo \"new=$({depends_command(TEST_IMAGE, image_id=PROBE_ID)})\"; "
             f"echo \"old=$({depends_command(TEST_IMAGE)})\"")
    out = subprocess.run(["sh", "-c", shell], env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    keys = dict(ln.split("=", 1) for ln in out if ln[:4] in ("new=", "old="))
    # where the test image is there (an answer can only have been recorded so), the same digest;
    # without docker at all the old one hashed no line, the new one an empty line: stale either way
    assert (keys["new"] == keys["old"]) == (have is not None), keys
    ids = image_ids(out)
    assert [DockerImageId().process([line]) for line in ids + [""] * (2 - len(ids))] == \
        [(have or {}).get(TEST_IMAGE), (have or {}).get(TRITON_IMAGE)]
    if have == IDS:  # a converged host: one inspect (then the old digest's own)
        assert len((bin_dir / "docker-calls").read_text().splitlines()) == 2


def test_the_batch_answers_both_image_facts_from_the_probe(local, smi, tmp_path, monkeypatch):
    host, commands = local
    path, _ = smi
    fake_docker(tmp_path / "bin", IDS)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    images = [(DockerImageId, {"image": TEST_IMAGE}), (DockerImageId, {"image": TRITON_IMAGE})]
    memo.prefetch((GpuProbe, probe_args(TEST_IMAGE, path, TRITON_IMAGE)), *images, (Command, {"command": "true"}))
    # one command, docker asked once (the images' facts left out of the batch), the digest's own
    # inspect answered by it too
    assert len(commands) == 1 and len((tmp_path / "bin" / "docker-calls").read_text().splitlines()) == 1
    assert [memo.known(cls, **kw) for cls, kw in images] == [IDS[TEST_IMAGE], IDS[TRITON_IMAGE]]
    assert [memo.known(cls, **kw) for cls, kw in images] == [host.get_fact(cls, **kw) for cls, kw in images]
