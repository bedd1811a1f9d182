# GPU health on every host: node exporter, GPU fault telemetry (Xid, ECC, remapped rows, clocks,
# PCIe), one real inference per model on an interval. Scraped by `tritonfleet prometheus`'s files.
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.preflight import check_host_key_policy, check_settings
from tritonfleet.steps.guard import gpu_guard
from tritonfleet.steps.telemetry import gpu_telemetry

check_settings()       # every setting of the host: known name, type, range (before anything reads one)
check_host_key_policy()  # the SSH host-key policy is named in group data
gpu_telemetry()        # node exporter, tritonfleet-gpu-telemetry, tritonfleet-inference-probe
gpu_guard()            # a running Triton container still sees the GPUs after a daemon-reload
