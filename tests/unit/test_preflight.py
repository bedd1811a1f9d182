"""Bad input is refused before any host is touched (pyinfra CLI, @fake hosts)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet import ROOT
from tritonfleet.gpu import compat, compat_data

PYINFRA = str(Path(sys.executable).parent / "pyinfra")


@pytest.fixture
def project(tmp_path):
    (tmp_path / "inventories").mkdir()
    shutil.copytree(ROOT / "inventories" / "group_data", tmp_path / "inventories" / "group_data")
    shutil.copytree(ROOT / "files", tmp_path / "files")
    (tmp_path / "inventories" / "fake.py").write_text(
        'fake = {"fake_delay": 0, "fake_delay_jitter": 0}\n'
        't4 = [("@fake/t4-a", fake)]\n'
        'l4 = [("@fake/l4-a", fake)]\n'
    )
    return tmp_path


def run(project, *data, deploy="deploys/triton.py"):
    args = [PYINFRA, "-y", "inventories/fake.py", str(ROOT / deploy)]
    for d in data:
        args[2:2] = ["--data", d]
    return subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=120)


def test_unsupported_driver_branch_is_refused(project):
    res = run(project, "nvidia_driver_branch=550")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "pre-flight failed, no host was changed" in out
    assert "550" in out and "24.08" in out
    assert "Starting operation" not in out


def test_invalid_model_repository_is_refused(project):
    cfg = project / "files/model_repository/resnet50_onnx/config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size: 64", "max_batch_size: 4"))
    res = run(project)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "pre-flight failed, no host was changed" in out
    assert "resnet50_onnx/config.pbtxt" in out and "preferred-batch-size" in out
    assert "tritonfleet validate" in out
    assert "Starting operation" not in out


def test_host_without_gpu_class_is_refused(project):
    (project / "inventories" / "fake.py").write_text(
        'hosts = [("@fake/nogroup", {"fake_delay": 0})]\n')
    res = run(project)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "no gpu_class" in out and "@fake/nogroup" in out


def test_unknown_model_in_overrides_is_refused(project):
    res = run(project, 'model_overrides={"nosuch": {"max_batch_size": 1}}')
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "nosuch" in out and "no host was changed" in out


# ---------------------------------------------------------------- host facts (pyinfra @fake)

T4_SMI = ["0, Tesla T4, GPU-84b0bf9a, 00000000:00:1E.0, 535.183.01, 7.5, 15360", "rc=0"]
L4_SMI = ["0, NVIDIA L4, GPU-3a23c669, 00000000:31:00.0, 535.183.01, 8.9, 23034", "rc=0"]
KEYS = {  # every pinned key already installed: nothing to fetch
    "cuda-archive-keyring.gpg": "EB693B3035CD5710E231E123A4B469963BF863CC",
    "docker.gpg": "9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
    "nvidia-container-toolkit-keyring.gpg": "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
}
UBUNTU = {"uname -m": "x86_64", "ls -pdL *-release": [
    "/etc/os-release", "ID=ubuntu", 'NAME="Ubuntu"', 'VERSION_ID="22.04"', "VERSION_CODENAME=jammy", "---"]}


def preflight_fake(responses, data=None, groups=("t4",), deploy_name="host"):
    """Run a deploy's pre-flight against a fake host; returns (SystemExit message or None, commands)."""
    from pyinfra.api import deploy

    from tests.support.fakehost import run_fake
    from tritonfleet import preflight

    check = {"host": preflight.host_layer, "triton": preflight.triton_layer, "all": preflight.run_all}[deploy_name]

    @deploy("pre-flight")
    def pf():
        check()

    try:
        _, cmds, _ = run_fake(pf, {**UBUNTU, **responses}, data, groups=groups)
    except SystemExit as e:
        return str(e), []
    return None, cmds


def test_clean_host_passes():
    msg, _ = preflight_fake({**KEYS, "nvidia-smi --query-gpu": T4_SMI})
    assert msg is None


def test_gpu_found_differs_from_inventory():
    msg, _ = preflight_fake({**KEYS, "nvidia-smi --query-gpu": L4_SMI})
    assert msg and "no host was changed" in msg
    assert "@fake/gpu1" in msg and "GPU class T4" in msg and "GPU 0 'NVIDIA L4'" in msg
    assert "move the host to the l4 group of the inventory" in msg
    # a bare host has no driver to ask: not refused here (the verification after the driver catches it)
    msg, _ = preflight_fake(KEYS)
    assert msg is None


def test_secure_boot_and_broken_daemon_json_are_refused():
    msg, _ = preflight_fake({**KEYS, "mokutil --sb-state": "SecureBoot enabled"})
    assert msg and "Secure Boot" in msg and "nvidia_secure_boot_ok" in msg and "@fake/gpu1" in msg
    msg, _ = preflight_fake({**KEYS, "mokutil --sb-state": "SecureBoot enabled"}, {"nvidia_secure_boot_ok": True})
    assert msg is None
    msg, _ = preflight_fake({**KEYS, "cat /etc/docker/daemon.json": "{not json"})
    assert msg and "/etc/docker/daemon.json is not valid JSON" in msg and "json.tool" in msg


@pytest.mark.parametrize("keyring,tunable", [
    ("cuda-archive-keyring.gpg", "cuda_repo_key_fingerprint"),
    ("docker.gpg", "docker_repo_key_fingerprint"),
    ("nvidia-container-toolkit-keyring.gpg", "container_toolkit_key_fingerprint"),
])
def test_vendor_key_with_another_fingerprint_is_refused(keyring, tunable):
    other = "0123456789ABCDEF0123456789ABCDEF01234567"
    responses = {k: v for k, v in KEYS.items() if k != keyring}
    # the host fetches the key (into a temporary directory) and reports its fingerprint
    msg, _ = preflight_fake({**responses, "curl -fsSL": f"fpr={other}"})
    assert msg and "no host was changed" in msg and f"has fingerprint {other}" in msg
    assert f"{tunable} pins {KEYS[keyring]}" in msg and "inventories/group_data/all.py" in msg
    msg, _ = preflight_fake({**responses, "curl -fsSL": [f"fpr={KEYS[keyring]}", "trusted=yes"]})
    assert msg is None
    # the pinned key and another one in the same file: the file is refused as a whole
    msg, _ = preflight_fake({**responses, "curl -fsSL": [f"fpr={KEYS[keyring]}", f"fpr={other}"]})
    assert msg and "holds 2 primary keys" in msg and other in msg and KEYS[keyring] in msg
    assert "exactly one primary key, the pinned one" in msg and "nothing was installed" in msg
    msg, _ = preflight_fake({**responses, "curl -fsSL": "error=curl: (6) Could not resolve host"})
    assert msg and "could not fetch" in msg and "Could not resolve host" in msg


def test_missing_registry_secret_is_refused(monkeypatch):
    monkeypatch.delenv("TRITONFLEET_REGISTRY_PASSWORD", raising=False)
    data = {"registry_user": "$oauthtoken"}
    msg, _ = preflight_fake({}, data, deploy_name="triton")
    assert msg and "nvcr.io/nvidia/tritonserver:24.08-py3 is pulled from nvcr.io" in msg
    assert "$TRITONFLEET_REGISTRY_PASSWORD is empty" in msg and "@fake/gpu1" in msg
    # an image already on the host is not pulled: no secret needed
    msg, _ = preflight_fake({"docker image inspect": "sha256:" + "a" * 64}, data, deploy_name="triton")
    assert msg is None
    # the CUDA test image comes from Docker Hub: the nvcr.io login is not for it
    msg, _ = preflight_fake(KEYS, data, deploy_name="host")
    assert msg is None
    monkeypatch.setenv("TRITONFLEET_REGISTRY_PASSWORD", "x")
    msg, _ = preflight_fake({}, data, deploy_name="triton")
    assert msg is None


def test_unknown_gpu_class_and_relative_base_dir_are_refused(project):
    res = run(project, "gpu_class=A100")
    out = res.stdout + res.stderr
    # the settings check, first of pre-flight: the value, where it was set, the known classes
    assert res.returncode != 0 and "no host was changed" in out
    assert "gpu_class = 'A100' (--data): is a GPU class tritonfleet has no rules for (known: L4, T4)" in out
    res = run(project, "triton_base_dir=../opt/triton")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "triton_base_dir '../opt/triton'" in out and "absolute" in out


@pytest.mark.parametrize("name", ["symlink-out", "broken-symlink", "absolute-symlink", "dotdot-name"])
def test_model_paths_escaping_the_repository_are_refused(project, name):
    repo = project / "files/model_repository"
    if name == "symlink-out":
        (repo / "resnet50_onnx/labels.txt").symlink_to(os.path.relpath("/etc/passwd", repo / "resnet50_onnx"))
    elif name == "broken-symlink":
        (repo / "resnet50_onnx/labels.txt").symlink_to("missing-labels.txt")
    elif name == "absolute-symlink":
        (repo / "resnet50_onnx/1/extra.onnx").symlink_to("/etc/passwd")
    else:
        (repo / "text_classifier_onnx").rename(repo / "text..classifier")
    res = run(project, deploy="deploys/models.py")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "no host was changed" in out
    expected = {"dotdot-name": "[model-name]", "broken-symlink": "[broken-symlink]"}.get(name, "[unsafe-path]")
    assert expected in out and "tritonfleet validate" in out
    assert "Starting operation" not in out


@pytest.mark.parametrize(("where", "line", "shown"), [
    ("data", "triton_http_port=eighty", "triton_http_port = 'eighty' (--data): must be a whole number from 1 to 65535"),
    ("t4.py", "triton_http_port = 70000\n",
     "triton_http_port = 70000 (inventories/group_data/t4.py): must be a whole number from 1 to 65535"),
    ("all.py", "trition_grpc_port = 9001\n",
     "trition_grpc_port = 9001 (inventories/group_data/all.py): is no setting of tritonfleet or pyinfra: "
     "did you mean triton_grpc_port?"),
    ("host", "health_timeout", "health_timeout = -1 (host data of @fake/t4-a in the inventory): must be a "
                               "number of seconds > 0"),
])
def test_settings_are_refused_by_the_deploy_naming_where_they_were_set(project, where, line, shown):
    """The deploy's pre-flight runs the settings check the fleet commands run when they load the
    inventory (tritonfleet.settings.check): the host, the setting, its value, where it was set."""
    data = []
    if where == "data":
        data = [line]
    elif where == "host":
        inv = project / "inventories" / "fake.py"
        inv.write_text(inv.read_text().replace('t4 = [("@fake/t4-a", fake)]',
                                               't4 = [("@fake/t4-a", {**fake, "health_timeout": -1})]'))
    else:
        f = project / "inventories" / "group_data" / where
        f.write_text(f.read_text() + line)
    res = run(project, *data, deploy="deploys/models.py")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "no host was changed" in out
    assert shown in out, out[-2000:]
    assert "Traceback" not in out and "Starting operation" not in out


DEBIAN12 = {"ls -pdL *-release": ["/etc/os-release", "ID=debian", 'NAME="Debian GNU/Linux"', 'VERSION_ID="12"',
                                  "VERSION_CODENAME=bookworm", "---"]}


def test_branch_missing_from_the_distros_repository_is_refused_naming_the_alternatives():
    # R535 is supported by Triton 24.08 on T4, but NVIDIA's debian12 repository has no R535
    msg, _ = preflight_fake({**KEYS, **DEBIAN12}, {"nvidia_driver_branch": "535"})
    assert msg and "no host was changed" in msg and "@fake/gpu1" in msg
    assert "driver branch 535 is not in NVIDIA's debian12 repository" in msg
    # what would work: in the repository and supported by the image (550/555 are not, for 24.08)
    assert "supports: 545, 560, 565, 570, 575, 580" in msg and "nvidia_driver_branch" in msg
    # the same branch on Ubuntu 22.04 exists there
    msg, _ = preflight_fake(KEYS, {"nvidia_driver_branch": "535"})
    assert msg is None


def test_default_branch_per_distro_must_exist_there():
    msg, _ = preflight_fake({**KEYS, **DEBIAN12}, {"nvidia_driver_branch_default": {"debian12": "535"}})
    assert msg and "driver branch 535 is not in NVIDIA's debian12 repository" in msg
    assert "nvidia_driver_branch_default['debian12'] (inventories/group_data/all.py)" in msg
    for distro_responses in (KEYS, {**KEYS, **DEBIAN12}):
        assert preflight_fake(distro_responses)[0] is None  # the shipped defaults pass


def test_version_in_another_distros_shape_is_refused():
    data = {"nvidia_driver_branch": "535", "nvidia_driver_version": "535.183.01-1~deb12u1"}
    msg, _ = preflight_fake(KEYS, data)
    assert msg and "does not have the shape of ubuntu2204's package versions" in msg
    assert "535.104.12-0ubuntu1" in msg and "give the upstream release 535.183.01" in msg
    msg, _ = preflight_fake(KEYS, {"nvidia_driver_branch": "535", "nvidia_driver_version": "560.28.03"})
    assert msg and "is not a release of branch 535" in msg
    assert preflight_fake(KEYS, {"nvidia_driver_branch": "535", "nvidia_driver_version": "535.183.01"})[0] is None


def test_preflight_names_the_cuda_image_it_will_pull(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="pyinfra"):
        assert preflight_fake(KEYS)[0] is None
    assert "the GPU verification will pull nvidia/cuda:12.8.1-base-ubuntu22.04" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pyinfra"):  # already on the host: nothing to pull
        assert preflight_fake({**KEYS, "docker image inspect": "sha256:" + "b" * 64})[0] is None
    assert "will pull" not in caplog.text


def test_compute_capability_per_triton_release(monkeypatch):
    """Triton's release notes ("GPU Requirements"): 6.0 and later through 24.x, 7.5 and later from
    25.03: a T4 (7.5) is at the floor, a Pascal class would be refused, naming both sides."""
    from tritonfleet.gpu import rules as gpucheck

    assert gpucheck.triton_min_compute_capability("nvcr.io/nvidia/tritonserver:24.08-py3") == "6.0"
    assert gpucheck.triton_min_compute_capability("nvcr.io/nvidia/tritonserver:25.02-py3") == "6.0"
    assert gpucheck.triton_min_compute_capability("nvcr.io/nvidia/tritonserver:25.03-py3") == "7.5"
    assert gpucheck.triton_min_compute_capability("nvcr.io/nvidia/tritonserver:25.08-py3@sha256:" + "a" * 64) == "7.5"
    assert gpucheck.triton_min_compute_capability("my/image:latest") is None
    for cls in ("T4", "L4"):
        assert gpucheck.compute_capability_problem(cls, "nvcr.io/nvidia/tritonserver:25.03-py3") is None
    monkeypatch.setitem(gpucheck.GPU_CLASSES, "P4", {"names": ["Tesla P4"], "compute_capability": "6.1"})
    assert gpucheck.compute_capability_problem("p4", "nvcr.io/nvidia/tritonserver:24.08-py3") is None
    problem = gpucheck.compute_capability_problem("p4", "nvcr.io/nvidia/tritonserver:25.03-py3")
    assert problem == ("nvcr.io/nvidia/tritonserver:25.03-py3 (Triton 25.03) needs compute capability 7.5 or later, "
                       "but GPU class P4 (Tesla P4) is 6.1")


# ------------------------------------------- TensorRT engines and the host's compute capability

CAPABILITIES = ["5.2", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0"]


@settings(max_examples=200, deadline=None)
@given(cc_map=st.dictionaries(st.sampled_from(CAPABILITIES), st.from_regex(r"[a-z0-9_]{1,8}\.plan", fullmatch=True),
                              max_size=5),
       cls=st.sampled_from(["T4", "L4", "t4", "l4"]))
def test_plan_for_a_class_is_refused_exactly_when_its_capability_is_not_declared(cc_map, cls):
    from tritonfleet.gpu import rules as gpucheck

    cc = gpucheck.class_compute_capability(cls)
    assert cc == gpucheck.GPU_CLASSES[cls.upper()]["compute_capability"]
    problem = gpucheck.plan_compute_capability_problem("det", cc_map, cls)
    if not cc_map or cc in cc_map:
        assert problem is None
    else:
        assert problem and "'det'" in problem and f"GPU class {cls.upper()}" in problem
        assert f"compute capability {cc}:" in problem
        assert all(k in problem for k in cc_map)
    assert gpucheck.plan_compute_capability_problem("det", cc_map, "A100") is None  # unknown class: not judged


def test_class_capabilities_agree_with_the_product_name_table():
    """GPU_CLASSES is the source; the nvidia-smi fallback table must say the same for its names."""
    from tritonfleet.gpu import rules as gpucheck
    from tritonfleet.gpu.facts import compute_capability_for

    for cls, spec in gpucheck.GPU_CLASSES.items():
        for name in spec["names"]:
            assert compute_capability_for(name) == gpucheck.class_compute_capability(cls), (cls, name)


_TRT_SHAPES = {  # how a config says TensorRT (or not), and the model file it reads
    "platform": ('platform: "tensorrt_plan"\n', "model.plan", True),
    "backend": ('backend: "tensorrt"\n', "model.plan", True),
    "dmf": ('default_model_filename: "model.plan"\n', "model.plan", True),
    "file-only": ("", "model.plan", True),
    "onnx": ('platform: "onnxruntime_onnx"\n', "model.onnx", False),
}


def _config(name, head, cc_map):
    ccs = "".join(f'cc_model_filenames {{ key: "{k}" value: "{v}" }}\n' for k, v in sorted(cc_map.items()))
    return (f'name: "{name}"\n{head}max_batch_size: 8\n'
            'input { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }\n'
            'output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }\n'
            'instance_group { kind: KIND_GPU count: 1 }\n' + ccs)


@settings(max_examples=40, deadline=None)
@given(models=st.lists(st.tuples(st.sampled_from(sorted(_TRT_SHAPES)),
                                 st.dictionaries(st.sampled_from(CAPABILITIES), st.just("engine.plan"), max_size=3)),
                       min_size=1, max_size=4))
def test_tensorrt_models_and_their_declared_capabilities_are_found(models):
    import tempfile

    from tritonfleet.model_repo.validate import tensorrt_cc_model_filenames

    with tempfile.TemporaryDirectory() as d:
        expected = {}
        for i, (shape, cc_map) in enumerate(models):
            head, file, trt = _TRT_SHAPES[shape]
            name = f"m{i}"
            (Path(d) / name / "1").mkdir(parents=True)
            (Path(d) / name / "1" / file).write_bytes(b"x")
            (Path(d) / name / "config.pbtxt").write_text(_config(name, head, cc_map))
            if trt:
                expected[name] = cc_map
        assert tensorrt_cc_model_filenames(d) == expected


def _plan_repository(root: Path) -> Path:
    """A repository whose one TensorRT model has an engine built for T4 (7.5) only, and a second
    engine file an L4 override can point at."""
    repo = root / "repo"
    (repo / "det_trt" / "1").mkdir(parents=True)
    for f in ("model_t4.plan", "model_l4.plan"):
        (repo / "det_trt" / "1" / f).write_bytes(b"engine")
    (repo / "det_trt" / "config.pbtxt").write_text(
        _config("det_trt", 'platform: "tensorrt_plan"\ndefault_model_filename: "model_t4.plan"\n',
                {"7.5": "model_t4.plan"}))
    return repo


def test_plan_built_for_another_class_is_refused(tmp_path):
    repo = _plan_repository(tmp_path)
    data = {"model_repository": str(repo)}
    msg, _ = preflight_fake({}, {**data, "gpu_class": "L4"}, groups=("l4",), deploy_name="triton")
    assert msg and "no host was changed" in msg and "@fake/gpu1" in msg
    assert "TensorRT model 'det_trt'" in msg and "compute capability 7.5 only" in msg
    assert "GPU class L4 (NVIDIA L4) is compute capability 8.9" in msg
    assert f"{repo}/det_trt/config.pbtxt" in msg
    assert 'cc_model_filenames { key: "8.9"' in msg and "inventories/group_data/l4.py" in msg
    assert "model_overrides" in msg
    # the class it was built for serves it
    assert preflight_fake({}, {**data, "gpu_class": "T4"}, groups=("t4",), deploy_name="triton")[0] is None
    # L4 given its own engine through model_overrides (the repository as the L4 host serves it)
    l4 = {"det_trt": {"cc_model_filenames": {"8.9": "model_l4.plan"}, "default_model_filename": "model_l4.plan"}}
    msg, _ = preflight_fake({}, {**data, "gpu_class": "L4", "model_overrides": l4}, groups=("l4",),
                            deploy_name="triton")
    assert msg is None
    # the models layer alone, for a host without a GPU class: which engine it needs is not known
    msg, _ = preflight_fake({}, {**data, "gpu_class": None}, groups=(), deploy_name="triton")
    assert msg and "'det_trt' declares engines per compute capability" in msg and "gpu_class None" in msg
    # the whole deploy refuses it too (after the GPU class checks)
    msg, _ = preflight_fake(KEYS, {**data, "gpu_class": "L4"}, groups=("l4",), deploy_name="all")
    assert msg and "TensorRT model 'det_trt'" in msg


def test_plan_without_declared_capabilities_is_not_judged(tmp_path):
    repo = _plan_repository(tmp_path)
    cfg = repo / "det_trt" / "config.pbtxt"
    cfg.write_text("".join(line + "\n" for line in cfg.read_text().splitlines() if "cc_model_filenames" not in line))
    msg, _ = preflight_fake({}, {"model_repository": str(repo), "gpu_class": "L4"}, groups=("l4",),
                            deploy_name="triton")
    assert msg is None


def test_image_the_branch_cannot_run_is_refused_naming_host_image_branch_and_fix():
    """tritonfleet/data/compat/: Triton 26.07 (CUDA 13.3) needs R580; R570 is refused on the host
    with both ways out (a newer branch, an older image); R580 passes."""
    image = "nvcr.io/nvidia/tritonserver:26.07-py3"
    msg, _ = preflight_fake(KEYS, {"triton_image": image, "nvidia_driver_branch": "570"})
    assert msg and "@fake/gpu1: " in msg and image in msg and "driver 570 with GPU class T4" in msg
    assert "needs driver >= 580" in msg
    assert "Fix: a driver branch that runs Triton 26.07 on T4: 580" in msg
    assert "Triton 25.03 (nvcr.io/nvidia/tritonserver:25.03-py3) or older" in msg
    assert "inventories/group_data/t4.py" in msg
    assert preflight_fake({**KEYS, "docker image inspect": "sha256:" + "b" * 64},
                          {"triton_image": image, "nvidia_driver_branch": "580"})[0] is None
    # the distro's default branch is judged the same way, naming the branches there that would work
    msg, _ = preflight_fake(KEYS, {"triton_image": image, "nvidia_driver_branch_default": {"ubuntu2204": "570"}})
    assert msg and "driver 570 (NVIDIA's ubuntu2204 repository) with GPU class T4" in msg
    assert "branches there that nvcr.io/nvidia/tritonserver:26.07-py3 supports: 580" in msg


def test_ubuntu2604_host_defaults_to_r595_and_refuses_r580():
    """NVIDIA's ubuntu2604 repository has only R595 (tritonfleet/data/nvidia_repos/ubuntu2604.toml)."""
    resolute = {"ls -pdL *-release": ["/etc/os-release", "ID=ubuntu", 'NAME="Ubuntu"', 'VERSION_ID="26.04"',
                                      "VERSION_CODENAME=resolute", "---"]}
    assert preflight_fake({**KEYS, **resolute, "docker image inspect": "sha256:" + "b" * 64})[0] is None
    msg, _ = preflight_fake({**KEYS, **resolute}, {"nvidia_driver_branch": "580"})
    assert msg and "driver branch 580 is not in NVIDIA's ubuntu2604 repository (it has 595)" in msg
    assert "supports: 595" in msg


TRIXIE = {"ls -pdL *-release": ["/etc/os-release", "ID=debian", 'NAME="Debian GNU/Linux"', 'VERSION_ID="13"',
                                "VERSION_CODENAME=trixie", "---"]}
DEBIAN_SOURCE = {"nvidia_driver_source": "debian"}


def test_debian13_refusals_name_the_archive_and_what_the_operator_can_do():
    """Debian 13's own archive has R550 only (tritonfleet/data/distro_archives/debian13-archive.toml),
    which Triton 24.08 does not support, and tritonfleet has no facts of NVIDIA's debian13 repository:
    the way on is an older image, and the message says so (not another default branch, nor NVIDIA's
    repository of a name that does not exist)."""
    older = "Use a triton_image that R550 runs on T4: Triton 24.05 (nvcr.io/nvidia/tritonserver:24.05-py3) or older"
    cuda_too = 'nvidia_driver_source = "cuda" is refused on debian13 too'
    for data in (DEBIAN_SOURCE, {**DEBIAN_SOURCE, "nvidia_driver_branch": "550"}):  # the default, or set
        msg, _ = preflight_fake({**KEYS, **TRIXIE}, data)
        assert msg and "@fake/gpu1: driver 550 (Debian 13's own archive) with GPU class T4" in msg, msg
        assert "needs driver >= 560" in msg and older in msg and cuda_too in msg
        assert "debian13-archive" not in msg and "560 (or 565" not in msg, msg
    # a branch the archive does not have: the one it has, with the image that runs on it
    msg, _ = preflight_fake({**KEYS, **TRIXIE}, {**DEBIAN_SOURCE, "nvidia_driver_branch": "580"})
    assert msg and "driver branch 580 is not in Debian 13's own archive (it has 550)" in msg, msg
    assert older in msg and 'nvidia_driver_branch = "550"' in msg and cuda_too in msg
    assert "debian13-archive" not in msg
    # what the message proposes passes
    assert preflight_fake({**KEYS, **TRIXIE, "docker image inspect": "sha256:" + "b" * 64},
                          {**DEBIAN_SOURCE, "triton_image": "nvcr.io/nvidia/tritonserver:24.05-py3"})[0] is None


def test_debian12_archive_refusal_names_nvidias_repository_as_the_way_on():
    """Debian 12's own archive has R535; NVIDIA's debian12 repository has the branch a newer image needs."""
    msg, _ = preflight_fake({**KEYS, **DEBIAN12}, {**DEBIAN_SOURCE, "triton_image": "nvcr.io/nvidia/tritonserver:26.07-py3"})
    assert msg and "driver 535 (Debian 12's own archive) with GPU class T4" in msg, msg
    assert ('or set nvidia_driver_source = "cuda" with a branch of NVIDIA\'s debian12 repository that runs it: 580'
            in msg), msg


# ---------------------------------------------------------------- lifecycle and toolkit (warnings)

def warnings_of(caplog, responses, data) -> str:
    import logging

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert preflight_fake(responses, data)[0] is None  # a warning, never a refusal
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_driver_branch_past_its_end_of_life_is_warned_naming_the_supported_branches(caplog):
    """driver_branches.toml: R570's end of life was 2026-02; R580 is supported to 2028-06."""
    text = warnings_of(caplog, KEYS, {"nvidia_driver_branch": "570"})
    assert ("@fake/gpu1: driver branch 570 (NVIDIA's ubuntu2204 repository): R570, a production branch, reached "
            "its end of life in 2026-02 (tritonfleet/data/compat/driver_branches.toml)") in text, text
    assert "branches there that run nvcr.io/nvidia/tritonserver:24.08-py3 and are supported: 580 (set " \
           "nvidia_driver_branch (inventory or inventories/group_data/t4.py)" in text, text
    assert "end of life" not in warnings_of(caplog, KEYS, {"nvidia_driver_branch": "580"})
    # Debian 13's own archive: R550 is end of life, and nothing there replaces it
    text = warnings_of(caplog, {**KEYS, **TRIXIE, "docker image inspect": "sha256:" + "b" * 64},
                       {**DEBIAN_SOURCE, "triton_image": "nvcr.io/nvidia/tritonserver:24.05-py3"})
    assert "driver branch 550 (Debian 13's own archive): R550 is an end-of-life branch" in text, text
    assert "no branch of Debian 13's own archive that runs nvcr.io/nvidia/tritonserver:24.05-py3 is supported" in text


@given(day=st.dates(min_value=date(2020, 1, 1), max_value=date(2035, 12, 31)),
       row=st.sampled_from([r for r in compat_data.branches() if r.get("end_of_life")]))
def test_a_branch_is_past_its_end_of_life_after_its_month(day, row):
    year, month = (int(p) for p in row["end_of_life"].split("-"))
    past = compat.end_of_life(row["branch"], day)
    assert (past is not None) == ((day.year, day.month) > (year, month) or row["status"] == "end of life"), past
    assert compat.end_of_life(row["branch"] + ".10.01", day) == past  # a release of the branch: the same


def test_unknown_container_toolkit_version_is_warned_naming_the_host_and_the_known_versions(caplog):
    text = warnings_of(caplog, KEYS, {"container_toolkit_version": "1.16.2-1"})
    assert "@fake/gpu1: container_toolkit_version '1.16.2-1' is not a Container Toolkit release" in text, text
    assert "known: 1.17.8, 1.18.0" in text and "1.20.1; tritonfleet/data/compat/container_toolkit.toml" in text
    for known in ("1.17.8-1", "1.20.0-1", "1.19.1-1"):  # the default, and rows of the file
        assert "container_toolkit_version" not in warnings_of(caplog, KEYS, {"container_toolkit_version": known})
