# Benchmark deploy: only the image's part of staging (deploys/stage.py's mirror fill, the hosts'
# trust in the mirror and the image step), against whatever triton_image, image_mirror and
# image_fanout --data or the inventory gives; no model release, no Triton restarted.
from tritonfleet import pyinfra_patches

pyinfra_patches.install()
from tritonfleet.steps.mirror import mirror_filled, mirror_trust  # noqa: E402
from tritonfleet.steps.stage import stage_image  # noqa: E402

mirror_filled()
mirror_trust()
stage_image()
