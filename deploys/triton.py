# Everything: a bare GPU host to a verified Triton server, following the runbook step by step.
#   pyinfra inventories/prod.py deploys/triton.py
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.preflight import run_all as preflight
from tritonfleet.steps.host_prep import container_toolkit, docker_engine, nvidia_driver
from tritonfleet.steps.sessions import ssh_sessions
from tritonfleet.steps.triton import health_gate, model_repository, triton_image, triton_service
from tritonfleet.steps.verify import verify_gpus

preflight()                                   # bad input and host facts: nothing changed on failure
ssh_sessions()                                # the login user's systemd manager kept between runs
nvidia_driver()                               # driver from the CUDA repo, held; reboot if needed
docker_engine()                               # Docker Engine
container_toolkit()                           # NVIDIA Container Toolkit, nvidia runtime registered
verify_gpus()                                 # nvidia-smi on the host and in `docker run --gpus all`
image = triton_image()                        # pull (or load) the Triton image before any restart
models = model_repository()                   # the model repository as a new release
triton_service(image, models)                 # systemd unit; restart (or reload models) only on change
health_gate()                                 # live, ready, every model ready, metrics; recorded
