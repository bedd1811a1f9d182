# Only the host layer: driver, Docker, Container Toolkit, GPU verification.
from tritonfleet.preflight import check_gpu_class_and_driver
from tritonfleet.steps.host_prep import container_toolkit, docker_engine, nvidia_driver
from tritonfleet.steps.verify import verify_gpus

check_gpu_class_and_driver()
nvidia_driver()
docker_engine()
container_toolkit()
verify_gpus()
