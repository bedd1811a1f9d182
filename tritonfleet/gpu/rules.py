"""Rules a host's GPUs and driver must meet: the GPU class it is in, and Triton's driver needs.

``check_gpus`` compares what nvidia-smi reported with the host's GPU class and the minimum
compute capability / CUDA version; ``driver_supported`` says whether a driver branch or version
can run a Triton release (its release notes' "Driver Requirements").
"""

from __future__ import annotations

import re

from . import compat_data

GPU_CLASSES = {
    "T4": {"names": ["Tesla T4", "NVIDIA T4"], "compute_capability": "7.5"},
    "L4": {"names": ["NVIDIA L4"], "compute_capability": "8.9"},
}

# Triton container release -> CUDA it is built on, the driver that CUDA needs, and the older
# data-center branches that CUDA's forward-compatibility package supports (branch -> minimum).
# From NVIDIA's Triton Inference Server release notes ("Driver Requirements"), one row a release
# with its sources in tritonfleet/data/compat/triton_images.toml; e.g. 24.08: "based on CUDA 12.6
# which requires NVIDIA Driver release 560 or later. However, if you are running on a data center
# GPU (for example, T4 or any other data center GPU), you can use NVIDIA driver release 470.57 (or
# later R470), 525.85 (or later R525), 535.86 (or later R535), or 545.23 (or later R545)."  R550 and
# R555 are in neither list, so they are refused for 24.08. min_driver is the stricter of the notes'
# branch and the first branch of the CUDA major version (CUDA 13: R580; compat_data.min_driver).
TRITON_DRIVER_REQUIREMENTS = {
    row["release"]: {
        "cuda": row["cuda"],
        "min_driver": compat_data.min_driver(row),
        "datacenter": dict(row["datacenter"]),
    }
    for row in compat_data.images()
}

# Triton container release -> the lowest CUDA compute capability it supports, from the release notes'
# "GPU Requirements" (docs.nvidia.com/deeplearning/triton-inference-server/release-notes/): every
# release from 19.02 through 24.x says "supports CUDA compute capability 6.0 and later" (e.g. 24.03,
# 24.04: "... 6.0 and later. This corresponds to GPUs in the NVIDIA Pascal, NVIDIA Volta, NVIDIA
# Turing, ..."); from 25.03 on Triton needs 7.5 (Turing) or later (not confirmed from the 25.03 notes
# themselves here: see docs/operations.md). Each entry holds from its release until the next entry.
TRITON_MIN_COMPUTE_CAPABILITY = (("19.02", "6.0"), ("25.03", "7.5"))


def triton_min_compute_capability(image_or_tag: str) -> str | None:
    """The lowest compute capability the Triton release of ``image_or_tag`` supports (None: not a
    Triton release tag)."""
    rel = triton_release(image_or_tag)
    if rel is None:
        return None
    out = None
    for since, cc in TRITON_MIN_COMPUTE_CAPABILITY:
        if version_tuple(rel) >= version_tuple(since):
            out = cc
    return out


def class_compute_capability(gpu_class) -> str | None:
    """The CUDA compute capability ("7.5") of the GPUs of ``gpu_class`` (any case), from
    GPU_CLASSES: the one place it is written down (None: not a known class)."""
    spec = GPU_CLASSES.get(str(gpu_class or "").upper())
    return spec["compute_capability"] if spec else None


def compute_capability_problem(gpu_class: str, image: str) -> str | None:
    """Why GPUs of ``gpu_class`` cannot run the Triton release of ``image`` (None: they can)."""
    need = triton_min_compute_capability(image)
    spec = GPU_CLASSES.get(str(gpu_class or "").upper())
    if not need or not spec:
        return None
    have = class_compute_capability(gpu_class)
    if version_tuple(have) >= version_tuple(need):
        return None
    return (
        f"{image} (Triton {triton_release(image)}) needs compute capability {need} or later, but GPU class "
        f"{str(gpu_class).upper()} ({' or '.join(spec['names'])}) is {have}"
    )


# A TensorRT engine (model.plan) runs only on GPUs of the compute capability it was built for. A
# model config says which engine is for which GPU with cc_model_filenames: model_config.proto
# (triton-inference-server/common), "Optional map from CUDA compute capability to the filename of
# the model that supports that compute capability. The filename refers to a file within the model
# version directory." The TensorRT backend (triton-inference-server/tensorrt_backend
# src/model_state.cc, ModelState::AutoCompleteConfig; the older server's backends chose the file
# per instance the same way) forms the GPU's capability as "<major>.<minor>" from
# cudaGetDeviceProperties, takes cc_model_filenames[that] when the map has it, and otherwise falls
# back to default_model_filename (or model.plan), a file the config does not declare for that
# GPU. Not confirmed here: what the current backend's instance loading does beyond that. A config that declares engines per capability but none for a class's
# GPUs is therefore refused for hosts of that class; a config without cc_model_filenames declares
# nothing and is not judged.
def plan_compute_capability_problem(model: str, cc_model_filenames, gpu_class) -> str | None:
    """Why hosts of ``gpu_class`` cannot serve the TensorRT model ``model`` whose config declares
    ``cc_model_filenames`` ({capability: file}); None when the map has the class's capability,
    when the map is empty (nothing declared) or when the class is unknown."""
    declared = dict(cc_model_filenames or {})
    cc = class_compute_capability(gpu_class)
    if not declared or cc is None or cc in declared:
        return None
    have = ", ".join(sorted(declared, key=version_tuple))
    cls = str(gpu_class).upper()
    return (
        f"TensorRT model {model!r} declares engines (cc_model_filenames) for compute capability "
        f"{have} only, but GPU class {cls} ({' or '.join(GPU_CLASSES[cls]['names'])}) is compute "
        f"capability {cc}: Triton would load the default engine (default_model_filename, or model.plan), "
        "which the config does not declare for it"
    )


def version_tuple(v) -> tuple[int, ...]:
    parts = re.findall(r"\d+", str(v))
    return tuple(int(p) for p in parts)


def _gpu_attr(gpu, key: str):
    if isinstance(gpu, dict):
        return gpu.get(key)
    return getattr(gpu, key, None)


def check_gpus(host_name: str, gpu_class: str, gpus, cuda_version, min_cc="6.0", min_cuda="12.0") -> list[str]:
    """Problems with ``gpus`` (Gpu objects or dicts with name/compute_cap) for a host of
    ``gpu_class``; [] when all is well.  Each message names the host, what was expected and
    what was found."""
    min_cc = str(min_cc or "6.0")
    min_cuda = str(min_cuda or "12.0")
    key = str(gpu_class or "").upper()
    if key not in GPU_CLASSES:
        return [f"{host_name}: unknown GPU class {gpu_class!r}; expected one of {', '.join(GPU_CLASSES)}"]
    spec = GPU_CLASSES[key]
    expected = f"{key} ({' or '.join(spec['names'])}, compute capability {spec['compute_capability']})"
    gpus = list(gpus or [])
    if not gpus:
        return [f"{host_name}: expected a {expected} GPU, found no GPU"]
    errors = []
    for n, gpu in enumerate(gpus):
        index = _gpu_attr(gpu, "index")
        index = n if index is None else index
        name = _gpu_attr(gpu, "name") or "?"
        cc = _gpu_attr(gpu, "compute_cap")
        if name not in spec["names"]:
            errors.append(f"{host_name}: GPU {index} is {name!r}, expected {expected}")
            continue
        if not cc:
            errors.append(
                f"{host_name}: GPU {index} ({name}) reports no compute capability, "
                f"expected {spec['compute_capability']} (>= {min_cc})"
            )
            continue
        if version_tuple(cc) < version_tuple(min_cc):
            errors.append(f"{host_name}: GPU {index} ({name}) has compute capability {cc}, expected >= {min_cc}")
        elif str(cc) != spec["compute_capability"]:
            errors.append(
                f"{host_name}: GPU {index} ({name}) has compute capability {cc}, "
                f"expected {spec['compute_capability']} for class {key}"
            )
    if not cuda_version:
        errors.append(f"{host_name}: nvidia-smi shows no CUDA version, expected CUDA >= {min_cuda}")
    elif version_tuple(cuda_version) < version_tuple(min_cuda):
        errors.append(f"{host_name}: driver supports CUDA {cuda_version}, expected CUDA >= {min_cuda}")
    return errors


def triton_release(image_or_tag: str) -> str | None:
    """'nvcr.io/nvidia/tritonserver:24.08-py3' (or '24.08-py3', '24.08') -> '24.08'."""
    text = str(image_or_tag or "").strip().partition("@")[0]  # name:tag@sha256:...: the tag
    tag = text.rsplit("/", 1)[-1]
    tag = tag.split(":", 1)[1] if ":" in tag else tag
    m = re.match(r"^(\d{2}\.\d{2})(?:\b|-|$)", tag)
    return m.group(1) if m else None


def _upstream(version: str) -> str:
    v = str(version).strip().split(":", 1)[-1]
    return v.split("-", 1)[0]


def driver_supported(branch_or_version, triton_image, datacenter: bool = True) -> tuple[bool, str]:
    """Whether driver ``branch_or_version`` ("535", "535.183.01", "535.183.01-1") can run the
    Triton release of ``triton_image``.  ``datacenter``: the GPU is a data-center one (T4, L4),
    which may use the older branches CUDA's forward compatibility supports."""
    tag = triton_release(triton_image)
    if tag is None or tag not in TRITON_DRIVER_REQUIREMENTS:
        known = ", ".join(sorted(TRITON_DRIVER_REQUIREMENTS))
        return False, (
            f"no driver requirements known for Triton release {tag or triton_image!r} "
            f"(known: {known}); add them from NVIDIA's release notes to "
            "tritonfleet/data/compat/triton_images.toml"
            + (
                "; an image pinned by digest keeps its tag: name:<tag>@sha256:<digest>"
                if "@" in str(triton_image) and tag is None
                else ""
            )
        )
    req = TRITON_DRIVER_REQUIREMENTS[tag]
    version = _upstream(branch_or_version)
    if not re.fullmatch(r"\d+(\.\d+){0,2}", version):
        return False, f"{branch_or_version!r} is not a driver branch or version"
    parts = version_tuple(version)
    branch = str(parts[0])
    branch_only = len(parts) == 1
    compat = req["datacenter"] if datacenter else {}
    allowed = ", ".join(f"R{b} >= {m}" for b, m in compat.items())
    needs = f"Triton {tag} (CUDA {req['cuda']}) needs driver >= {req['min_driver']}" + (
        f", or on data-center GPUs {allowed}" if allowed else ""
    )
    if parts >= version_tuple(req["min_driver"]):
        return True, f"driver {version} >= {req['min_driver']}: {needs}"
    if branch in compat:
        minimum = compat[branch]
        if branch_only:
            return True, (f"branch R{branch} is supported from {minimum} on (its current releases are newer); {needs}")
        if parts >= version_tuple(minimum):
            return True, f"driver {version} >= {minimum} (R{branch} forward compatibility): {needs}"
        return (
            False,
            f"driver {version} is older than {minimum}, the first R{branch} release Triton {tag} supports; {needs}",
        )
    return False, f"driver {'branch R' + branch if branch_only else version} is not supported: {needs}"
