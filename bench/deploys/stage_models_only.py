# Benchmark deploy: only the staging of the model release (deploys/stage.py's last step), against
# whatever triton_base_dir, model_repository and model_origin --data gives; no image, no Triton.
from tritonfleet import pyinfra_patches

pyinfra_patches.install()
from tritonfleet.steps.stage import stage_models  # noqa: E402

stage_models()
