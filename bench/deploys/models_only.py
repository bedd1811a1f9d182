# Benchmark deploy: only the model sync step (no unit, restart or health gate), against whatever
# triton_base_dir and model_repository --data gives. Logs how long the step took to decide (for a
# no-op that is all of its work: the local manifest and one remote command).
import time

from pyinfra import host, logger

from tritonfleet import pyinfra_patches
from tritonfleet.steps.triton import model_repository

pyinfra_patches.install()
_t0 = time.perf_counter()
model_repository()
logger.warning(f"{host.print_prefix}bench: model sync step decided in {time.perf_counter() - _t0:.3f}s")
