# NVIDIA L4 hosts (compute capability 8.9).
gpu_class = "L4"
nvidia_driver_branch = "535"
