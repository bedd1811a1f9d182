# NVIDIA L4 hosts (compute capability 8.9).
gpu_class = "L4"
# The driver branch follows the distro (nvidia_driver_branch_default in all.py); a class or
# host may set nvidia_driver_branch.
