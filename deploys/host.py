# Only the host layer: driver, Docker, Container Toolkit, GPU verification.
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.preflight import host_layer as preflight
from tritonfleet.steps.guard import gpu_guard
from tritonfleet.steps.host_prep import container_toolkit, docker_engine, nvidia_driver
from tritonfleet.steps.sessions import ssh_sessions
from tritonfleet.steps.verify import verify_gpus

preflight()            # GPU class and driver branch, Secure Boot, GPU found, daemon.json, vendor keys
ssh_sessions()         # the login user's systemd manager kept between runs
nvidia_driver()        # driver from the CUDA repo, held; reboot if needed
docker_engine()        # Docker Engine
container_toolkit()    # NVIDIA Container Toolkit, nvidia runtime registered
verify_gpus()          # nvidia-smi on the host and in `docker run --gpus all`
gpu_guard()            # a running Triton container still sees the GPUs after a daemon-reload
