# NVIDIA T4 hosts (compute capability 7.5).
gpu_class = "T4"
# The driver branch follows the distro (nvidia_driver_branch_default in all.py); a class or
# host may set nvidia_driver_branch.
