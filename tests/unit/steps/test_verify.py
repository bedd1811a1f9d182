"""GPU verification in one remote command (host query + summary, then both inside one
`docker run --gpus all`), on pyinfra's @fake connector with real nvidia-smi output. The real
check runs on every testbed deploy (testbed/test_e2e.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.fakehost import run_fake
from tritonfleet.core.report import HOST_RECORD
from tritonfleet.settings import access
from tritonfleet.steps.verify import SECTION, STAMP, probe_command, split_sections, verify_gpus

FIX = Path(__file__).parents[2] / "fixtures" / "nvidia"
SUMMARY = (FIX / "smi_t4_550.54.15.txt").read_text().splitlines()
QUERY_T4 = ["0, Tesla T4, GPU-9d6c1d2e-0000-0000-0000-000000000000, 00000000:00:04.0, 550.54.15, 7.5, 15360"]
DOCKER_ERR = ['docker: Error response from daemon: could not select device driver "" with capabilities: '
              "[[gpu]]."]


def answer(host_q, host_s, cont_q, cont_s=None) -> list[str]:
    out = [*host_q, SECTION, *host_s, SECTION, *cont_q]
    if cont_s is not None:
        out += [SECTION, *cont_s]
    return out


def test_one_command_for_host_and_container():
    host, cmds, state = run_fake(verify_gpus, {SECTION: answer(QUERY_T4, SUMMARY, QUERY_T4, SUMMARY)},
                                 yes=True, load_image=False)
    assert not state.failed_hosts
    probes = [c for c in cmds if "nvidia-smi" in c]
    assert len(probes) == 1, probes
    assert probes[0] == probe_command("nvidia/cuda:12.8.1-base-ubuntu22.04", mode="changes")
    assert probes[0].count("docker run") == 1 and "--gpus all --network none" in probes[0]


def test_always_runs_the_container_every_time():
    _, cmds, state = run_fake(verify_gpus, {SECTION: answer(QUERY_T4, SUMMARY, QUERY_T4, SUMMARY)},
                              {"gpu_verify_container": "always"}, yes=True, load_image=False)
    assert not state.failed_hosts
    probes = [c for c in cmds if "nvidia-smi" in c]
    assert probes == [probe_command("nvidia/cuda:12.8.1-base-ubuntu22.04", mode="always")]
    assert STAMP not in probes[0] and not any(STAMP in c for c in cmds)


def test_a_passing_container_check_is_recorded_with_what_it_depends_on():
    fresh = answer(QUERY_T4, SUMMARY, QUERY_T4, SUMMARY) + [SECTION, "key=" + "ab" * 16]
    _, cmds, state = run_fake(verify_gpus, {SECTION: fresh}, yes=True, load_image=False)
    assert not state.failed_hosts
    writes = [c for c in cmds if f"> {STAMP}.tmp" in c]
    assert len(writes) == 1 and "key=" + "ab" * 16 in writes[0] and "Tesla T4" in writes[0]


def test_a_recorded_answer_is_checked_like_a_fresh_one():
    cached = answer(QUERY_T4, SUMMARY, QUERY_T4, SUMMARY) + [SECTION, "cached"]
    _, cmds, state = run_fake(verify_gpus, {SECTION: cached}, yes=True, load_image=False)
    assert not state.failed_hosts and not any(f"> {STAMP}" in c for c in cmds)
    # an L4 recorded for a host of the t4 class (the inventory changed): still refused
    l4 = [QUERY_T4[0].replace("Tesla T4", "NVIDIA L4").replace("7.5", "8.9")]
    bad = answer(QUERY_T4, SUMMARY, l4, SUMMARY) + [SECTION, "cached"]
    _, cmds, state = run_fake(verify_gpus, {SECTION: bad}, yes=True, load_image=False)
    assert state.failed_hosts and any(c == f"rm -f {STAMP}" for c in cmds)


def test_the_container_check_depends_on_boot_driver_toolkit_docker_and_image():
    cmd = probe_command("nvidia/cuda:12.8.1-base-ubuntu22.04", mode="changes")
    for part in ("boot_id", "echo \"$q\"", "nvidia-container-*", "docker-ce", "containerd*", "daemon.json",
                 "docker image inspect"):
        assert part in cmd, part


def test_container_failure_fails_the_host():
    _, cmds, state = run_fake(verify_gpus, {SECTION: answer(QUERY_T4, SUMMARY, DOCKER_ERR)},
                              yes=True, load_image=False)
    assert state.failed_hosts
    # one probe (the failure record left for `tritonfleet status` quotes it, and is no probe)
    assert sum("nvidia-smi" in c for c in cmds if HOST_RECORD not in c) == 1


def test_old_driver_in_container_asks_again_without_compute_cap():
    invalid = (FIX / "query_compute_cap_invalid.txt").read_text().splitlines()
    responses = {
        SECTION: answer(QUERY_T4, SUMMARY, invalid, SUMMARY),
        "--query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total":
            ["0, Tesla T4, GPU-9d6c1d2e-0000-0000-0000-000000000000, 00000000:00:04.0, 550.54.15, 15360"],
    }
    _, cmds, state = run_fake(verify_gpus, responses, yes=True, load_image=False)
    assert not state.failed_hosts, cmds
    retry = [c for c in cmds if "driver_version,memory.total" in c]
    assert len(retry) == 1 and retry[0].startswith("docker run --rm --gpus all --network none")


def test_split_sections_pads_missing_ones():
    assert split_sections(["a", SECTION, "b"], 4) == [["a"], ["b"], [], []]


def _op_results(host, state) -> dict[str, bool]:
    """{operation name: changed} of a run."""
    return {name: state.get_op_data_for_host(host, op_hash).operation_meta.did_change()
            for op_hash, meta in state.op_meta.items() for name in meta.names}


def test_the_answer_is_recorded_by_its_own_operation_a_change_only_when_new():
    fresh = answer(QUERY_T4, SUMMARY, QUERY_T4, SUMMARY) + [SECTION, "key=" + "cd" * 16]
    host, _, state = run_fake(verify_gpus, {SECTION: fresh}, yes=True, load_image=False)
    changed = _op_results(host, state)
    record = [n for n in changed if "record the GPU check's answer" in n]
    assert record and changed[record[0]] and not record[0].split(" | ")[-1].startswith("check:")
    # an answer that was recorded already: the same operation changes nothing
    cached = answer(QUERY_T4, SUMMARY, QUERY_T4, SUMMARY) + [SECTION, "cached"]
    host, _, state = run_fake(verify_gpus, {SECTION: cached}, yes=True, load_image=False)
    assert not _op_results(host, state)[record[0]]
    # planned (--dry): no change, not even a conditional one
    host, _, state = run_fake(verify_gpus, {SECTION: fresh}, load_image=False)
    assert not any(state.get_op_data_for_host(host, h).operation_meta.will_change for h in state.op_meta)


def _probe_then_verify(answer_lines):
    """Pre-flight's read of the check's host side (GpuProbe), then the check; what each sent."""
    from tritonfleet.gpu.facts import GpuRecord, NvidiaGpus
    from tritonfleet.host.gpu_probe import GpuProbe, probe_args
    from tritonfleet.pyinfra_ext import memo
    from tritonfleet.pyinfra_ext.install import tritonfleet_step

    seen = {}

    @tritonfleet_step("probe then verify")
    def deploy():
        seen["probe"] = memo.fact(GpuProbe, **probe_args("nvidia/cuda:12.8.1-base-ubuntu22.04", "nvidia-smi",
                                                         access.get("triton_image")))
        seen["gpus"] = memo.fact(NvidiaGpus, smi="nvidia-smi")
        seen["record"] = memo.fact(GpuRecord)
        verify_gpus(load_image=False)

    _, cmds, state = run_fake(deploy, {"echo stale": answer_lines,
                                       SECTION: answer(QUERY_T4, SUMMARY, QUERY_T4, SUMMARY)}, yes=True)
    return [c for c in cmds if "nvidia-smi" in c], state, seen


def test_a_valid_recorded_answer_read_by_preflight_is_the_whole_check():
    cached = [*QUERY_T4, SECTION, *SUMMARY, SECTION, *QUERY_T4, SECTION, *SUMMARY, SECTION, "cached"]
    probes, state, seen = _probe_then_verify(cached)
    assert not state.failed_hosts
    # one nvidia-smi query for the probe, the GPUs fact and the check: no query of their own, no container
    assert len(probes) == 1 and "echo stale" in probes[0] and "docker run" not in probes[0], probes
    assert seen["gpus"].ok and [g.name for g in seen["gpus"].gpus] == ["Tesla T4"] and seen["record"] == []


def test_a_stale_answer_runs_the_check_with_its_container():
    probes, state, _ = _probe_then_verify([*QUERY_T4, SECTION, *SUMMARY, SECTION, "stale"])
    assert not state.failed_hosts
    assert len(probes) == 2 and probes[1] == probe_command("nvidia/cuda:12.8.1-base-ubuntu22.04", mode="changes")
