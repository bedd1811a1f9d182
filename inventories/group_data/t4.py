# NVIDIA T4 hosts (compute capability 7.5).
gpu_class = "T4"
# R535 is a data-center production branch supported by Triton 24.08 (>= 535.86).
nvidia_driver_branch = "535"
