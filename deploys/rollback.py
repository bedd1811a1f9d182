# Roll a host back to its previous healthy deployment (model release, image, unit), all kept on
# the host itself. `tritonfleet rollout` runs this for a host that failed its batch; by hand:
#   pyinfra inventories/prod.py deploys/rollback.py --limit triton-t4-02
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.steps.rollback import rollback

rollback()                                    # restore unit + release link, restart, health gate
