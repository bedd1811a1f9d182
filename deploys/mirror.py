# A pull-through cache for the Triton image on the hosts of the image_mirror group (Debian's
# registry in proxy mode), and every host trusting it:
#   pyinfra inventories/prod.py deploys/mirror.py
# Then set image_mirror (and pin triton_image by digest): every host pulls through the mirror.
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.steps.mirror import image_mirror, mirror_filled, mirror_trust

image_mirror()                                # mirror hosts: docker-registry, proxy of image_mirror_upstream
mirror_trust()                                # every host: /etc/docker/certs.d/<mirror>/ca.crt
mirror_filled()                               # mirror hosts: the pinned image fetched once from upstream
