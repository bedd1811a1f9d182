"""Helpers for tests that run on the local testbed: pyinfra over real SSH, ssh, inference."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import requests

from tritonfleet import ROOT
from tritonfleet.core.checks import is_check
from tritonfleet_testbed import hosts

BIN = Path(sys.executable).parent
PYINFRA = str(BIN / "pyinfra")
TRITONFLEET = str(BIN / "tritonfleet")
INVENTORY = "inventories/testbed.py"


def env() -> dict:
    return dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")


def pyinfra(deploy: str, *extra: str, timeout: float = 1500, inventory: str = INVENTORY,
            environ: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """``pyinfra -y --json [extra] inventories/testbed.py deploy`` from the repository root."""
    res = subprocess.run(
        [PYINFRA, "-y", "--json", *extra, inventory, deploy],
        cwd=ROOT, capture_output=True, text=True, env=environ or env(), timeout=timeout,
    )
    try:
        data = json.loads(res.stdout)
    except ValueError:
        data = {}
    return res, data


def tritonfleet(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([TRITONFLEET, *args], cwd=ROOT, capture_output=True, text=True, env=env(),
                          timeout=timeout)


def status_of(name: str) -> tuple[int, dict]:
    """``tritonfleet status --json`` of one host: its exit status and the host's row."""
    res = tritonfleet("status", INVENTORY, "--json", "--limit", name)
    return res.returncode, {r["host"]: r for r in json.loads(res.stdout)}[name]


def boot_id(h: hosts.Host) -> str:
    """The host's boot id: another one after a reboot."""
    return ssh(h, "cat /proc/sys/kernel/random/boot_id").strip()


def lines_of(text: str) -> str:
    """``text`` without the indentation pyinfra's log adds."""
    return "\n".join(ln.strip() for ln in text.splitlines())


def changed_ops(data: dict) -> list[str]:
    """Operations that changed something (the `check:` verifications excluded)."""
    ops = data.get("results", {}).get("operations", [])
    return [o["name"] for o in ops if o.get("success") and not is_check(o["name"])]


def ssh(h: hosts.Host, command: str, check: bool = True, timeout: float = 120) -> str:
    key = hosts.ssh_key()
    res = subprocess.run(
        ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"root@{h.address}", command],
        capture_output=True, text=True, timeout=timeout,
    )
    if check:
        assert res.returncode == 0, f"{h.name}: {command}: {res.stderr}"
    return res.stdout


def infer_resnet(address: str, port: int = 8000) -> np.ndarray:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=f"{address}:{port}")
    data = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    inp = httpclient.InferInput("input", data.shape, "FP32")
    inp.set_data_from_numpy(data)
    res = client.infer("resnet50_onnx", [inp], outputs=[httpclient.InferRequestedOutput("output")])
    return res.as_numpy("output")


def success_count(address: str, model: str, port: int = 8002) -> float:
    text = requests.get(f"http://{address}:{port}/metrics", timeout=5).text
    total = 0.0
    for m in re.finditer(r'^nv_inference_request_success\{([^}]*)\}\s+([0-9.e+]+)$', text, re.M):
        if f'model="{model}"' in m.group(1):
            total += float(m.group(2))
    return total


def api_headers(h: hosts.Host) -> dict:
    """The host's key for Triton's restricted APIs (configuration, statistics, repository), as a
    request header (read over SSH: the key never leaves the host otherwise)."""
    from tritonfleet.serving.apikey import HEADER

    return {HEADER: ssh(h, "cat /etc/tritonfleet/triton-api-key").strip()}


def live_release(h: hosts.Host) -> str:
    return ssh(h, "readlink /opt/triton/model_repository").strip()


def repository_copy(dest: Path) -> Path:
    """A copy of files/model_repository to change in a test."""
    import shutil

    shutil.copytree(ROOT / "files" / "model_repository", dest)
    return dest


def break_model_at_load(repo: Path, model: str = "text_classifier_onnx") -> Path:
    """Make ``model`` valid for the validator but unloadable for Triton: its weights move to an
    external data file that is then not shipped (as when a weights file is forgotten)."""
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    path = repo / model / "1" / "model.onnx"
    m = onnx.load(str(path))
    convert_model_to_external_data(m, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save(m, str(path))
    (path.parent / "weights.bin").unlink()
    return repo


FAULT_TABLE = "tritonfleet_fault"


def block_ssh(h: hosts.Host) -> None:
    """Every packet to the host's port 22 is answered with a reset, from its own network
    namespace: new connections are refused and open ones die (as when sshd or the network goes
    away); Triton's ports stay open."""
    rules = (f"table inet {FAULT_TABLE} {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n"
             "  tcp dport 22 reject with tcp reset\n }\n}\n")
    subprocess.run(["ip", "netns", "exec", h.netns, "nft", "-f", "-"], input=rules, text=True, check=True)


def unblock_ssh(h: hosts.Host) -> None:
    subprocess.run(["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", FAULT_TABLE],
                   check=False, capture_output=True)


@contextlib.contextmanager
def ssh_blocked(h: hosts.Host):
    block_ssh(h)
    try:
        yield
    finally:
        unblock_ssh(h)


DROP_TABLE = "tritonfleet_drop"


def drop_packets(h: hosts.Host) -> None:
    """Every packet reaching the host from outside is dropped, silently, in its own network
    namespace: no reset, no ICMP (as when a link or a switch dies). Open connections see nothing
    more from it; only their keepalives can tell."""
    rules = (f"table inet {DROP_TABLE} {{\n chain input {{\n  type filter hook input priority -10; policy accept;\n"
             '  iifname != "lo" drop\n }\n}\n')
    subprocess.run(["ip", "netns", "exec", h.netns, "nft", "-f", "-"], input=rules, text=True, check=True)


def undrop_packets(h: hosts.Host) -> None:
    subprocess.run(["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", DROP_TABLE],
                   check=False, capture_output=True)


def container_started(h: hosts.Host) -> str:
    return ssh(h, "docker inspect --format '{{.State.StartedAt}}' triton-server").strip()


def pyinfra_raw(*args: str, environ: dict | None = None, timeout: float = 1500) -> subprocess.CompletedProcess:
    """``pyinfra ARGS`` from the repository root, output as bytes (for greps of every byte)."""
    return subprocess.run([PYINFRA, *args], cwd=ROOT, capture_output=True, env=environ or env(),
                          timeout=timeout)


def write_inventory(directory: Path, groups: dict[str, list[str]], drop=(), **data) -> str:
    """An inventory of testbed hosts in other groups (``{group: [host name]}``), with the testbed
    inventory's data minus the keys in ``drop`` plus ``data``; group_data next to it is the
    project's. Returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    group_data = directory / "group_data"
    if not group_data.exists():
        group_data.symlink_to(ROOT / "inventories" / "group_data")
    lines = [
        "import json, runpy",
        f"_ns = runpy.run_path({str(ROOT / INVENTORY)!r})",
        f"_data = {{k: v for k, v in _ns['_test_data'].items() if k not in {sorted(drop)!r}}}",
        f"_data.update(json.loads({json.dumps(data)!r}))",
        "_by_name = {h.name: h for h in _ns['_state'].hosts}",
    ]
    for group, names in groups.items():
        lines.append(f"{group} = [(n, {{'ssh_hostname': _by_name[n].address, **_data}}) for n in {names!r}]")
    path = directory / "inventory.py"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


MARKER = "/run/tritonfleet-test-marker"


def host_state(h: hosts.Host, ignore=()) -> str:
    """What a deploy could have changed on ``h``: packages, holds, the service states, and the
    files under /etc /usr /opt /var/lib/dpkg changed since ``mark(h)`` (except ``ignore``)."""
    skip = "".join(f" | grep -v -x -F {p}" for p in ignore)
    return ssh(h, (
        "dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\\n' | sort | sha256sum; "
        "apt-mark showhold | sha256sum; "
        "for u in docker triton nvidia-persistenced; do echo $u $(systemctl show -p ActiveEnterTimestamp --value $u); done; "
        "docker inspect -f '{{.Id}} {{.State.StartedAt}}' triton-server 2>/dev/null; "
        "readlink /opt/triton/model_repository; "
        f"[ -e {MARKER} ] && find /etc /usr /opt /var/lib/dpkg -xdev ! -type d -newer {MARKER} -print 2>/dev/null | sort{skip}; true"
    ))


def mark(h: hosts.Host) -> str:
    """Start watching ``h`` for changes; returns its state now (compare with ``host_state``)."""
    ssh(h, f"touch {MARKER}")
    return host_state(h)


BROKEN_INIT_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
BROKEN_INIT_ERROR = "weights file weights.bin is missing next to model.py"


def add_model_failing_at_initialize(repo: Path, name: str = "broken_init") -> Path:
    """Add a python-backend model that validates but whose ``initialize`` raises (as a model whose
    weights are missing does): Triton fails to load it on every start."""
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(BROKEN_INIT_CONFIG.format(name=name))
    (d / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        f"        raise RuntimeError({BROKEN_INIT_ERROR!r})\n"
    )
    return repo
