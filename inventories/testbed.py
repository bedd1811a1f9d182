# The local testbed's hosts (`tritonfleet testbed up`), half in t4, half in l4.
# Only test-only data differs from prod.py: the stand-in vendor repositories and their key,
# Debian's docker.io (Docker's stand-in repository is there too), no memlock ulimit (these hosts cannot raise it), models on CPU
# instances (no real GPU behind the stand-in driver), image archives instead of a registry,
# and relaxed host-key checking (every host is made from one image).
from tritonfleet_testbed.hosts import State, ssh_key

_state = State.load()
if not _state.hosts:
    raise SystemExit("no testbed hosts: run `tritonfleet testbed up` first")

_repo = _state.repo
_test_data = {
    "ssh_user": "root",
    "ssh_key": str(ssh_key()),
    "ssh_strict_host_key_checking": "off",
    "ssh_known_hosts_file": "/dev/null",
    "cuda_repo_url": f"{_repo['url']}/cuda",
    "cuda_repo_key_name": _repo["cuda_key_name"],
    "cuda_repo_key_fingerprint": _repo["fingerprint"],
    "container_toolkit_repo_url": f"{_repo['url']}/libnvidia-container/stable/deb",
    "container_toolkit_key_url": f"{_repo['url']}/libnvidia-container/gpgkey",
    "container_toolkit_key_fingerprint": _repo["fingerprint"],
    "docker_source": "distro",  # Docker's repository: the stand-in below (tests use both)
    "docker_repo_url": f"{_repo['url']}/docker",
    "docker_repo_key_fingerprint": _repo["fingerprint"],
    "triton_ulimit_memlock": None,
    "image_archives": {
        "nvcr.io/nvidia/tritonserver:24.08-py3": _state.images["triton"],
        "nvidia/cuda:12.8.1-base-ubuntu22.04": _state.images["cuda"],
    },
    "model_overrides": {
        "resnet50_onnx": {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]},
        "text_classifier_onnx": {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]},
    },
}

t4 = [(h.name, {"ssh_hostname": h.address, **_test_data}) for h in _state.hosts if h.gpu_class == "t4"]
l4 = [(h.name, {"ssh_hostname": h.address, **_test_data}) for h in _state.hosts if h.gpu_class == "l4"]
# one group per Debian release the testbed runs (`tritonfleet testbed up --distro trixie`): no data of
# their own, the deploy tells the releases apart from the hosts' facts
debian12 = [h.name for h in _state.hosts if h.suite == "bookworm"]
debian13 = [h.name for h in _state.hosts if h.suite == "trixie"]
