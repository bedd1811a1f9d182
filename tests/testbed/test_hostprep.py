"""Host preparation, bad input and security defaults on real local hosts, over real SSH.

On the shared converged fleet (``deployed``): a dry run plans no change; each bad input is refused
by pre-flight with nothing changed on any host; strict host-key checking is the default; the
gRPC and metrics ports can be bound to loopback.

On an extra host of its own (tb4, brought up bare here and destroyed at the end): bad input on a
bare host changes nothing; the host layer from Docker's own repository (stand-in, pinned key and
version) from bare to verified, with the GPU bound to nouveau at first (one reboot), then a re-run
and a dry run change nothing (and reboot no more); a private registry
login whose secret appears in no output, log, argv or file; a driver branch switch that reboots
once and goes on.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import socket
import subprocess
import time

import pytest
import requests

from tests.conftest import TESTBED_HOSTS
from tests.support.fakehost import defaults
from tests.support.registry import LocalRegistry
from tests.support.testbed import (
    changed_ops,
    env,
    host_state,
    mark,
    pyinfra,
    pyinfra_raw,
    ssh,
    write_inventory,
)
from tritonfleet import ROOT
from tritonfleet.host import nvidia_repos as vendorfacts
from tritonfleet_testbed import hosts
from tritonfleet_testbed.standin_repo import DOCKER_CE_VERSIONS, gpu_profile

REFUSED = "tritonfleet pre-flight failed, no host was changed"
OTHER_FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
DOCKER_DEFAULT = defaults()["docker_version"]  # group_data/all.py pins an older one than the newest
DOCKER_VERSION = f"5:{DOCKER_DEFAULT}-1~debian.12~bookworm"
NEWER_DOCKER = f"5:{DOCKER_CE_VERSIONS[-1]}-1~debian.12~bookworm"
REGISTRY = f"{hosts.GATEWAY}:5000"


def out_of(res) -> str:
    o = res.stdout + res.stderr
    return o.decode(errors="replace") if isinstance(o, bytes) else o


def assert_refused(res, *expected: str):
    out = out_of(res)
    assert res.returncode != 0, out[-3000:]
    assert REFUSED in out, out[-3000:]
    assert "Starting operation" not in out  # nothing ran on any host
    assert re.search(r"tb\d-(t4|l4): ", out), out[-2000:]  # the message names the host
    for text in expected:
        assert text in out, (text, out[-3000:])


def plan_changes(res) -> list:
    plan = json.loads(res.stdout)["plan"]
    return [(o["name"], o["hosts_with_change"], o["hosts_with_conditional_change"]) for o in plan
            if o["hosts_with_change"] or o["hosts_with_conditional_change"]]


# ================================================================ the converged fleet

def test_dry_run_on_converged_hosts_plans_no_change(deployed):
    testbed, _, _ = deployed
    res = pyinfra_raw("--dry", "--json", "inventories/testbed.py", "deploys/triton.py")
    assert res.returncode == 0, res.stderr[-3000:]
    assert plan_changes(res) == []
    res = pyinfra_raw("--dry", "inventories/testbed.py", "deploys/triton.py")
    table = out_of(res).split("Detected changes:")[1].split("Detected changes may not")[0]
    rows = [r for r in table.splitlines() if " | " in r]
    assert len(rows) >= 15 and not any("(tb" in r for r in rows), table  # no host in Change columns


@pytest.fixture
def fleet_unchanged(deployed):
    """Every default host's state before the test; after it, the same (nothing changed)."""
    testbed, _, _ = deployed
    before = {h.name: mark(h) for h in testbed.hosts}
    yield
    after = {h.name: host_state(h) for h in testbed.hosts}
    assert after == before


def broken_config(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["cp", "-a", str(ROOT / "files/model_repository"), str(repo)], check=True)
    cfg = repo / "resnet50_onnx/config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size: 64", "max_batch_size: 4"))
    return ["--data", f"model_repository={repo}"]


def escaping_model_file(tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["cp", "-a", str(ROOT / "files/model_repository"), str(repo)], check=True)
    (repo / "resnet50_onnx/labels.txt").symlink_to("../../../../../../../../etc/shadow")
    return ["--data", f"model_repository={repo}"]


def no_gpu_class(tmp_path):
    names = [h.name for h in hosts.State.load().hosts]
    return ["--inventory", write_inventory(tmp_path / "inv", {"gpu_hosts": names})]


# (case, deploy, extra arguments (or a function of tmp_path), what the message must say)
BAD_INPUT = [
    ("broken config.pbtxt", "deploys/triton.py", broken_config,
     ["resnet50_onnx/config.pbtxt", "preferred-batch-size", "tritonfleet validate"]),
    ("model file escaping the repository", "deploys/models.py", escaping_model_file,
     ["[unsafe-path]", "points outside the repository", "/etc/shadow"]),
    ("inventory without a GPU class", "deploys/triton.py", no_gpu_class,
     ["no gpu_class", "GPU-class group (t4, l4)", "inventories/prod.py"]),
    ("unknown GPU class", "deploys/triton.py", ["--data", "gpu_class=A100"],
     ["gpu_class = 'A100' (--data)", "is a GPU class tritonfleet has no rules for", "known: L4, T4"]),
    ("driver branch the Triton image cannot use", "deploys/triton.py", ["--data", "nvidia_driver_branch=550"],
     ["driver 550", "Triton 24.08", "group_data/"]),
    ("GPU found differs from the inventory", "deploys/host.py", ["--data", "gpu_class=T4"],
     ["tb2-l4: the inventory puts this host in GPU class T4", "reports GPU 0 'NVIDIA L4'",
      "move the host to the l4 group"]),
    ("repository key with another fingerprint", "deploys/triton.py",
     ["--data", f"cuda_repo_key_fingerprint={OTHER_FPR}"],
     ["CUDA repository signing key", f"cuda_repo_key_fingerprint pins {OTHER_FPR}", "not trusted"]),
    ("private registry without its secret", "deploys/models.py",
     ["--data", "registry_user=tfuser", "--data", f"triton_image={REGISTRY}/nvidia/tritonserver:24.08-py3"],
     ["$TRITONFLEET_REGISTRY_PASSWORD is empty", "registry_user 'tfuser'"]),
]


def test_bad_input_is_refused_before_any_host_changes(fleet_unchanged, tmp_path):
    """Every case of BAD_INPUT in turn, the fleet compared once before and once after them all;
    each case that is not refused as it should be is named."""
    environ = {k: v for k, v in env().items() if k != "TRITONFLEET_REGISTRY_PASSWORD"}
    wrong = {}
    for i, (case, deploy, extra, expected) in enumerate(BAD_INPUT):
        work = tmp_path / f"case{i}"
        work.mkdir()
        args = extra(work) if callable(extra) else list(extra)
        inventory = "inventories/testbed.py"
        if args[:1] == ["--inventory"]:
            inventory, args = args[1], args[2:]
        res = pyinfra_raw("-y", *args, inventory, deploy, environ=environ)
        if case == "repository key with another fingerprint":
            expected = [*expected, f"has fingerprint {hosts.State.load().repo['fingerprint']}"]
        try:
            assert_refused(res, *expected)
        except AssertionError as e:
            wrong[case] = str(e)[-3000:]
    assert list(wrong) == [], wrong


def test_strict_host_key_checking_is_the_default(deployed, tmp_path):
    """group_data/all.py: unknown and changed host keys are refused (pyinfra's own default,
    accept-new, would trust the first key it sees); only the testbed inventory turns it off."""
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    inv = write_inventory(tmp_path / "inv", {h.gpu_class: [h.name]},
                          drop={"ssh_strict_host_key_checking", "ssh_known_hosts_file"})
    known = tmp_path / "known_hosts"
    known.write_text("")

    def dry():
        return pyinfra_raw("--dry", "--data", f"ssh_known_hosts_file={known}", inv, "deploys/host.py")

    res = dry()
    assert res.returncode != 0 and f"No host key for {h.address} found in known_hosts" in out_of(res)
    assert known.read_text() == ""  # not accepted on first use
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known.write_text(f"{h.address} {(tmp_path / 'other_key.pub').read_text().split(' ')[0]} "
                     f"{(tmp_path / 'other_key.pub').read_text().split(' ')[1]}\n")
    res = dry()
    assert res.returncode != 0 and "Connected" not in out_of(res), out_of(res)[-2000:]
    scan = subprocess.run(["ssh-keyscan", "-t", "ed25519", h.address], capture_output=True, text=True)
    known.write_text(scan.stdout)
    res = dry()
    assert res.returncode == 0 and f"[{h.name}] Connected" in out_of(res), out_of(res)[-2000:]


def refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=3).close()
    except ConnectionRefusedError:
        return True
    return False


def test_grpc_and_metrics_bound_to_loopback(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    res, data = pyinfra("deploys/models.py", "--limit", h.name, "--data", "triton_grpc_bind=127.0.0.1",
                        "--data", "triton_metrics_bind=127.0.0.1", "--data", "health_via=ssh")
    assert res.returncode == 0 and data["results"]["failed_hosts"] == [], res.stderr[-3000:]
    assert "healthy in" in res.stderr  # through the SSH tunnel
    assert requests.get(f"http://{h.address}:8000/v2/health/ready", timeout=5).status_code == 200
    assert refused(h.address, 8001) and refused(h.address, 8002)
    listening = ssh(h, "ss -ltnH")
    assert "127.0.0.1:8001" in listening and "127.0.0.1:8002" in listening
    assert ssh(h, "stat -c '%a %U:%G' /etc/systemd/system/triton.service").strip() == "644 root:root"
    # back to the default (all addresses) for the other tests
    res, data = pyinfra("deploys/models.py", "--limit", h.name)
    assert res.returncode == 0 and data["results"]["failed_hosts"] == [], res.stderr[-3000:]
    assert requests.get(f"http://{h.address}:8002/metrics", timeout=5).status_code == 200


# ================================================================ an extra host of its own

@pytest.fixture(scope="module")
def extra_host(deployed):
    """Host tb4 from bare, next to the shared ones (which stay as they are), its GPU bound to
    nouveau (as on a fresh install); destroyed afterwards."""
    state = hosts.up(TESTBED_HOSTS + 1, gpu_env_for=gpu_profile)
    h = next(h for h in state.hosts if h.index == TESTBED_HOSTS + 1)
    # its GPU is driven by nouveau until the first install blacklists it and reboots once
    ssh(h, "echo 'NOUVEAU=\"1\"' >> /etc/nvidia-standin/gpu.env")
    yield h
    hosts.destroy_host(h.name)
    assert h.name not in {x.name for x in hosts.State.load().hosts}


def host4(h, *args: str) -> list[str]:
    """The host layer on ``h`` with Docker's own repository (docker_version: the default pin) and
    the proprietary kernel modules (the session's hosts run the default, open:
    testbed/test_kernel_module.py; a branch switch to 570 keeps the flavour)."""
    return ["--limit", h.name, "--data", "docker_source=docker", "--data", "nvidia_kernel_module=proprietary", *args]


def test_bad_input_on_a_bare_host_changes_nothing(extra_host):
    h = extra_host
    fpr = hosts.State.load().repo["fingerprint"]
    stub = "/usr/local/bin/mokutil"
    ssh(h, f"printf '#!/bin/sh\\necho SecureBoot enabled\\n' > {stub} && chmod 755 {stub}")
    before = mark(h)
    res = pyinfra_raw("-y", *host4(h), "inventories/testbed.py", "deploys/host.py")
    assert_refused(res, "UEFI Secure Boot is enabled", "nvidia_secure_boot_ok")
    ssh(h, f"rm {stub}; mkdir -p /etc/docker && echo '{{not json' > /etc/docker/daemon.json")
    res = pyinfra_raw("-y", *host4(h), "inventories/testbed.py", "deploys/host.py")
    assert_refused(res, "/etc/docker/daemon.json is not valid JSON", "json.tool")
    # the operator's own daemon.json (kept by the deploy): a key of its own and the test registry
    operator = json.dumps({"log-level": "warn", "insecure-registries": [REGISTRY]})
    ssh(h, f"echo '{operator}' > /etc/docker/daemon.json")
    for tunable, what in (("cuda_repo_key_fingerprint", "CUDA repository"),
                          ("docker_repo_key_fingerprint", "Docker repository"),
                          ("container_toolkit_key_fingerprint", "Container Toolkit repository")):
        res = pyinfra_raw("-y", *host4(h, "--data", f"{tunable}={OTHER_FPR}"), "inventories/testbed.py",
                          "deploys/host.py")
        assert_refused(res, f"the {what} signing key at http://{hosts.GATEWAY}:", f"has fingerprint {fpr}",
                       f"{tunable} pins {OTHER_FPR}")
    res = pyinfra_raw("-y", *host4(h, "--data", f"container_toolkit_key_url=http://{hosts.GATEWAY}:8081/nope"),
                      "inventories/testbed.py", "deploys/host.py")
    assert_refused(res, "could not fetch the Container Toolkit repository signing key", "404")
    after = host_state(h, ignore=(stub, "/etc/docker/daemon.json"))
    assert after == before
    managed = ("/etc/apt/sources.list.d/cuda.list /etc/apt/sources.list.d/docker.list "
               "/etc/apt/sources.list.d/nvidia-container-toolkit.list /etc/apt/keyrings/docker.gpg "
               "/usr/share/keyrings/cuda-archive-keyring.gpg /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg")
    assert ssh(h, f"ls {managed} 2>/dev/null; command -v docker nvidia-smi; true") == ""  # still bare


def test_host_layer_from_dockers_repository(extra_host):
    h = extra_host
    state = hosts.State.load()
    boot = ssh(h, "cat /proc/sys/kernel/random/boot_id")
    t0 = time.monotonic()
    res, data = pyinfra("deploys/host.py", *host4(h))
    first = time.monotonic() - t0
    assert res.returncode == 0 and data["results"]["failed_hosts"] == [], res.stderr[-5000:]
    done = {o["name"] for o in data["results"]["operations"] if o["success"]}
    # nouveau was bound to the GPU: after the install nvidia-smi cannot communicate with the
    # driver (no version mismatch); the deploy rebooted once and went on to the verification
    assert "NVIDIA driver | reboot if the loaded driver does not match the installed one (or is not loaded)" in done
    assert "not loaded (nouveau bound to the GPU" in res.stderr
    assert ssh(h, "cat /proc/sys/kernel/random/boot_id") != boot
    for step in ("NVIDIA driver | CUDA repository signing key (fingerprint checked)",
                 "NVIDIA driver | apt source contrib non-free non-free-firmware (NVIDIA's driver needs them)",
                 "NVIDIA driver | NVIDIA's pinning package nvidia-driver-pinning-580",
                 "NVIDIA driver | NVIDIA driver cuda-drivers-580, nvidia-kernel-dkms",
                 "Docker Engine | Docker repository signing key (fingerprint checked)",
                 "Docker Engine | apt source docker", f"Docker Engine | pin Docker Engine to {DOCKER_DEFAULT}",
                 "Docker Engine | Docker Engine (docker-ce)",
                 "NVIDIA Container Toolkit | Container Toolkit 1.17.8-1",
                 "NVIDIA Container Toolkit | register the nvidia runtime with Docker (nvidia-ctk, keeps other daemon.json keys)",
                 "NVIDIA Container Toolkit | restart Docker (runtime registered or toolkit installed)"):
        assert step in done, (step, sorted(done))
    # the verification table: nvidia-smi on the host and in `docker run --gpus all`
    for where in ("host", "container"):
        assert re.search(rf"GPU check  {h.name} +{where} +1x NVIDIA L4 +driver 580\.159\.04 +cc 8\.9 +CUDA 13\.0",
                         res.stderr), res.stderr[-3000:]

    # Docker's repository: pinned key, source line, pinned version (the repository has a newer one)
    shown = ssh(h, "gpg --batch --show-keys --with-colons /etc/apt/keyrings/docker.gpg")
    assert shown.splitlines()[1].split(":")[9] == state.repo["fingerprint"]  # the pub record's fpr
    assert ssh(h, "cat /etc/apt/sources.list.d/docker.list") == (
        f"deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.gpg] {state.repo['url']}/docker/debian bookworm stable\n")
    versions = dict(line.split() for line in ssh(h, "dpkg-query -W docker-ce docker-ce-cli containerd.io "
                                                   "docker-buildx-plugin docker-compose-plugin").splitlines())
    assert versions["docker-ce"] == versions["docker-ce-cli"] == DOCKER_VERSION
    assert DOCKER_DEFAULT in DOCKER_CE_VERSIONS and DOCKER_VERSION != NEWER_DOCKER
    policy = ssh(h, "apt-cache policy docker-ce")  # the newer one is there, the pin keeps the default
    assert f"Candidate: {DOCKER_VERSION}" in policy and f" {NEWER_DOCKER} 500" in policy, policy
    assert f"Docker Engine | check: docker-ce is {DOCKER_DEFAULT}" in done
    # Docker works, with the nvidia runtime, the operator's daemon.json keys kept, plugins answering
    daemon = json.loads(ssh(h, "cat /etc/docker/daemon.json"))
    assert daemon["log-level"] == "warn" and daemon["insecure-registries"] == [REGISTRY]
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert "nvidia" in ssh(h, "docker info --format '{{json .Runtimes}}'")
    assert ssh(h, "docker run --rm --gpus all nvidia/cuda:12.8.1-base-ubuntu22.04 nvidia-smi -L").startswith(
        "GPU 0: NVIDIA L4")
    assert "v2.29.7" in ssh(h, "docker compose version")
    # the rest of the host layer: holds, unattended-upgrades, nouveau, persistenced, toolkit pin
    held = ssh(h, "apt-mark showhold").split()
    # exactly the driver's packages (tritonfleet/data/nvidia_repos/debian12.toml) are held
    installed = ssh(h, "dpkg-query -W -f '${Package}\\n'").split()
    assert sorted(held) == sorted(p for p in installed if p in vendorfacts.all_driver_packages("debian12"))
    assert {"cuda-drivers-580", "nvidia-driver", "nvidia-smi", "libcuda1", "firmware-nvidia-gsp"} <= set(held)
    # not the toolkit (pinned by version), egl-wayland (its own versions), the pinning package, DKMS
    assert "libnvidia-egl-wayland1" in installed and "nvidia-driver-pinning-580" in installed
    assert not [p for p in held if "container" in p or p in ("libnvidia-egl-wayland1", "dkms")
                or p.startswith("nvidia-driver-pinning")]
    assert '"nvidia-";' in ssh(h, "cat /etc/apt/apt.conf.d/51tritonfleet-nvidia")
    assert "blacklist nouveau" in ssh(h, "cat /etc/modprobe.d/blacklist-nouveau.conf")
    assert ssh(h, "systemctl is-active nvidia-persistenced; systemctl is-enabled nvidia-persistenced").split() == [
        "active", "enabled"]
    # NVIDIA's pinning package pins the branch (no preferences of our own), contrib/non-free added
    assert ssh(h, "ls /etc/apt/preferences.d/").split() == ["nvidia-container-toolkit", "nvidia-driver-pinning-580",
                                                             "tritonfleet-docker"]
    assert "Components: contrib non-free non-free-firmware" in ssh(
        h, "cat /etc/apt/sources.list.d/tritonfleet-debian-nonfree.sources")
    # persistence mode on (the packaged unit says --no-persistence-mode; the drop-in turns it on)
    assert re.search(r"Persistence Mode +: Enabled", ssh(h, "nvidia-smi -q"))

    # idempotent: a re-run changes nothing (and reboots no more), a dry run plans nothing
    boot = ssh(h, "cat /proc/sys/kernel/random/boot_id")
    t0 = time.monotonic()
    res, data = pyinfra("deploys/host.py", *host4(h))
    again = time.monotonic() - t0
    assert res.returncode == 0 and changed_ops(data) == [], changed_ops(data)
    assert ssh(h, "cat /proc/sys/kernel/random/boot_id") == boot  # rebooted once
    res = pyinfra_raw("--dry", "--json", *host4(h), "inventories/testbed.py", "deploys/host.py")
    assert res.returncode == 0 and plan_changes(res) == []
    print(f"\nhost layer from bare with Docker's repository: {first:.0f}s; re-run {again:.1f}s")


def test_registry_secret_is_never_shown(extra_host, tmp_path):
    """docker login with the secret from the environment, on stdin: it is in no output of any
    mode, no journal, no command line and no file on the host."""
    h = extra_host
    secret = "tf-" + secrets.token_urlsafe(24)
    forms = [secret, base64.b64encode(secret.encode()).decode()]
    state = hosts.State.load()
    with LocalRegistry(tmp_path / "registry", "tfuser", secret) as reg:
        image = reg.push(state.images["cuda"], "nvidia/cuda:12.8.1-base-ubuntu22.04")
        args = host4(h, "--data", "registry_user=tfuser", "--data", f"registry_host={REGISTRY}",
                     "--data", f"cuda_test_image={image}")
        without = {k: v for k, v in env().items() if k != "TRITONFLEET_REGISTRY_PASSWORD"}
        before = mark(h)
        res = pyinfra_raw("-y", *args, "inventories/testbed.py", "deploys/host.py", environ=without)
        assert_refused(res, "$TRITONFLEET_REGISTRY_PASSWORD is empty", f"{image} is pulled from {REGISTRY}")
        assert host_state(h) == before
        # every command line docker sees on the host is logged (the wrapper comes first on PATH)
        ssh(h, "cat > /usr/local/bin/docker <<'EOF'\n#!/bin/sh\necho \"$*\" >> /var/log/docker-argv.log\n"
               "exec /usr/bin/docker \"$@\"\nEOF\nchmod 755 /usr/local/bin/docker")
        with_secret = {**env(), "TRITONFLEET_REGISTRY_PASSWORD": secret}
        outputs = []
        for mode in (["--dry", "-vvv", "--diff"], ["-y", "-vvv"], ["-y", "--json"], ["-y"]):
            ssh(h, f"docker logout {REGISTRY} >/dev/null 2>&1; docker rmi -f {image} >/dev/null 2>&1; true")
            res = pyinfra_raw(*mode, *args, "inventories/testbed.py", "deploys/host.py", environ=with_secret)
            outputs.append(res.stdout + res.stderr)
            assert res.returncode == 0, out_of(res)[-3000:]
            text = out_of(res)
            assert f"docker login {REGISTRY} as tfuser" in text
            if "--dry" not in mode:
                assert re.search(rf"GPU check  {h.name} +container +1x NVIDIA L4", text), text[-3000:]
        argv = ssh(h, "cat /var/log/docker-argv.log")
        assert f"login --username tfuser --password-stdin {REGISTRY}" in argv and f"pull {image}" in argv
        journal = subprocess.run(["ssh", "-i", str(hosts.ssh_key()), "-o", "StrictHostKeyChecking=no",
                                  "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                                  f"root@{h.address}", "journalctl -o export --no-pager"],
                                 capture_output=True, timeout=120).stdout
        assert len(journal) > 10000
        config = json.loads(ssh(h, "cat /root/.docker/config.json"))  # docker keeps the login (0600)
        assert base64.b64decode(config["auths"][REGISTRY]["auth"]).decode() == f"tfuser:{secret}"
        assert ssh(h, "stat -c '%a %U' /root/.docker/config.json").strip() == "600 root"
        for form in forms:
            for blob in [*outputs, journal, argv.encode()]:
                assert form.encode() not in blob
            found = ssh(h, f"grep -rlF -- {form} /etc /root /tmp /var/tmp /var/log /run /opt /usr/local 2>/dev/null; true")
            assert found == "", found
    ssh(h, f"rm -f /usr/local/bin/docker; docker logout {REGISTRY}; docker rmi -f {image} >/dev/null")


def test_driver_branch_switch_reboots_once_and_goes_on(extra_host):
    """580 (NVIDIA's pinning package) -> 570 (no pinning package: our preferences over the whole
    set, a downgrade of every package of the same names)."""
    h = extra_host
    boot = ssh(h, "cat /proc/sys/kernel/random/boot_id")
    res, data = pyinfra("deploys/host.py", *host4(h, "--data", "nvidia_driver_branch=570"))
    assert res.returncode == 0 and data["results"]["failed_hosts"] == [], res.stderr[-5000:]
    done = {o["name"] for o in data["results"]["operations"] if o["success"]}
    for step in ("NVIDIA driver | release driver holds to switch from branch 580",
                 "NVIDIA driver | remove the other branch's cuda-drivers-580, nvidia-driver-pinning-580",
                 "NVIDIA driver | pin driver packages to branch 570",
                 "NVIDIA driver | NVIDIA driver cuda-drivers-570, nvidia-kernel-dkms (and the 25 installed packages of its set)",
                 "NVIDIA driver | reboot if the loaded driver does not match the installed one (or is not loaded)"):
        assert step in done, (step, sorted(done))
    assert ssh(h, "cat /proc/sys/kernel/random/boot_id") != boot  # rebooted ...
    for where in ("host", "container"):  # ... and went on to the verification
        assert re.search(rf"GPU check  {h.name} +{where} +1x NVIDIA L4 +driver 570\.133\.07 +cc 8\.9 +CUDA 12\.8",
                         res.stderr), res.stderr[-3000:]
    held = ssh(h, "apt-mark showhold").split()
    assert "cuda-drivers-570" in held and "cuda-drivers-580" not in held
    versions = dict(line.split() for line in ssh(h, "dpkg-query -W nvidia-driver libcuda1 firmware-nvidia-gsp").splitlines())
    assert set(versions.values()) == {"570.133.07-1"}  # every package of the set moved, none left at 580
    assert "Pin: version 570.*" in ssh(h, "cat /etc/apt/preferences.d/tritonfleet-nvidia-driver")
    boot = ssh(h, "cat /proc/sys/kernel/random/boot_id")
    res, data = pyinfra("deploys/host.py", *host4(h, "--data", "nvidia_driver_branch=570"))
    assert res.returncode == 0 and changed_ops(data) == [], changed_ops(data)
    assert ssh(h, "cat /proc/sys/kernel/random/boot_id") == boot  # no reboot when none is needed
