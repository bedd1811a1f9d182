"""The GPU-loss guard on a deployed test host: the stand-ins reproduce NVIDIA's notice (a
daemon-reload without the /dev/char symlinks takes the running container's GPUs), the deploy's
symlinks prevent it, and after a host-layer run that reloads systemd while Triton keeps running,
the guard finds a container that lost its GPUs and restarts it once."""

from __future__ import annotations

from tests.support.testbed import changed_ops, container_started, pyinfra, ssh

LOST = "Failed to initialize NVML: Unknown Error"
DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/tritonfleet-persistence-mode.conf"


def in_container(h) -> str:
    return ssh(h, "docker exec triton-server nvidia-smi -L 2>&1 || true").strip()


def test_daemon_reload_guard(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    host_gpus = ssh(h, "nvidia-smi -L").strip()
    assert host_gpus.startswith("GPU 0: ") and in_container(h) == host_gpus
    # the deploy made the symlinks and keeps them for every boot (the udev rule)
    assert ssh(h, "readlink /dev/char/195:255").strip() == "/dev/nvidiactl"
    assert "create-dev-char-symlinks --create-all" in ssh(h, "cat /lib/udev/rules.d/71-nvidia-dev-char.rules")
    ssh(h, "systemctl daemon-reload")
    assert in_container(h) == host_gpus  # with the symlinks a reload costs nothing
    try:
        # without them (as before this deploy did it), a reload takes the container's GPUs
        ssh(h, "rm -f /dev/char/195:* /dev/char/509:* && systemctl daemon-reload")
        assert in_container(h) == LOST
        assert ssh(h, "nvidia-smi -L").strip() == host_gpus  # the host still sees them
        # a host-layer run that reloads systemd while Triton keeps running: the persistenced
        # drop-in changed by hand
        ssh(h, f"echo '# changed by hand' >> {DROPIN}")
        started = container_started(h)
        res, data = pyinfra("deploys/triton.py", "--limit", h.name)
        assert res.returncode == 0 and data["results"]["failed_hosts"] == [], res.stderr[-5000:]
        done = changed_ops(data)
        assert "NVIDIA driver | systemd daemon-reload (persistenced drop-in changed)" in done, done
        assert ("NVIDIA Container Toolkit | create the /dev/char symlinks now (nvidia-ctk system "
                "create-dev-char-symlinks --create-all)") in done, done
        assert any("GPU-loss guard" in n for n in done), done
        assert "GPUs lost after daemon-reload (persistenced drop-in)" in res.stderr, res.stderr[-3000:]
        assert container_started(h) != started  # restarted once ...
        assert in_container(h) == host_gpus     # ... and sees the GPUs again
        # the next run changes nothing and has no reload, so no guard
        res, data = pyinfra("deploys/triton.py", "--limit", h.name)
        assert res.returncode == 0 and changed_ops(data) == [], changed_ops(data)
    finally:
        ssh(h, "nvidia-ctk system create-dev-char-symlinks --create-all >/dev/null 2>&1; true")
        if in_container(h) != host_gpus:
            ssh(h, "systemctl restart triton")
