#!/bin/sh
# Stand-in nvidia-container-runtime: the runc shim Docker calls for --runtime=nvidia.
# GPU injection on the testbed is the prestart hook's (nvidia-container-runtime-hook).
case "$1" in
    --version) echo "NVIDIA Container Runtime version @TOOLKIT_VERSION@"; exec runc --version ;;
esac
exec runc "$@"
