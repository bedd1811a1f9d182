"""Disposable test hosts: systemd-nspawn containers, each with systemd as PID 1, sshd,
its own network namespace and address on a private bridge, NAT to reach the Debian mirror.

Everything this module creates is recorded in a state file, so ``down`` removes it all again,
also after a crash: hosts (by their cgroup), overlay mounts, network namespaces, veth pairs,
the bridge, the nft table and the kernel settings it raised (ip_forward, inotify instances).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tritonfleet.core.procs import alive

from . import rootfs

# Several testbeds can run side by side on one machine: TRITONFLEET_TESTBED=N (0-9, default 0)
# selects the instance, with its own state, bridge, subnet (10.77.N.0/24), NAT table and cgroup.
INSTANCE = int(os.environ.get("TRITONFLEET_TESTBED", "0") or 0)
if not 0 <= INSTANCE <= 9:
    raise ValueError(f"TRITONFLEET_TESTBED must be 0-9, not {INSTANCE}")
_SUFFIX = f"-{INSTANCE}" if INSTANCE else ""
STATE_DIR = Path(os.environ.get("TRITONFLEET_TESTBED_DIR", f"/var/lib/tritonfleet/testbed{_SUFFIX}"))
STATE_FILE = STATE_DIR / "state.json"


def _cgroup2_mount() -> Path:
    """Where the unified (v2) cgroup hierarchy is mounted (/sys/fs/cgroup, or .../unified on
    hybrid systems)."""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    except OSError:
        pass
    return Path("/sys/fs/cgroup")


CGROUP_ROOT = _cgroup2_mount() / f"tritonfleet-testbed{_SUFFIX}"
BRIDGE = f"tfbr{INSTANCE}"
SUBNET = f"10.77.{INSTANCE}"  # /24; the bridge (this machine) is .1, hosts start at .11
GATEWAY = f"{SUBNET}.1"
NFT_TABLE = f"tritonfleet_testbed{_SUFFIX.replace('-', '_')}"
REPO_PORT = 8081
# per-instance prefixes of the network namespaces and host-side veth ends
NETNS_PREFIX = f"tf{INSTANCE if INSTANCE else ''}-tb"
VETH_PREFIX = f"tf{INSTANCE if INSTANCE else ''}v"
# Kernel settings the testbed needs, at least: forwarding for the NAT, and inotify instances
# (each host's systemd takes about 9 of them; the usual limit of 128 stops at ~13 hosts). They
# are machine-wide: the values from before the first instance came up are kept in one shared
# file and restored when the last instance goes down.
SYSCTLS = {"/proc/sys/net/ipv4/ip_forward": 1, "/proc/sys/fs/inotify/max_user_instances": 1024}
SYSCTLS_BEFORE = Path("/var/lib/tritonfleet/sysctl.before.json")
GPU_CLASSES = ("t4", "l4")
# Hosts of each Debian release side by side: a release's hosts are numbered from its own first
# index (tb1.. Debian 12, tb21.. Debian 13), so `up` of one release never replaces the other's.
FIRST_INDEX = {"bookworm": 1, "trixie": 21}

BASE_PACKAGES = [
    "systemd-sysv", "udev", "dbus", "openssh-server", "sudo", "python3", "iproute2",
    "ca-certificates", "curl", "gnupg", "kmod", "procps", "netbase", "iptables",
]
BASE_RECIPE_VERSION = "2"


class TestbedError(RuntimeError):
    pass


@dataclass
class Host:
    name: str
    index: int
    gpu_class: str
    address: str
    netns: str
    veth: str
    pid: int | None = None
    suite: str = rootfs.SUITE  # the Debian release it runs (rootfs.SUITES)

    @property
    def dir(self) -> Path:
        return STATE_DIR / "hosts" / self.name

    @property
    def merged(self) -> Path:
        return self.dir / "root"

    @property
    def cgroup(self) -> Path:
        return CGROUP_ROOT / self.name


@dataclass
class State:
    hosts: list[Host] = field(default_factory=list)
    ip_forward_before: str | None = None
    repo_server_pid: int | None = None
    repo: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = STATE_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.rename(STATE_FILE)

    @classmethod
    def load(cls) -> State:
        if not STATE_FILE.exists():
            return cls()
        raw = json.loads(STATE_FILE.read_text())
        raw["hosts"] = [Host(**h) for h in raw.get("hosts", [])]
        return cls(**raw)


def sh(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    res = subprocess.run(list(cmd), **kw)
    if check and res.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def log(msg: str) -> None:
    print(f"[testbed] {msg}", flush=True)


# --- base image ---------------------------------------------------------------------------

def ssh_key() -> Path:
    """The testbed's own SSH key (root on every test host)."""
    key = STATE_DIR / "id_ed25519"
    if not key.exists():
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tritonfleet-testbed", "-f", str(key))
    return key


def _prepare_base(root: Path, suite: str = rootfs.SUITE) -> None:
    rootfs.debootstrap(root, BASE_PACKAGES, suite=suite)
    # No background apt on test hosts: it would race the deploys under test.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"):
        link = root / "etc/systemd/system" / unit
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to("/dev/null")
    # sshd: key auth for root only.
    conf = root / "etc/ssh/sshd_config.d/tritonfleet-testbed.conf"
    conf.write_text("PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n")
    (root / "etc/hostname").write_text("testbed\n")
    # the container has no getty to run; keep the journal small
    (root / "etc/systemd/journald.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/systemd/journald.conf.d/size.conf").write_text("[Journal]\nSystemMaxUse=32M\n")
    for p in (root / "var/cache/apt/archives").glob("*.deb"):
        p.unlink()


def base_tarball(suite: str = rootfs.SUITE) -> Path:
    if suite not in rootfs.SUITES:
        raise TestbedError(f"no testbed hosts of Debian {suite!r}: known {', '.join(rootfs.SUITES)}")
    recipe = f"{BASE_RECIPE_VERSION} {suite} {' '.join(BASE_PACKAGES)} {rootfs.debian_mirror(suite)}"
    return rootfs.cached_tarball("testbed-base", recipe, functools.partial(_prepare_base, suite=suite))


def base_dir(suite: str = rootfs.SUITE) -> Path:
    """The base root filesystem of ``suite``, extracted once next to the state (read-only lower
    layer)."""
    tar = base_tarball(suite)
    lower = STATE_DIR / ("base-" + tar.name.removesuffix(".tar.zst"))
    if not (lower / ".complete").exists():
        if lower.exists():
            shutil.rmtree(lower)
        log(f"extracting {tar.name}")
        rootfs.extract(tar, lower)
        (lower / ".complete").write_text("")
    return lower


# --- network ------------------------------------------------------------------------------

def _net_up(state: State) -> None:
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    _sysctls_up()
    sh("nft", "delete", "table", "ip", NFT_TABLE, check=False)
    rules = (
        f"table ip {NFT_TABLE} {{\n"
        "  chain postrouting {\n"
        "    type nat hook postrouting priority srcnat; policy accept;\n"
        f'    ip saddr {SUBNET}.0/24 oifname != "{BRIDGE}" masquerade\n'
        "  }\n"
        "}\n"
    )
    sh("nft", "-f", "-", input=rules)


def _net_down(state: State) -> None:
    sh("nft", "delete", "table", "ip", NFT_TABLE, check=False)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        sh("ip", "link", "del", BRIDGE, check=False)
    if state.ip_forward_before is not None and not SYSCTLS_BEFORE.exists():  # older state files
        SYSCTLS_BEFORE.write_text(json.dumps({"/proc/sys/net/ipv4/ip_forward": state.ip_forward_before}))
    state.ip_forward_before = None
    with _sysctls_lock():
        others = [p for p in Path("/sys/class/net").glob("tfbr[0-9]") if p.name != BRIDGE]
        if SYSCTLS_BEFORE.exists() and not others:
            for path, value in json.loads(SYSCTLS_BEFORE.read_text()).items():
                Path(path).write_text(f"{value}\n")
            SYSCTLS_BEFORE.unlink()


@contextlib.contextmanager
def _sysctls_lock():
    """Instances coming up or going down at the same moment (the suite's parts) take turns with
    the shared file of the settings from before."""
    SYSCTLS_BEFORE.parent.mkdir(parents=True, exist_ok=True)
    with open(SYSCTLS_BEFORE.with_suffix(".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _sysctls_up() -> None:
    with _sysctls_lock():
        if not SYSCTLS_BEFORE.exists():
            SYSCTLS_BEFORE.write_text(json.dumps({p: Path(p).read_text().strip() for p in SYSCTLS}))
        for path, least in SYSCTLS.items():
            if int(Path(path).read_text().strip()) < least:
                Path(path).write_text(f"{least}\n")


def _host_net_up(h: Host) -> None:
    if not Path(f"/run/netns/{h.netns}").exists():
        sh("ip", "netns", "add", h.netns)
    if not Path(f"/sys/class/net/{h.veth}").exists():
        sh("ip", "link", "add", h.veth, "type", "veth", "peer", "name", "host0", "netns", h.netns)
    sh("ip", "link", "set", h.veth, "master", BRIDGE, "up")
    ns = ("ip", "-n", h.netns)
    sh(*ns, "link", "set", "lo", "up")
    sh(*ns, "addr", "flush", "dev", "host0")
    sh(*ns, "addr", "add", f"{h.address}/24", "dev", "host0")
    sh(*ns, "link", "set", "host0", "up")
    sh(*ns, "route", "replace", "default", "via", GATEWAY)


def _host_net_down(h: Host) -> None:
    if Path(f"/sys/class/net/{h.veth}").exists():
        sh("ip", "link", "del", h.veth, check=False)
    if Path(f"/run/netns/{h.netns}").exists():
        sh("ip", "netns", "del", h.netns, check=False)


# --- hosts --------------------------------------------------------------------------------

def _nameservers() -> str:
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        lines = []
    keep = [ln for ln in lines if ln.startswith(("nameserver", "search", "options"))]
    return "\n".join(keep) + "\n"


def _mounted(path: Path) -> bool:
    return sh("mountpoint", "-q", str(path), check=False).returncode == 0


def _host_fs_up(h: Host, lower: Path, gpu_env: str | None) -> None:
    for sub in ("upper", "work", "root", "docker"):
        (h.dir / sub).mkdir(parents=True, exist_ok=True)
    if not _mounted(h.merged):
        sh(
            "mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={lower},upperdir={h.dir / 'upper'},workdir={h.dir / 'work'}",
            str(h.merged),
        )
    root = h.merged
    (root / "etc/hostname").write_text(h.name + "\n")
    hosts_file = f"127.0.0.1 localhost\n127.0.1.1 {h.name}\n{GATEWAY} testbed-gateway\n"
    (root / "etc/hosts").write_text(hosts_file)
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text(_nameservers())
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(str(ssh_key()) + ".pub").read_text())
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    # the host's "hardware": which GPU the stand-in driver finds (absent: no GPU)
    hw = root / "etc/nvidia-standin/gpu.env"
    if gpu_env:
        hw.parent.mkdir(parents=True, exist_ok=True)
        hw.write_text(gpu_env)
    elif hw.exists():
        hw.unlink()


def machine_name(h: Host) -> str:
    return f"{NETNS_PREFIX}{h.index}-{h.gpu_class}"


def _start(h: Host) -> None:
    CGROUP_ROOT.mkdir(exist_ok=True)
    h.cgroup.mkdir(exist_ok=True)
    if not (h.cgroup / "cgroup.procs").exists():
        raise TestbedError(f"{CGROUP_ROOT} is not a cgroup2 directory; the testbed needs cgroup v2")
    logf = open(h.dir / "console.log", "ab")  # noqa: SIM115
    env = dict(
        os.environ,
        SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1",
        SYSTEMD_SECCOMP="0",
        SYSTEMD_NSPAWN_API_VFS_WRITABLE="network",
    )
    nspawn = [
        "systemd-nspawn", "--boot", "--register=no", "--keep-unit", "--quiet",
        # the machine name is unique across testbed instances (nspawn keeps per-machine state in
        # /run/systemd/nspawn/propagate/<machine>); the host name inside is the inventory's
        "--console=passive", "-D", str(h.merged), "-M", machine_name(h), f"--hostname={h.name}",
        f"--network-namespace-path=/run/netns/{h.netns}", "--capability=all",
        f"--bind={h.dir / 'docker'}:/var/lib/docker",
    ]
    # The supervisor joins the host's own cgroup, then runs nspawn; a reboot inside the
    # host (nspawn exits 133) boots it again, as a real machine would.
    script = (
        f'echo $$ > {h.cgroup}/cgroup.procs; '
        'while :; do "$@"; rc=$?; [ "$rc" = 133 ] || exit "$rc"; done'
    )
    proc = subprocess.Popen(
        ["sh", "-c", script, "supervisor", *nspawn],
        stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
        start_new_session=True,
    )
    h.pid = proc.pid


def wait_ssh(h: Host, timeout: float = 60) -> float:
    """Wait until the host's sshd answers with its banner; returns seconds waited."""
    t0 = time.monotonic()
    while True:
        try:
            with socket.create_connection((h.address, 22), timeout=2) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):
                    return time.monotonic() - t0
        except OSError:
            pass
        if h.pid is not None and not alive(h.pid):
            tail = (h.dir / "console.log").read_text(errors="replace")[-2000:]
            raise TestbedError(f"host {h.name} exited while booting:\n{tail}")
        if time.monotonic() - t0 > timeout:
            raise TestbedError(f"host {h.name} ({h.address}) did not answer SSH within {timeout}s")
        time.sleep(0.2)


def _kill_cgroup(h: Host) -> None:
    cg = h.cgroup
    if cg.exists():
        kill = cg / "cgroup.kill"
        if kill.exists():
            kill.write_text("1")
        else:  # kernels before 5.14
            for pid in _cgroup_pids(cg):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for _ in range(100):
            if not _cgroup_pids(cg):
                break
            time.sleep(0.05)
        _rmdir_tree(cg)
    if h.pid and alive(h.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(h.pid, signal.SIGKILL)


def _cgroup_pids(cg: Path) -> list[str]:
    pids: list[str] = []
    for procs in cg.rglob("cgroup.procs"):
        try:
            pids += procs.read_text().split()
        except OSError:
            pass
    return pids


def _rmdir_tree(cg: Path) -> None:
    for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        cg.rmdir()
    except OSError:
        pass


def _host_down(h: Host) -> None:
    _kill_cgroup(h)
    for _ in range(50):
        if not _mounted(h.merged):
            break
        if sh("umount", str(h.merged), check=False).returncode != 0:
            time.sleep(0.1)
    if _mounted(h.merged):
        sh("umount", "-l", str(h.merged), check=False)
    _host_net_down(h)
    with contextlib.suppress(OSError):  # nspawn's own per-machine directory, left on a disk /run
        (Path("/run/systemd/nspawn/propagate") / machine_name(h)).rmdir()
    if h.dir.exists():
        shutil.rmtree(h.dir, ignore_errors=True)


def make_host(index: int, suite: str = rootfs.SUITE) -> Host:
    gpu_class = GPU_CLASSES[(index - 1) % len(GPU_CLASSES)]
    return Host(
        name=f"tb{index}-{gpu_class}",
        index=index,
        gpu_class=gpu_class,
        address=f"{SUBNET}.{10 + index}",
        netns=f"{NETNS_PREFIX}{index}",
        veth=f"{VETH_PREFIX}{index}",
        suite=suite,
    )


def up(n_hosts: int = 2, gpu_env_for=None, suite: str = rootfs.SUITE) -> State:
    """Bring up ``n_hosts`` hosts of Debian ``suite`` (already-running ones are kept; the other
    releases' hosts are left alone). Returns the state."""
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (network namespaces, mounts, nspawn)")
    for tool in ("systemd-nspawn", "debootstrap", "nft", "ip"):
        if shutil.which(tool) is None:
            raise TestbedError(f"{tool} not found: apt-get install systemd-container debootstrap nftables iproute2")
    state = State.load()
    t0 = time.monotonic()
    ssh_key()
    lower = base_dir(suite)
    _net_up(state)
    first = FIRST_INDEX[suite]
    wanted = [make_host(i, suite) for i in range(first, first + n_hosts)]
    known = {h.name: h for h in state.hosts}
    started: list[Host] = []
    for h in wanted:
        cur = known.get(h.name)
        if cur and cur.pid and alive(cur.pid):
            continue
        if cur:
            _host_down(cur)
            state.hosts.remove(cur)
        state.hosts.append(h)
        state.save()  # record before creating anything, so `down` can clean a half-made host
        _host_net_up(h)
        _host_fs_up(h, lower, gpu_env_for(h.gpu_class) if gpu_env_for else None)
        _start(h)
        state.save()
        started.append(h)
    for h in started:
        waited = wait_ssh(h)
        log(f"{h.name} {h.address} answers SSH ({waited:.1f}s after start)")
    state.hosts.sort(key=lambda h: h.index)
    state.save()
    log(f"{len(state.hosts)} host(s) up in {time.monotonic() - t0:.1f}s")
    return state


def destroy_host(name: str) -> None:
    """Destroy one host completely (its disk too): used to rehearse a rebuild from bare."""
    state = State.load()
    for h in state.hosts:
        if h.name == name:
            _host_down(h)
            state.hosts.remove(h)
            state.save()
            return
    raise TestbedError(f"no testbed host named {name}")


def down() -> None:
    """Remove everything the testbed made; safe to run twice and after a crash."""
    state = State.load()
    for h in list(state.hosts):
        _host_down(h)
        log(f"{h.name} removed")
    # leftovers of a crash before the state was written
    for p in Path("/run/netns").glob(f"{NETNS_PREFIX}*") if Path("/run/netns").exists() else []:
        sh("ip", "netns", "del", p.name, check=False)
    for p in Path("/sys/class/net").glob(f"{VETH_PREFIX}[0-9]*"):
        sh("ip", "link", "del", p.name, check=False)
    if CGROUP_ROOT.exists():
        for cg in CGROUP_ROOT.iterdir():
            if cg.is_dir():
                _kill_cgroup(Host(cg.name, 0, "", "", "", ""))
        _rmdir_tree(CGROUP_ROOT)
    if state.repo_server_pid and alive(state.repo_server_pid):
        os.kill(state.repo_server_pid, signal.SIGTERM)
    state.repo_server_pid = None
    _net_down(state)
    state.hosts = []
    state.save()
    STATE_FILE.unlink(missing_ok=True)
