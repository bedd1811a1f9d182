#!/bin/sh
# Stand-in nvidia-container-cli (libnvidia-container-tools): version only.
case "$1" in
    --version|-V) echo "cli-version: @TOOLKIT_VERSION_SHORT@"; echo "lib-version: @TOOLKIT_VERSION_SHORT@"; exit 0 ;;
esac
echo "nvidia-container-cli: initialization error: nvml error: driver not loaded" >&2
exit 1
