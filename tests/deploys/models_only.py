# Test deploy: only the model sync step (no unit, no restart, no health gate), so the sync can be
# exercised against a scratch triton_base_dir next to the serving release.
from tritonfleet import pyinfra_patches
from tritonfleet.steps.triton import model_repository

pyinfra_patches.install()
model_repository()
