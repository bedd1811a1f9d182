"""tritonfleet_testbed.standin_images: the docker-save archives of the stand-in images, checked the
way ``docker load`` checks them, and the tritonserver image's filesystem run for real (chroot)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

import tests.support.tritonproc as tp
from tritonfleet_testbed import standin_images as images

MODELS = ["resnet50_onnx", "text_classifier_onnx"]
CHROOT = tp.CHROOT


@pytest.fixture(scope="module")
def triton_archive() -> Path:
    return images.build_triton_image()


@pytest.fixture(scope="module")
def cuda_archive() -> Path:
    return images.build_cuda_image()


class _HashingReader:
    """A file object that hashes what is read through it."""

    def __init__(self, f):
        self.f = f
        self.sha256 = hashlib.sha256()

    def read(self, size=-1):
        data = self.f.read(size)
        self.sha256.update(data)
        return data

    def drain(self) -> str:
        while self.read(1 << 20):
            pass
        return self.sha256.hexdigest()


@functools.cache
def _scan(archive: Path) -> dict:
    """One streaming pass over ``archive``: its members in order, the small files' bytes,
    each layer tar's sha256 and the members of each layer tar."""
    out = {"members": {}, "files": {}, "layer_sha256": {}, "layer_members": {}}
    with tarfile.open(archive, "r|*") as tf:
        for m in tf:
            out["members"][m.name] = m
            if not m.isfile():
                continue
            f = tf.extractfile(m)
            if m.name.endswith("/layer.tar"):
                reader = _HashingReader(f)
                with tarfile.open(fileobj=reader, mode="r|") as layer:
                    out["layer_members"][m.name] = {e.name: e for e in layer}
                out["layer_sha256"][m.name] = reader.drain()
            else:
                out["files"][m.name] = f.read()
    return out


def _members(archive: Path) -> dict[str, tarfile.TarInfo]:
    return _scan(archive)["members"]


def _read(archive: Path, name: str) -> bytes:
    return _scan(archive)["files"][name]


def _layer_sha256(archive: Path, name: str) -> str:
    return _scan(archive)["layer_sha256"][name]


def _layer_members(archive: Path) -> dict[str, tarfile.TarInfo]:
    return _scan(archive)["layer_members"][images.read_manifest(archive)[0]["Layers"][0]]


def _extract_layer(archive: Path, dest: Path) -> Path:
    layer = images.read_manifest(archive)[0]["Layers"][0]
    dest.mkdir(parents=True)
    with tarfile.open(archive, "r:*") as tf:
        src = tf.extractfile(layer)
        proc = subprocess.Popen(
            ["tar", "--numeric-owner", "-xpf", "-", "-C", str(dest)], stdin=subprocess.PIPE
        )
        shutil.copyfileobj(src, proc.stdin, 1 << 20)
        proc.stdin.close()
        assert proc.wait() == 0
    return dest


def _env(config: dict) -> dict[str, str]:
    return tp.image_env(config["config"])


# --- archive structure, as docker load reads it --------------------------------------------


@pytest.mark.parametrize(
    "which,tag", [("triton", images.TRITON_TAG), ("cuda", images.CUDA_TAG)], ids=["triton", "cuda"]
)
def test_archive_is_docker_save_format(which, tag, triton_archive, cuda_archive):
    archive = triton_archive if which == "triton" else cuda_archive
    assert archive.parent == images.rootfs.CACHE
    assert archive.read_bytes()[:2] == b"\x1f\x8b"  # gzip: docker load decompresses it
    members = _members(archive)
    manifest = json.loads(_read(archive, "manifest.json"))
    assert len(manifest) == 1
    (entry,) = manifest
    assert entry["RepoTags"] == [tag]
    assert images.archive_tags(archive) == [tag]

    # config: named by its own sha256, which is the image ID docker shows
    config_bytes = _read(archive, entry["Config"])
    config_hex = hashlib.sha256(config_bytes).hexdigest()
    assert entry["Config"] == f"{config_hex}.json"
    assert images.image_id(archive) == f"sha256:{config_hex}"
    config = json.loads(config_bytes)
    assert config["os"] == "linux" and config["architecture"] == "amd64"
    assert config["rootfs"]["type"] == "layers"
    assert images.image_config(archive) == config

    # layers: each diff_id is the sha256 of the (uncompressed) layer tar
    assert len(config["rootfs"]["diff_ids"]) == len(entry["Layers"]) == 1
    for layer, diff_id in zip(entry["Layers"], config["rootfs"]["diff_ids"], strict=True):
        assert layer in members and members[layer].isfile()
        assert diff_id == "sha256:" + _layer_sha256(archive, layer)
        layer_dir = layer.rsplit("/", 1)[0]
        assert _read(archive, f"{layer_dir}/VERSION") == b"1.0"
        assert json.loads(_read(archive, f"{layer_dir}/json"))["id"] == layer_dir
    assert len(config["history"]) == 1

    repo, _, version = tag.rpartition(":")
    repositories = json.loads(_read(archive, "repositories"))
    assert repositories == {repo: {version: entry["Layers"][0].rsplit("/", 1)[0]}}
    # metadata ahead of the layer, so image_id() need not read the whole archive
    names = list(members)
    assert names.index("manifest.json") < names.index(entry["Layers"][0])


@pytest.mark.parametrize("which", ["triton", "cuda"])
def test_layer_entries_are_clean(which, triton_archive, cuda_archive):
    archive = triton_archive if which == "triton" else cuda_archive
    members = _layer_members(archive)
    for name, m in members.items():
        assert not name.startswith(("/", "./")) and ".." not in name.split("/"), name
        assert not (m.ischr() or m.isblk() or m.isfifo()), name
        if m.islnk():
            assert m.linkname in members, (name, m.linkname)
    assert all(members[d].isdir() for d in ("dev", "proc", "sys", "tmp"))
    assert not [n for n in members if n.startswith("dev/")]
    assert members["tmp"].mode & 0o1777 == 0o1777


def test_archives_are_cached(triton_archive, cuda_archive, monkeypatch, tmp_path):
    for build, archive in (
        (images.build_triton_image, triton_archive),
        (images.build_cuda_image, cuda_archive),
    ):
        mtime = archive.stat().st_mtime_ns
        start = time.monotonic()
        assert build() == archive
        assert time.monotonic() - start < 10
        assert archive.stat().st_mtime_ns == mtime
    # another tag is another archive (built in a scratch cache)
    monkeypatch.setattr(images.rootfs, "CACHE", tmp_path)
    other = images.build_cuda_image("example.invalid/cuda:test")
    assert other.parent == tmp_path and other.name != cuda_archive.name
    assert images.archive_tags(other) == ["example.invalid/cuda:test"]
    assert images.image_id(other) != images.image_id(cuda_archive)


# --- the tritonserver image ----------------------------------------------------------------


def test_triton_image_layout_and_config(triton_archive):
    config = images.image_config(triton_archive)
    env = _env(config)
    assert env["PATH"].split(":")[0] == "/opt/tritonserver/bin"
    assert "/opt/tritonserver/lib" in env["LD_LIBRARY_PATH"].split(":")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert config["config"]["Entrypoint"] == ["/opt/nvidia/nvidia_entrypoint.sh"]
    assert config["config"]["WorkingDir"] == "/opt/tritonserver"

    members = _layer_members(triton_archive)
    for exe in (
        "opt/tritonserver/bin/tritonserver",
        "opt/tritonserver/backends/python/triton_python_backend_stub",
        "opt/nvidia/nvidia_entrypoint.sh",
        "usr/bin/python3.11",
        "usr/bin/bash",
    ):
        m = members[exe]
        assert m.isfile() or m.issym(), exe
        if m.isfile():
            assert m.mode & stat.S_IXUSR, exe
    for f in (
        "opt/tritonserver/backends/python/libtriton_python.so",
        "opt/tritonserver/backends/python/triton_python_backend_utils.py",
        "opt/tritonserver/backends/onnxruntime/model.py",
        "opt/tritonserver/lib/"
        + next(p.name for p in images.pytriton_libs_dir().glob("libtritonserver*")),
        "usr/local/lib/python3.11/dist-packages/onnxruntime/__init__.py",
        "usr/local/lib/python3.11/dist-packages/numpy/__init__.py",
    ):
        assert members[f].isfile(), f
    # the 3.13 libpython of the wheel is not needed by anything in the image
    assert not [n for n in members if n.startswith("opt/tritonserver/lib/libpython")]
    # trimmed
    assert not [
        n
        for n in members
        if n.startswith(("usr/share/doc/", "usr/share/man/", "var/lib/apt/lists/"))
    ]
    numpy_dist = [
        n for n in members if n.startswith("usr/local/lib/python3.11/dist-packages/numpy-")
    ]
    assert numpy_dist and all("numpy-1." in n for n in numpy_dist)


def test_triton_image_size(triton_archive):
    layer = images.read_manifest(triton_archive)[0]["Layers"][0]
    size = _members(triton_archive)[layer].size
    assert size < 400 << 20, f"layer is {size >> 20} MiB"
    assert triton_archive.stat().st_size < 150 << 20


@pytest.fixture(scope="module")
def triton_root(triton_archive, tmp_path_factory) -> Iterator[Path]:
    root = _extract_layer(triton_archive, tmp_path_factory.mktemp("triton-image") / "root")
    yield root
    shutil.rmtree(root)  # 300 MB; pytest keeps old temp dirs around


def test_backend_in_image_is_the_projects(triton_root):
    image_copy = triton_root / "opt/tritonserver/backends/onnxruntime/model.py"
    assert image_copy.read_bytes() == images.backend_model_py().read_bytes()


def test_image_python_has_numpy_1_and_onnxruntime(triton_root, triton_archive):
    code = (
        "import sys, numpy, onnxruntime; print(sys.version_info[:2], numpy.__version__, "
        "onnxruntime.__version__, numpy.__file__)"
    )
    config = images.image_config(triton_archive)["config"]
    out = subprocess.run(
        tp.container_command(triton_root, "/", ["python3", "-c", code]),
        env=tp.image_env(config),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("(3, 11) 1.")
    assert " 1.18.1 /usr/local/lib/python3.11/dist-packages/numpy/" in out


def _docker_run_args() -> list[str]:
    # what the runbook's `docker run ... <image> tritonserver ...` passes
    return ["tritonserver", "--model-repository=/models", "--strict-model-config=true"]


def test_image_serves_the_repository_like_docker_run(triton_root, tmp_path):
    models = triton_root / "models"
    shutil.rmtree(models, ignore_errors=True)
    tp.copy_repository(models, kind_cpu=True)
    config = images.image_config(images.build_triton_image())["config"]
    try:
        with tp.chroot_server(triton_root, config, _docker_run_args(), tmp_path / "log") as server:
            for name in MODELS:
                assert server.model_ready(name)
            x = np.random.default_rng(5).random((1, 3, 224, 224), dtype=np.float32)
            inp = httpclient.InferInput("input", [1, 3, 224, 224], "FP32")
            inp.set_data_from_numpy(x)
            with httpclient.InferenceServerClient(server.url) as client:
                assert client.infer("resnet50_onnx", [inp]).as_numpy("output").shape == (1, 1000)

            ids = np.arange(128, dtype=np.int64).reshape(1, 128)
            requests = []
            for _ in range(32):
                a = httpclient.InferInput("input_ids", [1, 128], "INT64")
                a.set_data_from_numpy(ids)
                b = httpclient.InferInput("attention_mask", [1, 128], "INT64")
                b.set_data_from_numpy(np.ones_like(ids))
                requests.append([a, b])
            results = server.infer_at_once("text_classifier_onnx", requests)
            probs = np.concatenate([r.as_numpy("probabilities") for r in results])
            assert probs.shape == (32, 2)
            np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
            labels = '{model="text_classifier_onnx",version="1"}'
            metrics = server.metrics()
            assert metrics[f"nv_inference_request_success{labels}"] == 32
            assert metrics[f"nv_inference_exec_count{labels}"] < 32
        log = server.log()
        assert "== Triton Inference Server ==" in log  # through the image's entrypoint
        assert "/models/resnet50_onnx/1/model.onnx with CPUExecutionProvider" in log
        assert server.proc.returncode == 0
    finally:
        shutil.rmtree(models, ignore_errors=True)


def test_image_refuses_kind_gpu_without_a_gpu(triton_root, tmp_path):
    # the chroot has no driver libraries, so no GPU even on a GPU machine
    models = triton_root / "models"
    shutil.rmtree(models, ignore_errors=True)
    tp.copy_repository(models, kind_cpu=False)
    config = images.image_config(images.build_triton_image())["config"]
    try:
        with tp.chroot_server(
            triton_root, config, _docker_run_args(), tmp_path / "log", wait=False
        ) as server:
            rc = server.wait_exit(120)
    finally:
        shutil.rmtree(models, ignore_errors=True)
    assert rc == 1
    assert "specifies invalid or unsupported gpu id 0" in server.log()


# --- the cuda base image ----------------------------------------------------------------------


def test_cuda_image_config(cuda_archive):
    config = images.image_config(cuda_archive)
    env = _env(config)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env["CUDA_VERSION"] == "12.8.1"
    assert "/usr/bin" in env["PATH"].split(":")
    members = _layer_members(cuda_archive)
    assert members["usr/bin"].isdir()
    assert not [n for n in members if n.startswith("usr/bin/")]
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert cuda_archive.stat().st_size < 8 << 20


def test_cuda_image_runs_a_driver_style_nvidia_smi(cuda_archive, tmp_path):
    root = _extract_layer(cuda_archive, tmp_path / "root")
    env = _env(images.image_config(cuda_archive))
    out = subprocess.run(
        [CHROOT, str(root), "/bin/sh", "-c", "echo shell ok; ls /usr/bin | wc -l; id -u"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["shell", "ok", "0", "0"]
    # the GPU runtime hook bind-mounts the driver's (dynamically linked) nvidia-smi into
    # /usr/bin; any glibc program stands in for it here
    fake = root / "usr/bin/nvidia-smi"
    shutil.copy2("/usr/bin/echo", fake)
    out = subprocess.run(
        [CHROOT, str(root), "/bin/sh", "-c", "nvidia-smi runs from PATH"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "runs from PATH\n"
    assert os.access(root / "lib64/ld-linux-x86-64.so.2", os.X_OK)


def test_triton_image_has_the_non_root_server_user(triton_archive, triton_root):
    """Like the real image (Triton's build.py: triton-server, uid and gid 1000, named in the
    environment), so the unit's --user triton-server runs on test hosts as on real ones."""
    assert _env(images.image_config(triton_archive))["TRITON_SERVER_USER"] == "triton-server"
    assert "triton-server:x:1000:1000:" in (triton_root / "etc/passwd").read_text()
    assert "triton-server:x:1000:" in (triton_root / "etc/group").read_text()
    assert (triton_root / "home/triton-server").stat().st_uid == 1000
