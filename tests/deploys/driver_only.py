# Test deploy: pre-flight of the host layer and the NVIDIA driver step alone (no Docker, toolkit or
# GPU verification), for the driver-source tests on a host of their own.
from tritonfleet import pyinfra_patches
from tritonfleet.preflight import host_layer as preflight
from tritonfleet.steps.host_prep import nvidia_driver

pyinfra_patches.install()
preflight()
nvidia_driver()
