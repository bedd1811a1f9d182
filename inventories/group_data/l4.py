# NVIDIA L4 hosts (compute capability 8.9).
gpu_class = "L4"
# The driver branch follows the distro (nvidia_driver_branch_default); a class or host may set
# nvidia_driver_branch. Per-class model settings go through model_overrides, e.g.:
# nvidia_driver_branch = "570"
# nvidia_kernel_module = "proprietary"   # NVIDIA's default for R560 and later: "open"
# model_overrides = {"resnet50_onnx": {"instance_group": [{"count": 4, "kind": "KIND_GPU"}]}}
