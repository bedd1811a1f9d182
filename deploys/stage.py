# Staging: the new image and model release on every host before any host changes what it serves.
# `tritonfleet rollout --stage` runs it on every target before the first batch; by hand:
#   pyinfra inventories/prod.py deploys/stage.py
# The image mirror's hosts (image_mirror group) fetch the pinned image from the upstream once,
# before the hosts pull it; with a model_origin each host fetches and verifies the release
# (complete on the host, not live). Nothing here restarts Triton or switches a release.
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.steps.mirror import mirror_filled, mirror_trust
from tritonfleet.steps.stage import preflight, stage_image, stage_models

preflight()                                   # the Triton layer's checks (model origin answers, image pinned)
mirror_filled()                               # mirror hosts: every blob of the pinned image, fetched once
mirror_trust()                                # every host: Docker trusts the mirror's CA
stage_image()                                 # every host: the image pulled (through the mirror), no restart
stage_models()                                # every host: the release fetched, verified, complete, not live
