# Roll a host back to its previous healthy deployment (model release, image, unit), all kept on
# the host itself. `tritonfleet rollout` runs this for a host that failed its batch; by hand:
#   pyinfra inventories/prod.py deploys/rollback.py --limit triton-t4-02
from tritonfleet import pyinfra_patches
from tritonfleet.steps.rollback import rollback

pyinfra_patches.install()                     # connections, operation order, Ctrl-C, per-host deploy lock
rollback()                                    # restore unit + release link, restart, health gate
