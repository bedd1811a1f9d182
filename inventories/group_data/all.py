# Group data for every host: only what this fleet sets differently from tritonfleet's defaults.
# Every tunable, its default and what it does: `python -m tritonfleet.tunables` (the table in
# tritonfleet's docs/tunables.md). Per GPU class: t4.py, l4.py; per host: the inventory.
# Precedence (pyinfra): --data > host data > group_data/<group>.py > inventory group data >
# this file > tritonfleet's defaults.
from tritonfleet import defaults as _defaults

# pyinfra reads the host-key policy itself when it connects, before tritonfleet runs, so it is
# named here: tritonfleet's default ("yes": unknown or changed host keys are refused).
ssh_strict_host_key_checking = _defaults.ssh_strict_host_key_checking

# Examples of what a fleet sets here (uncomment and change):
# triton_image = "nvcr.io/nvidia/tritonserver:24.08-py3@sha256:<digest>"   # pin the image's digest
# docker_source = "distro"                      # the distro's docker.io instead of Docker's repository
# triton_model_control_mode = "explicit"        # model updates without a restart
# model_repository = "files/model_repository"   # relative to where pyinfra runs
# health_via = "ssh"                            # health gate through SSH when the ports are firewalled
