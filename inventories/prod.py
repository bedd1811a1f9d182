# Production inventory: one group per GPU class. The group names select
# group_data/t4.py and group_data/l4.py (driver branch, expected GPU model).
# Host names are what operators see; ssh_hostname is where pyinfra connects. Host keys are
# checked strictly (ssh_strict_host_key_checking in group_data/all.py): put every host's key
# in ~/.ssh/known_hosts before the first run.
from tritonfleet.limits import raise_nofile

raise_nofile()  # one SSH connection a host: raise the open-file limit before pyinfra connects

t4 = [
    ("triton-t4-01", {"ssh_hostname": "192.0.2.11", "ssh_user": "ubuntu", "_sudo": True}),
    ("triton-t4-02", {"ssh_hostname": "192.0.2.12", "ssh_user": "ubuntu", "_sudo": True}),
]

l4 = [
    ("triton-l4-01", {"ssh_hostname": "192.0.2.21", "ssh_user": "ubuntu", "_sudo": True}),
]
