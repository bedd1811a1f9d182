# Reboot a quarantined host for a GPU fault a reset did not clear (the quarantine receiver runs
# this for one host, out of its load balancer already; docs/operations.md, "Remediation"). By hand:
#   pyinfra inventories/prod.py deploys/reboot.py --limit triton-t4-02
from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # first: per-host deploy locks (taken while the steps load), Ctrl-C, connections
from tritonfleet.steps.fault_reboot import gpu_fault_reboot

gpu_fault_reboot()                             # kernel checked for the NVIDIA module, reboot, new boot id
