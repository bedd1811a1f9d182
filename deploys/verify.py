# Read-only: GPU verification and the health gate. Changes nothing.
from tritonfleet import pyinfra_patches
from tritonfleet.steps.triton import health_gate
from tritonfleet.steps.verify import verify_gpus

pyinfra_patches.install()  # connections, operation order, Ctrl-C, per-host deploy lock
verify_gpus(load_image=False)
health_gate(record=False)
