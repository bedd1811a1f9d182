# Only Triton: image, model repository, unit, health gate. Never touches drivers.
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.preflight import triton_layer as preflight
from tritonfleet.steps.triton import health_gate, model_repository, triton_image, triton_service

preflight()                                   # model repository valid, registry secret present
image = triton_image()
models = model_repository()
triton_service(image, models)
health_gate()
