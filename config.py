# pyinfra runs this file (the config.py of the directory it runs in) before it connects to any host.
# For a run of deploy files that call pyinfra_patches.install(), tritonfleet tunes each SSH
# connection as pyinfra makes it and starts each host's deploy lock there, so the lock is taken
# while pyinfra connects and the deploy loads its steps (docs/scale.md); any other run (exec,
# fact) is left alone, and --dry takes no lock. Without this file the deploy file's install()
# does the same, a little later.
from tritonfleet import pyinfra_patches

pyinfra_patches.connect_early()
