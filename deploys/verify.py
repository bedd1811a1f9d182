# Read-only: GPU verification and the health gate. Changes nothing.
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.steps.triton import health_gate
from tritonfleet.steps.verify import verify_gpus

verify_gpus(load_image=False)
health_gate(record=False)
