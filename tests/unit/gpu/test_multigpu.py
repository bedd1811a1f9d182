"""Multi-GPU hosts without test hosts: the instance-group placement (property tests over
configs), the GPU count against gpu_count or the host's record, the stand-in driver with several
GPUs (one fallen off), the status row and drift, and the commands the verification sends."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2

from tritonfleet.cli.fleet import status_table
from tritonfleet.fleet import probe
from tritonfleet.gpu import facts as gpufacts
from tritonfleet.gpu import placement as gpucount
from tritonfleet.inventory.roster import FleetHost
from tritonfleet.model_repo import render as models
from tritonfleet.model_repo.validate import validate_repository
from tritonfleet_testbed.standin_repo import MULTI_GPU_BUS_IDS, gpu_profile, multi_gpu_uuid

ROOT = Path(__file__).resolve().parents[3]
REPO = ROOT / "files" / "model_repository"
FIXTURES = Path(__file__).parents[2] / "fixtures" / "nvidia"
ARTICLE = {p.parent.name: p.read_text() for p in sorted(REPO.glob("*/config.pbtxt"))}

# ------------------------------------------------------------------------ placement

KINDS = ["KIND_GPU", "KIND_CPU", "KIND_AUTO", "KIND_MODEL"]


@st.composite
def groups(draw):
    out = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(KINDS))
        gpus = draw(st.sampled_from([None, [0], [1], [0, 1], [2, 0]])) if kind in ("KIND_GPU", "KIND_AUTO") else None
        out.append((draw(st.integers(1, 4)), kind, gpus))
    return out


def group_text(gs) -> str:
    parts = []
    for count, kind, gpus in gs:
        body = f"    count: {count}\n    kind: {kind}\n"
        if gpus is not None:
            body += f"    gpus: [ {', '.join(map(str, gpus))} ]\n"
        parts.append("  {\n" + body + "  }")
    return "instance_group [\n" + ",\n".join(parts) + "\n]\n"


def config_of(gs, base: str) -> str:
    head, _, _ = base.partition("instance_group [")
    return head + group_text(gs)


def parsed(text: str):
    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(text, cfg)
    return cfg


@settings(max_examples=150, deadline=None)
@given(gs=groups(), base=st.sampled_from(sorted(ARTICLE.values())), policy=st.sampled_from(gpucount.POLICIES))
def test_one_gpu_host_keeps_every_config_byte_for_byte(gs, base, policy):
    text = config_of(gs, base)
    assert gpucount.place(text, 1, policy) == text
    assert gpucount.place(text, 4, "as-written") == text


@settings(max_examples=150, deadline=None)
@given(gs=groups(), base=st.sampled_from(sorted(ARTICLE.values())), n=st.integers(2, 8))
def test_spread_lists_every_gpu_for_groups_written_gpus_0(gs, base, n):
    text = config_of(gs, base)
    out = gpucount.place(text, n, "spread")
    before, after = parsed(text), parsed(out)
    assert len(after.instance_group) == len(before.instance_group)
    for b, a in zip(before.instance_group, after.instance_group, strict=True):
        assert (a.count, a.kind) == (b.count, b.kind)  # the same count per GPU
        if b.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU and list(b.gpus) == [0]:
            assert list(a.gpus) == list(range(n))
        else:
            assert list(a.gpus) == list(b.gpus)
    # everything but the instance groups is as written
    before.ClearField("instance_group")
    after.ClearField("instance_group")
    assert before == after
    if out == text:  # nothing to place: the bytes are kept
        assert all(not (k == "KIND_GPU" and g == [0]) for _, k, g in gs)


def test_article_configs_spread_over_four_gpus_and_validate(tmp_path):
    for text in ARTICLE.values():
        assert gpucount.place(text, 1) == text
        cfg = parsed(gpucount.place(text, 4))
        assert [list(g.gpus) for g in cfg.instance_group] == [[0, 1, 2, 3]]
        assert [g.count for g in cfg.instance_group] == [g.count for g in parsed(text).instance_group]
    # the rendered copy for a 4-GPU host is what the validator checks: valid with 4 GPUs, not with 3
    four = models.render(REPO, {}, dest_root=tmp_path, placement={"gpus": 4, "policy": "spread", "models": {}})
    assert four != REPO
    assert "gpus: 3" in (four / "resnet50_onnx" / "config.pbtxt").read_text()
    assert validate_repository(four, gpus=4) == []
    problems = validate_repository(four, gpus=3)
    assert any("gpu 3 does not exist" in str(p) for p in problems), problems
    # one GPU, or every model as written: the source itself
    assert models.render(REPO, {}, dest_root=tmp_path, placement={"gpus": 1, "policy": "spread"}) == REPO
    assert models.render(REPO, {}, dest_root=tmp_path, placement={"gpus": 4, "policy": "as-written"}) == REPO
    # per model: one spread, one as written
    mixed = models.render(REPO, {}, dest_root=tmp_path, placement={
        "gpus": 4, "policy": "spread", "models": {"text_classifier_onnx": "as-written"}})
    assert (mixed / "text_classifier_onnx" / "config.pbtxt").read_text() == ARTICLE["text_classifier_onnx"]
    assert "gpus: 3" in (mixed / "resnet50_onnx" / "config.pbtxt").read_text()


def test_host_repository_release_depends_on_the_gpu_count():
    data = {"model_repository": str(REPO), "model_overrides": {}, "gpu_placement": "spread",
            "gpu_placement_models": {}}
    _, man1, rid1 = models.host_repository(data, gpus=1)
    _, _, rid1b = models.host_repository(data, gpus=None)
    _, man4, rid4 = models.host_repository(data, gpus=4)
    assert rid1 == rid1b and rid1 != rid4
    assert man1["resnet50_onnx/config.pbtxt"] == [len(ARTICLE["resnet50_onnx"].encode()),
                                                  models.file_sha256(REPO / "resnet50_onnx" / "config.pbtxt")]
    bad = {**data, "gpu_placement": "everywhere"}
    with pytest.raises(ValueError, match="gpu_placement is 'everywhere'"):
        models.host_repository(bad, gpus=4)


def test_placement_count_order():
    rec = [{"index": i, "pci_bus_id": None, "uuid": f"u{i}", "name": "Tesla T4"} for i in range(4)]
    assert gpucount.placement_count(2, rec, 3) == 2          # gpu_count first
    assert gpucount.placement_count(None, rec, 3) == 4       # then the record
    assert gpucount.placement_count(None, [], 3) == 3        # then what nvidia-smi reports now
    assert gpucount.placement_count(None, [], None) == 1     # nothing known: as written
    with pytest.raises(ValueError):
        gpucount.placement_count(0, [], None)

# ------------------------------------------------------------------------ GPU count


def t4x4() -> list[dict]:
    buses = MULTI_GPU_BUS_IDS["T4"]
    return [{"index": i, "pci_bus_id": b, "uuid": multi_gpu_uuid("T4", b), "name": "Tesla T4"}
            for i, b in enumerate(buses)]


gpu_dicts = st.lists(st.fixed_dictionaries({
    "pci_bus_id": st.from_regex(r"0000000[0-9]:[0-9A-F]{2}:[0-9A-F]{2}\.0", fullmatch=True),
    "uuid": st.uuids().map(lambda u: f"GPU-{u}"),
    "name": st.sampled_from(["Tesla T4", "NVIDIA L4"])}), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(gpus=gpu_dicts)
def test_record_round_trip(gpus):
    gpus = [{"index": i, **g} for i, g in enumerate(gpus)]
    assert gpucount.parse_record(gpucount.record_lines(gpus)) == gpus


@settings(max_examples=100, deadline=None)
@given(gone=st.sets(st.integers(0, 3), min_size=1, max_size=3))
def test_missing_gpus_named_by_index_bus_and_uuid(gone):
    rec = t4x4()
    # nvidia-smi numbers the GPUs left 0..n-1 in bus order
    found = [{**g, "index": i} for i, g in enumerate(g for g in rec if g["index"] not in gone)]
    errs = gpucount.count_problems("h (host)", found, gpucount.expected_count(None, rec), rec, "recorded")
    assert len(errs) == 1
    assert f"reports {4 - len(gone)} GPU(s), expected 4" in errs[0]
    for i in gone:
        assert f"GPU {i} ({rec[i]['pci_bus_id']}, {rec[i]['uuid']}, Tesla T4)" in errs[0]
    for i in set(range(4)) - gone:
        assert rec[i]["uuid"] not in errs[0]
    assert gpucount.record_update(found, rec) is None  # a passing check never shrinks the record


def test_count_without_record_names_missing_indexes_and_other_rules():
    found = t4x4()[:3]
    errs = gpucount.count_problems("h", found, gpucount.expected_count(4, []), [], "gpu_count")
    assert errs == ["h: reports 3 GPU(s), expected 4 (gpu_count); missing: GPU 3"]
    assert gpucount.count_problems("h", found, 3, t4x4(), "gpu_count") == []   # gpu_count 3 lets 3 pass
    assert gpucount.count_problems("h", t4x4(), None, [], "x") == []            # nothing expected yet
    assert gpucount.count_problems("h", t4x4() + t4x4()[:1], 4, t4x4(), "x") == []  # more is well
    other = [{**t4x4()[0], "name": "NVIDIA L4"}, *t4x4()[1:]]
    assert gpucount.count_problems("h", other, 4, t4x4(), "x") == [
        f"h: GPU 0 ({t4x4()[0]['pci_bus_id']}, {t4x4()[0]['uuid']}, NVIDIA L4) was recorded as 'Tesla T4'"]
    assert gpucount.record_update(t4x4(), []) == gpucount.record_lines(t4x4())
    assert gpucount.record_update(t4x4(), t4x4()[:2]) == gpucount.record_lines(t4x4())  # a GPU added
    assert gpucount.record_update(t4x4(), t4x4()) is None


def test_real_4x_t4_capture_counts_four():
    s = gpufacts.parse_summary((FIXTURES / "smi_t4x4_535.183.01.txt").read_text().splitlines())
    assert [(g["index"], g["name"], g["pci_bus_id"]) for g in s["gpus"]] == [
        (i, "Tesla T4", b) for i, b in enumerate(MULTI_GPU_BUS_IDS["T4"])]
    errs = gpucount.count_problems("h", s["gpus"][:3], 4, [], "gpu_count")
    assert errs and "missing: GPU 3" in errs[0]


# ------------------------------------------------------------------------ stand-in driver

@pytest.fixture
def smi(tmp_path):
    script = tmp_path / "nvidia-smi"
    script.write_text((ROOT / "tritonfleet_testbed/standin/nvidia-smi.sh").read_text()
                      .replace("@DRIVER_VERSION@", "580.159.04").replace("@CUDA_VERSION@", "13.0"))
    (tmp_path / "etc/nvidia-standin").mkdir(parents=True)

    def run(profile: str, *args: str, shell: str = "dash"):
        (tmp_path / "etc/nvidia-standin/gpu.env").write_text(profile)
        cmd = ["busybox", "sh"] if shell == "busybox" else [shell]
        return subprocess.run([*cmd, str(script), *args], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "NVIDIA_STANDIN_ROOT": str(tmp_path),
                                   "NVIDIA_STANDIN_BOOT_TIME": "0"})
    return run


@pytest.mark.parametrize("shell", [s for s in ("dash", "busybox") if shutil.which(s)])
@pytest.mark.parametrize("cls,name", [("T4", "Tesla T4"), ("L4", "NVIDIA L4")])
def test_standin_presents_four_gpus_and_one_missing(smi, shell, cls, name):
    p = smi(gpu_profile(cls, 4), *gpufacts.QUERY_COMMAND.split()[1:], shell=shell)
    q = gpufacts.parse_query(p.stdout.splitlines())
    assert q.ok and [(g.index, g.name, g.pci_bus_id) for g in q.gpus] == [
        (i, name, b) for i, b in enumerate(MULTI_GPU_BUS_IDS[cls])]
    assert len({g.uuid for g in q.gpus}) == 4
    table = gpufacts.parse_summary(smi(gpu_profile(cls, 4), shell=shell).stdout.splitlines())
    assert [g["pci_bus_id"] for g in table["gpus"]] == MULTI_GPU_BUS_IDS[cls]
    recorded = gpucount.parse_record(gpucount.record_lines(q.gpus))
    # back from a reboot with the GPU at position 1 gone: three left, numbered 0..2
    p3 = smi(gpu_profile(cls, 4, missing=(1,)), *gpufacts.QUERY_COMMAND.split()[1:], shell=shell)
    q3 = gpufacts.parse_query(p3.stdout.splitlines())
    assert [g.index for g in q3.gpus] == [0, 1, 2]
    errs = gpucount.count_problems("h", q3.gpus, 4, recorded, "recorded")
    assert errs == [f"h: reports 3 GPU(s), expected 4 (recorded); missing: GPU 1 "
                    f"({MULTI_GPU_BUS_IDS[cls][1]}, {q.gpus[1].uuid}, {name})"]
    listed = smi(gpu_profile(cls, 4, missing=(1,)), "-L", shell=shell).stdout.splitlines()
    assert len(listed) == 3 and q.gpus[1].uuid not in "\n".join(listed)
    none = smi(gpu_profile(cls, 2, missing=(0, 1)), shell=shell)
    assert gpufacts.parse_summary(none.stdout.splitlines())["status"] == gpufacts.STATUS_NO_GPU


def test_standin_single_gpu_output_unchanged(smi):
    p = smi(gpu_profile("T4"), "--query-gpu=index,name,pci.bus_id", "--format=csv,noheader")
    assert p.stdout == "0, Tesla T4, 00000000:00:1E.0\n"


# ------------------------------------------------------------------------ status


def fleet_host(**data) -> FleetHost:
    from tritonfleet.settings import defaults

    base = {**{k: v for k, v in vars(defaults).items() if not k.startswith("_")},
            "model_repository": str(REPO), "model_overrides": {}}
    return FleetHost("h4", ["t4"], {"ssh_hostname": "10.0.0.4", "gpu_class": "t4", **base, **data})


def probe_text(gpus: list[dict], record: list[dict]) -> str:
    gpu = "\n".join(f"{g['name']}, 580.159.04, {g['index']}, {g['pci_bus_id']}, {g['uuid']}" for g in gpus)
    return f"@gpu\n{gpu}\n@gpu_record\n" + "\n".join(gpucount.record_lines(record)) + "\n@toolkit\n1.17.4\n"


def test_status_shows_reported_and_expected_and_names_the_missing_gpu():
    rec = t4x4()
    fh = fleet_host()
    st4 = probe.interpret(fh, probe.parse(probe_text(rec, rec)))
    assert (len(st4.gpus), st4.gpu_expected) == (4, 4)
    assert "4/4x Tesla T4" in status_table([st4])
    assert not [d for d in probe.drift(st4, {}) if "GPU" in d]
    left = [{**g, "index": i} for i, g in enumerate(rec[:3])]
    st3 = probe.interpret(fh, probe.parse(probe_text(left, rec)))
    assert "3/4x Tesla T4" in status_table([st3])
    gpu_drift = [d for d in probe.drift(st3, {}) if "GPU" in d]
    assert gpu_drift == [f"reports 3 GPU(s), expected 4 (recorded); missing: GPU 3 ({rec[3]['pci_bus_id']}, "
                         f"{rec[3]['uuid']}, Tesla T4)"]
    # gpu_count over the record; the release wanted is the one placed on the expected GPUs
    st = probe.interpret(fleet_host(gpu_count=3), probe.parse(probe_text(left, rec)))
    assert st.gpu_expected == 3 and not [d for d in probe.drift(st, {}) if "GPU" in d]
    st = probe.interpret(fleet_host(gpu_count=4), probe.parse(probe_text(left, rec)))
    assert [d for d in probe.drift(st, {}) if "GPU" in d][0].startswith(
        "reports 3 GPU(s), expected 4 (gpu_count); missing: GPU 3")
    want4 = probe.intent(fh, st4)["release"]
    want1 = probe.intent(fh, probe.interpret(fh, probe.parse(probe_text(rec[:1], rec[:1]))))["release"]
    assert want4 != want1
    assert want4 == models.host_repository(fh, gpus=4)[2]


# ------------------------------------------------------------------------ the verification (@fake)

def test_verification_records_four_gpus_then_fails_naming_the_missing_one():
    from tests.support.fakehost import run_fake
    from tritonfleet.core.report import HOST_RECORD
    from tritonfleet.steps.verify import RECORD_PREFIX, SECTION, verify_gpus

    summary = (FIXTURES / "smi_t4x4_535.183.01.txt").read_text().splitlines()
    four = t4x4()
    query = [f"{g['index']}, Tesla T4, {g['uuid']}, {g['pci_bus_id']}, 535.183.01, 7.5, 15360" for g in four]
    # the GPU at 00:1D.0 gone, the one after it renumbered
    three = [q if i < 2 else q.replace(f"{i}, Tesla", f"{i - 1}, Tesla", 1) for i, q in enumerate(query) if i != 2]
    assert [t.split(",")[0] for t in three] == ["0", "1", "2"]

    def answer(q, record=()):
        return [*(RECORD_PREFIX + line for line in record), *q, SECTION, *summary, SECTION, *q, SECTION, *summary]

    # no record: passes, and the four GPUs are recorded by their own operation
    _, cmds, state = run_fake(verify_gpus, {SECTION: answer(query)}, yes=True, load_image=False)
    assert not state.failed_hosts
    probes = [c for c in cmds if "nvidia-smi" in c]
    assert len(probes) == 1 and f"sed 's/^/{RECORD_PREFIX}/' {gpucount.RECORD}" in probes[0]
    writes = [c for c in cmds if f"> {gpucount.RECORD}.tmp" in c]
    assert len(writes) == 1 and all(line in writes[0] for line in gpucount.record_lines(four))
    # recorded four, reports three: fails naming GPU 2 by index, bus id and UUID; the record stays
    _, cmds, state = run_fake(verify_gpus, {SECTION: answer(three, gpucount.record_lines(four))},
                              yes=True, load_image=False)
    assert state.failed_hosts
    report = next(c for c in cmds if HOST_RECORD in c)
    assert f"missing: GPU 2 ({four[2]['pci_bus_id']}, {four[2]['uuid']}, Tesla T4)" in report
    assert "gpu_count" in report and not any(f"> {gpucount.RECORD}.tmp" in c for c in cmds)
    # gpu_count 3 for this host: three pass, the record is kept as it is
    _, cmds, state = run_fake(verify_gpus, {SECTION: answer(three, gpucount.record_lines(four))},
                              {"gpu_count": 3}, yes=True, load_image=False)
    assert not state.failed_hosts and not any(f"> {gpucount.RECORD}.tmp" in c for c in cmds)


@pytest.mark.parametrize("bad", [0, -1, "four", 2.5, "3x"])
def test_a_bad_gpu_count_is_refused_by_pre_flight(bad):
    from tests.support.fakehost import run_fake
    from tritonfleet.preflight import triton_layer  # its PreflightError ends the run: SystemExit

    with pytest.raises(ValueError, match="gpu_count must be a whole number >= 1"):
        gpucount.expected_count(bad, [])
    # the settings check, first of pre-flight, names the value and where it was set
    with pytest.raises(SystemExit, match=rf"@fake/gpu1: gpu_count = {re.escape(repr(bad))} \(host data of "
                                              r"@fake/gpu1 in the inventory\): must be a whole number >= 1 or None$"):
        run_fake(triton_layer, {}, {"gpu_count": bad}, yes=True)
