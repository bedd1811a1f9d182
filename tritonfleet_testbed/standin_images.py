"""Docker image archives (``docker save`` format) for test hosts that cannot pull.

Test hosts have no GPU and no registry access; the deploy ``docker load``s these archives
(group data ``image_archives``) under the same tags the runbook pulls, so every later step
(``docker run``, the systemd unit, the health checks) runs unchanged.

``build_triton_image()``  ->  nvcr.io/nvidia/tritonserver:24.08-py3 stand-in
    Debian bookworm minbase + python3 (3.11) + numpy<2 + onnxruntime, and the real
    tritonserver (2.51) of the nvidia-pytriton wheel laid out like the real image:

        /opt/tritonserver/bin/tritonserver
        /opt/tritonserver/lib/                   its shared libraries
        /opt/tritonserver/backends/python/       libtriton_python.so, utils, 3.11 stub
        /opt/tritonserver/backends/onnxruntime/model.py   Python-based "onnxruntime" backend
        /opt/tritonserver/caches/local/
        /opt/nvidia/nvidia_entrypoint.sh         ENTRYPOINT, runs its arguments

    so ``docker run ... <tag> tritonserver --model-repository=/models`` works as on the real
    image, on CPU: model configs must use ``instance_group { kind: KIND_CPU }`` there (this
    tritonserver refuses KIND_GPU when it sees no GPU).

``build_cuda_image()``  ->  nvidia/cuda:12.8.1-base-ubuntu22.04 stand-in
    busybox (static) in /bin, the glibc runtime in /lib (so a driver-provided nvidia-smi,
    dynamically linked, runs), an empty /usr/bin and /usr/lib/x86_64-linux-gnu for the GPU
    runtime hook to fill, and the real image's NVIDIA_* environment.

Archives are ``docker save`` layout (manifest.json, repositories, <config sha256>.json,
<layer id>/{VERSION,json,layer.tar}), gzip-compressed, one layer each, cached as
CACHE/<name>-<hash of the recipe>.tar.gz. ``image_id()`` is what ``docker images --no-trunc``
shows after ``docker load``.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tritonfleet.serving.images import image_id, read_metadata  # noqa: F401 - image_id: read from here too
from tritonfleet_testbed import rootfs

TRITON_TAG = "nvcr.io/nvidia/tritonserver:24.08-py3"
CUDA_TAG = "nvidia/cuda:12.8.1-base-ubuntu22.04"

# Bump when the layout below changes: it is part of every cache key.
RECIPE_VERSION = "1"

# Debian packages of the Triton stand-in on top of minbase. libpython3.11 is the
# libpython3.11.so.1.0 the Python backend stub links against.
TRITON_DEBIAN_PACKAGES = ["python3", "libpython3.11"]
# Installed into /usr/local/lib/python3.11/dist-packages (Debian's python3 searches there).
# numpy 2 breaks the Python backend of this tritonserver; onnxruntime 1.18.1 is the version
# the 24.08 image's onnxruntime backend is built on.
TRITON_PIP_REQUIREMENTS = ["numpy<2", "onnxruntime==1.18.1"]
ROOTFS_PYTHON = "3.11"
PIP_PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64"]

TRITON_HOME = "/opt/tritonserver"
TRITON_ENV = {
    "PATH": "/opt/tritonserver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LD_LIBRARY_PATH": "/opt/tritonserver/lib:/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    "NVIDIA_TRITON_SERVER_VERSION": "24.08",
    "TRITON_SERVER_VERSION": "2.51.0",
    # the real image's non-root user (uid and gid 1000), named in its environment as here
    "TRITON_SERVER_USER": "triton-server",
    "DEBIAN_FRONTEND": "noninteractive",
}
CUDA_ENV = {
    "PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "NVARCH": "x86_64",
    "NVIDIA_REQUIRE_CUDA": "cuda>=12.8",
    "NV_CUDA_CUDART_VERSION": "12.8.90-1",
    "CUDA_VERSION": "12.8.1",
    "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
}
LABEL = {"org.tritonfleet.testbed": "stand-in image built by tritonfleet_testbed.standin_images"}

# glibc runtime of the cuda stand-in (what a driver's nvidia-smi links against)
GLIBC_LIBS = [
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
]
HOST_LIBDIR = Path("/lib/x86_64-linux-gnu")
BUSYBOX = Path("/bin/busybox")

# Trimmed from the Triton stand-in's root filesystem.
TRIM_PATHS = [
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/lintian",
    "usr/share/linda",
    "usr/share/bug",
    "usr/share/common-licenses",
    "var/cache/apt",
    "var/cache/debconf/templates.dat-old",
    "var/lib/apt/lists",
    "var/log",
]
KEEP_LOCALES = {"locale.alias"}

ENTRYPOINT_SH = """#!/bin/sh
# Entry point of the testbed's tritonserver stand-in image: like the real image's, a banner,
# then the command (a shell when none is given).
cat <<EOF

=============================
== Triton Inference Server ==
=============================

Testbed stand-in for nvcr.io/nvidia/tritonserver:24.08-py3: tritonserver ${TRITON_SERVER_VERSION}
with the python backend and a Python-based onnxruntime backend (ONNX Runtime, CPU).

EOF
if [ "$#" -eq 0 ]; then
    exec /bin/bash
fi
exec "$@"
"""


# --------------------------------------------------------------------------------------
# reading archives


def read_manifest(archive: Path) -> list[dict]:
    """manifest.json of ``archive``: [{"Config": ..., "RepoTags": [...], "Layers": [...]}]."""
    return json.loads(read_metadata(Path(archive))["manifest.json"])


def image_config(archive: Path) -> dict:
    """The image config JSON of ``archive`` (its first image)."""
    files = read_metadata(Path(archive))
    return json.loads(files[json.loads(files["manifest.json"])[0]["Config"]])


def archive_tags(archive: Path) -> list[str]:
    """The RepoTags ``docker load`` gives the image(s) of ``archive``."""
    return [tag for m in read_manifest(Path(archive)) for tag in m.get("RepoTags") or []]


# --------------------------------------------------------------------------------------
# writing archives


def _tar_layer(root: Path, out: Path) -> str:
    """Tar ``root`` (numeric owners, sorted, no ./ prefix) into ``out``; return its sha256."""
    names = sorted(p.name for p in root.iterdir())
    rootfs.run(
        [
            "tar",
            "--numeric-owner",
            "--sort=name",
            "--format=gnu",
            "-C",
            str(root),
            "-cf",
            str(out),
            *names,
        ]
    )
    h = hashlib.sha256()
    with open(out, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    info.mode = 0o644
    tf.addfile(info, io.BytesIO(data))


def write_image_archive(
    root: Path, out: Path, tags: list[str], config: dict, *, compresslevel: int = 6
) -> str:
    """Write ``root`` as a one-layer image in ``docker save`` format to ``out`` (gzip).

    ``config`` is the image's container config (Env, Entrypoint, Cmd, WorkingDir, Labels...).
    Returns the image ID (sha256 of the config JSON).
    """
    work = out.parent / f".{out.name}.parts"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        layer_tar = work / "layer.tar"
        diff_id = "sha256:" + _tar_layer(root, layer_tar)
        now = time.time()
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        image = {
            "architecture": "amd64",
            "os": "linux",
            "created": created,
            "author": "tritonfleet testbed",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": created, "created_by": "tritonfleet_testbed.standin_images"}],
        }
        config_bytes = json.dumps(image, sort_keys=True, separators=(",", ":")).encode()
        config_hex = hashlib.sha256(config_bytes).hexdigest()
        # legacy v1 layer id, as `docker save` writes it (only read by very old loaders)
        layer_id = hashlib.sha256(f"{diff_id} {config_hex}".encode()).hexdigest()
        layer_json = json.dumps(
            {"id": layer_id, "created": created, "os": "linux", "config": config}
        ).encode()
        manifest = [
            {
                "Config": f"{config_hex}.json",
                "RepoTags": list(tags),
                "Layers": [f"{layer_id}/layer.tar"],
            }
        ]
        repositories: dict[str, dict[str, str]] = {}
        for tag in tags:
            repo, _, version = tag.rpartition(":")
            repositories.setdefault(repo, {})[version] = layer_id
        mtime = int(now)
        tmp = out.with_name(out.name + ".tmp")
        with gzip.GzipFile(tmp, "wb", compresslevel=compresslevel, mtime=mtime) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tf:
                # metadata first: image_id()/archive_tags() stop reading after it
                _add_bytes(tf, f"{config_hex}.json", config_bytes, mtime)
                _add_bytes(tf, "manifest.json", json.dumps(manifest).encode(), mtime)
                _add_bytes(tf, "repositories", json.dumps(repositories).encode(), mtime)
                d = tarfile.TarInfo(layer_id)
                d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, mtime
                tf.addfile(d)
                _add_bytes(tf, f"{layer_id}/VERSION", b"1.0", mtime)
                _add_bytes(tf, f"{layer_id}/json", layer_json, mtime)
                info = tf.gettarinfo(str(layer_tar), f"{layer_id}/layer.tar")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = mtime
                with open(layer_tar, "rb") as f:
                    tf.addfile(info, f)
        tmp.rename(out)
        return "sha256:" + config_hex
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    rootfs.CACHE.mkdir(parents=True, exist_ok=True)
    with open(rootfs.CACHE / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_archive(name: str, recipe: str, build: Callable[[Path, Path], None]) -> Path:
    """CACHE/<name>-<hash(recipe)>.tar.gz, made by ``build(root_dir, out)`` when missing."""
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    out = rootfs.CACHE / f"{name}-{digest}.tar.gz"
    with _lock(name):
        if out.exists():
            return out
        work = rootfs.CACHE / f".build-{name}-{digest}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            build(work, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------
# the tritonserver stand-in


def pytriton_server_dir() -> Path:
    """The tritonserver tree bundled in the installed nvidia-pytriton wheel."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed (it provides the tritonserver binary)")
    server = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    if not (server / "bin" / "tritonserver").is_file():
        raise RuntimeError(f"no tritonserver binary under {server}")
    return server


def pytriton_libs_dir() -> Path:
    """The shared libraries the bundled tritonserver links against (nvidia_pytriton.libs)."""
    libs = pytriton_server_dir().parent.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        raise RuntimeError(f"{libs} not found")
    return libs


def backend_model_py() -> Path:
    """The Python-based onnxruntime backend installed as backends/onnxruntime/model.py."""
    return Path(__file__).resolve().parent / "backend_onnxruntime" / "model.py"


def _needed(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    return [
        line.split("[", 1)[1].rstrip("]").strip()
        for line in out.stdout.splitlines()
        if "(NEEDED)" in line
    ]


def server_libraries(binaries: list[Path], libs: Path) -> list[Path]:
    """The libraries of ``libs`` that ``binaries`` need, directly or through each other."""
    found: dict[str, Path] = {}
    todo = list(binaries)
    while todo:
        for name in _needed(todo.pop()):
            if name not in found and (libs / name).exists():
                found[name] = libs / name
                todo.append(libs / name)
    return sorted(found.values())


def _server_files(python: str = ROOTFS_PYTHON) -> dict[str, Path]:
    """{path in the image (relative to /opt/tritonserver): source file} of the server."""
    server = pytriton_server_dir()
    stub = server / "python_backend_stubs" / python / "triton_python_backend_stub"
    files = {
        "bin/tritonserver": server / "bin/tritonserver",
        "backends/python/libtriton_python.so": server / "backends/python/libtriton_python.so",
        "backends/python/triton_python_backend_utils.py": server
        / "backends/python/triton_python_backend_utils.py",
        "backends/python/triton_python_backend_stub": stub,
        "backends/onnxruntime/model.py": backend_model_py(),
    }
    for cache in sorted((server / "caches").glob("*/*.so")):
        files[f"caches/{cache.parent.name}/{cache.name}"] = cache
    binaries = [p for rel, p in files.items() if not rel.endswith(".py")]
    for lib in server_libraries(binaries, pytriton_libs_dir()):
        files[f"lib/{lib.name}"] = lib
    return files


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pytriton_version() -> str:
    try:
        return importlib.metadata.version("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _trim_rootfs(root: Path) -> None:
    for rel in TRIM_PATHS:
        p = root / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
            p.mkdir()
        elif p.exists():
            p.unlink()
    locale = root / "usr/share/locale"
    if locale.is_dir():
        for p in locale.iterdir():
            if p.name not in KEEP_LOCALES:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    for p in list(root.glob("var/cache/debconf/*-old")) + list(root.glob("var/lib/dpkg/*-old")):
        p.unlink()
    # Docker provides /dev (and /proc, /sys); leave the directories empty
    dev = root / "dev"
    if dev.is_dir():
        for p in dev.iterdir():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for rel in ("proc", "sys", "tmp", "run"):
        (root / rel).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)


def _pip_install(target: Path, requirements: list[str], python: str = ROOTFS_PYTHON) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    cmd += ["--no-compile", "--no-deps", "--only-binary=:all:", "--target", str(target)]
    for platform in PIP_PLATFORMS:
        cmd += ["--platform", platform]
    cmd += [
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        "cp" + python.replace(".", ""),
    ]
    rootfs.run(cmd + requirements, env={**os.environ, "PIP_NO_INPUT": "1"})
    # console scripts and test suites are not needed in the image
    shutil.rmtree(target / "bin", ignore_errors=True)
    for tests in list(target.glob("numpy/**/tests")):
        shutil.rmtree(tests, ignore_errors=True)


def _triton_rootfs_recipe() -> str:
    return json.dumps(
        {
            "recipe": RECIPE_VERSION,
            "suite": rootfs.SUITE,
            "debian": TRITON_DEBIAN_PACKAGES,
            "pip": TRITON_PIP_REQUIREMENTS,
            "python": ROOTFS_PYTHON,
            "trim": TRIM_PATHS,
        },
        sort_keys=True,
    )


def _build_triton_rootfs(root: Path) -> None:
    rootfs.debootstrap(root, include=TRITON_DEBIAN_PACKAGES)
    site = root / "usr/local/lib" / f"python{ROOTFS_PYTHON}" / "dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    _pip_install(site, TRITON_PIP_REQUIREMENTS)
    _trim_rootfs(root)


def triton_rootfs() -> Path:
    """Cached tar.zst of the stand-in's Debian root filesystem (before the server is added)."""
    return rootfs.cached_tarball("triton-rootfs", _triton_rootfs_recipe(), _build_triton_rootfs)


def triton_container_config() -> dict:
    return {
        "Env": [f"{k}={v}" for k, v in TRITON_ENV.items()],
        "Entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"],
        "WorkingDir": TRITON_HOME,
        "Labels": dict(LABEL),
    }


SERVER_USER = ("triton-server", 1000)


def add_server_user(root: Path) -> None:
    """The real image's ``triton-server`` user (uid and gid 1000, Triton's build.py), so the
    unit's ``--user triton-server`` runs as on the real image."""
    name, uid = SERVER_USER
    with open(root / "etc/passwd", "a") as f:
        f.write(f"{name}:x:{uid}:{uid}::/home/{name}:/bin/sh\n")
    with open(root / "etc/group", "a") as f:
        f.write(f"{name}:x:{uid}:\n")
    home = root / "home" / name
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, uid, uid)


def build_triton_image(tag: str = TRITON_TAG) -> Path:
    """The tritonserver stand-in image archive (cached); see the module docstring."""
    files = _server_files()
    recipe = json.dumps(
        {
            "rootfs": _triton_rootfs_recipe(),
            "tag": tag,
            "pytriton": _pytriton_version(),
            "files": {rel: _file_digest(src) for rel, src in files.items()},
            "entrypoint": ENTRYPOINT_SH,
            "user": SERVER_USER,
            "config": triton_container_config(),
        },
        sort_keys=True,
    )

    def build(root: Path, out: Path) -> None:
        rootfs.extract(triton_rootfs(), root)
        home = root / TRITON_HOME.lstrip("/")
        for rel, src in files.items():
            dst = home / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            dst.chmod(0o644 if rel.endswith(".py") or rel.startswith("lib/") else 0o755)
        add_server_user(root)
        entry = root / "opt/nvidia/nvidia_entrypoint.sh"
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(ENTRYPOINT_SH)
        entry.chmod(0o755)
        write_image_archive(root, out, [tag], triton_container_config())

    return cached_archive("triton-image", recipe, build)


# --------------------------------------------------------------------------------------
# the nvidia/cuda base stand-in


def cuda_container_config() -> dict:
    return {
        "Env": [f"{k}={v}" for k, v in CUDA_ENV.items()],
        "Cmd": ["/bin/sh"],
        "Labels": {**LABEL, "maintainer": "tritonfleet testbed"},
    }


def _busybox_applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True)
    return sorted({a for a in out.stdout.split() if a and "/" not in a and a != "busybox"})


def _build_cuda_root(root: Path) -> None:
    for d in (
        "bin",
        "sbin",
        "etc/ld.so.conf.d",
        "lib/x86_64-linux-gnu",
        "usr/bin",
        "usr/sbin",
        "usr/lib/x86_64-linux-gnu",
        "usr/local/bin",
        "proc",
        "sys",
        "dev",
        "run",
        "var/run",
        "root",
        "tmp",
        "home",
    ):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "root").chmod(0o700)
    shutil.copyfile(BUSYBOX, root / "bin/busybox")
    (root / "bin/busybox").chmod(0o755)
    for applet in _busybox_applets(BUSYBOX):
        (root / "bin" / applet).symlink_to("busybox")
    for name in GLIBC_LIBS:
        shutil.copyfile((HOST_LIBDIR / name).resolve(), root / "lib/x86_64-linux-gnu" / name)
        (root / "lib/x86_64-linux-gnu" / name).chmod(0o755)
    (root / "lib64").mkdir()
    (root / "lib64/ld-linux-x86-64.so.2").symlink_to("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    etc = root / "etc"
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    )
    (etc / "group").write_text("root:x:0:\nvideo:x:44:\nnogroup:x:65534:\n")
    (etc / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (etc / "ld.so.conf.d/x86_64-linux-gnu.conf").write_text(
        "/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"
    )
    (etc / "os-release").write_text(
        'NAME="BusyBox"\nID=busybox\n'
        'PRETTY_NAME="testbed stand-in for nvidia/cuda:12.8.1-base-ubuntu22.04 (busybox, glibc)"\n'
    )


def build_cuda_image(tag: str = CUDA_TAG) -> Path:
    """The nvidia/cuda base stand-in image archive (cached); see the module docstring."""
    sources = [BUSYBOX] + [(HOST_LIBDIR / n).resolve() for n in GLIBC_LIBS]
    recipe = json.dumps(
        {
            "recipe": RECIPE_VERSION,
            "tag": tag,
            "files": {str(p): _file_digest(p) for p in sources},
            "config": cuda_container_config(),
            "layout": "busybox-glibc-1",
        },
        sort_keys=True,
    )

    def build(root: Path, out: Path) -> None:
        _build_cuda_root(root)
        write_image_archive(root, out, [tag], cuda_container_config())

    return cached_archive("cuda-image", recipe, build)
