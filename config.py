# pyinfra runs this file (the config.py of the directory it runs in) before it connects to any host.
# For a run of a deploy file that calls pyinfra_patches.install(), tritonfleet starts each host's
# deploy lock here, so the lock is taken while pyinfra connects and the deploy loads its steps
# (docs/scale.md); any other run (exec, fact, --dry) is left alone. Without this file the deploy
# file's install() takes the lock, a little later.
from tritonfleet import pyinfra_patches

pyinfra_patches.lock_on_connect()
