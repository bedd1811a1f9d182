"""Many files to a host in one stream: a local `tar` piped into a remote command.

Two ways to the host, chosen by the ``bulk_transfer`` tunable:

* ``ssh``: the OpenSSH client, with the host's pyinfra connection settings (address, port, user,
  key, known-hosts file, host-key policy, ssh config file). About as fast as rsync over the same
  link; paramiko's pure-Python packet loop measured 2-3x slower for gigabytes.
* ``connection``: a channel of the SSH connection pyinfra already holds (works wherever pyinfra
  works, e.g. with password authentication; slower for large repositories).
* ``auto``: ``ssh`` when the host is reached by pyinfra's ssh connector with key or agent
  authentication and an ``ssh`` client is installed, else ``connection``.

With pyinfra's ``@local`` connector (this machine is the host) the archive goes through a pipe.

Nothing is written outside the remote command's own directory; the caller makes what arrived
visible only once it is complete.

A host that stops answering in the middle (a dropped link) fails the transfer within the host's
``ssh_keepalive_interval`` x ``ssh_keepalive_count`` seconds: OpenSSH gets ServerAliveInterval /
ServerAliveCountMax (and a ConnectTimeout), the paramiko channel waits that long at most for the
host to take more data or answer. ``tar`` and ``ssh`` die with the process that started them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from paramiko.ssh_exception import SSHException
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector

from ..core.errors import TritonfleetError
from ..core.procs import die_with_parent
from .connection import keepalive

TRANSPORTS = ("auto", "ssh", "connection")
CHUNK = 1 << 20


class TransferError(TritonfleetError, RuntimeError):
    pass


@dataclass
class Sent:
    files: int
    bytes: int
    seconds: float
    transport: str

    def __str__(self) -> str:
        rate = self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0
        return (
            f"sent {self.files} files, {self.bytes / 1e6:.1f} MB in {self.seconds:.1f}s "
            f"({rate:.0f} MB/s, {self.transport})"
        )


def _connector_data(host) -> dict:
    return dict(getattr(host.connector, "data", None) or {})


def is_ssh_host(host) -> bool:
    return isinstance(getattr(host, "connector", None), SSHConnector)


def is_local_host(host) -> bool:
    return isinstance(getattr(host, "connector", None), LocalConnector)


def choose(host, wanted: str) -> str:
    """The transport to use for ``host`` ('ssh', 'connection', or 'local' for pyinfra's @local
    connector, i.e. this machine); errors name the fix."""
    if wanted not in TRANSPORTS:
        raise TransferError(
            f"{host.name}: bulk_transfer must be one of {', '.join(TRANSPORTS)}, not {wanted!r} (group data)"
        )
    if is_local_host(host):
        return "local"
    if not is_ssh_host(host):
        raise TransferError(
            f"{host.name}: model sync needs pyinfra's ssh connector (or @local); this "
            "host uses another one: reach it over SSH in the inventory"
        )
    data = _connector_data(host)
    why_not_ssh = None
    if data.get("ssh_password") or data.get("ssh_key_password"):
        why_not_ssh = "it authenticates with a password (the OpenSSH client would ask for it)"
    elif data.get("ssh_paramiko_connect_kwargs"):
        why_not_ssh = "ssh_paramiko_connect_kwargs has no OpenSSH equivalent"
    elif not shutil.which("ssh"):
        why_not_ssh = "no `ssh` client is installed on this machine"
    if wanted == "ssh" and why_not_ssh:
        raise TransferError(
            f"{host.name}: bulk_transfer is 'ssh' but {why_not_ssh}; "
            "set bulk_transfer = 'connection' (or 'auto') for this host"
        )
    if wanted == "auto":
        return "connection" if why_not_ssh else "ssh"
    return wanted


def _keepalive(host) -> tuple[int, int]:
    try:
        return keepalive(getattr(host, "data", None))
    except ValueError as e:
        raise TransferError(f"{host.name}: {e}") from e


def ssh_argv(host, remote_command: str, kex_first: str | None = None) -> list[str]:
    """OpenSSH client command line reaching ``host`` the way pyinfra's connection does.
    ``kex_first``: key exchange algorithms OpenSSH offers first, before its own default list
    (``KexAlgorithms=^...``: the server still picks from all of them)."""
    data = _connector_data(host)
    interval, count = _keepalive(host)
    # LogLevel=ERROR: no "Permanently added ..." warning in a transfer's error output
    # ServerAlive*: a host that stops answering ends the transfer after interval x count seconds
    argv = [
        "ssh",
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        "Compression=no",
        "-o",
        "ControlPath=none",
        "-o",
        "LogLevel=ERROR",
        "-o",
        f"ServerAliveInterval={interval}",
        "-o",
        f"ServerAliveCountMax={count}",
        "-o",
        f"ConnectTimeout={interval * count}",
    ]
    if kex_first:
        argv += ["-o", f"KexAlgorithms=^{kex_first}"]
    if data.get("ssh_config_file"):
        argv += ["-F", os.path.expanduser(str(data["ssh_config_file"]))]
    if data.get("ssh_known_hosts_file"):
        argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(str(data['ssh_known_hosts_file']))}"]
    policy = data.get("ssh_strict_host_key_checking")
    if policy:
        argv += ["-o", f"StrictHostKeyChecking={policy}"]
    if data.get("ssh_port"):
        argv += ["-p", str(int(data["ssh_port"]))]
    if data.get("ssh_key"):
        argv += ["-i", str(Path(str(data["ssh_key"])).expanduser()), "-o", "IdentitiesOnly=yes"]
    if data.get("ssh_forward_agent"):
        argv += ["-A"]
    if data.get("ssh_user"):
        argv += ["-l", str(data["ssh_user"])]
    argv += ["--", str(data.get("ssh_hostname") or host.name), remote_command]
    return argv


def _tar_process(root: Path, paths: list[str]) -> subprocess.Popen:
    """tar writing the archive of ``paths`` (relative to ``root``) to its stdout. The names reach
    tar in a temporary file that has no name in any directory (``tempfile.TemporaryFile``), handed
    over as an open descriptor (``-T /dev/fd/N``): no run leaves a name list behind, not even one
    killed mid-transfer (a named list file was left in the temporary directory by every run killed
    with SIGKILL while it sent a repository)."""
    with tempfile.TemporaryFile(prefix="tritonfleet-files-") as names:
        names.write(b"\0".join(p.encode() for p in paths) + b"\0")
        names.flush()
        fd = names.fileno()
        # -h: a symlink in the local repository travels as the file it points to (what the
        # manifest hashed)
        # --no-unquote --verbatim-files-from: every name is taken as it is (a backslash or a leading
        # dash in a file name is not an escape or an option)
        return subprocess.Popen(
            [
                "tar",
                "-c",
                "-h",
                "-f",
                "-",
                "-C",
                str(root),
                "--null",
                "--no-unquote",
                "--verbatim-files-from",
                "-T",
                f"/dev/fd/{fd}",
            ],
            pass_fds=(fd,),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent(),
        )


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()  # follows a symlink, as tar -h does
    return st.st_size, st.st_mtime_ns


CHANGED = re.compile(r"^tar: (.+): file changed as we read it$")


def only_links_changed(tar_err: bytes, root: Path, before: dict[str, tuple[int, int]]) -> bool:
    """Whether tar's exit status 1 means only that a file's inode change time moved while it was
    read, not its content: a rendered copy is a hard link to the repository's file, and another
    run on this machine linking the same file at that moment moves the ctime (tar's "file changed
    as we read it"). True when every line is that message, for a file whose size and mtime are
    still what they were before the archive started; any other message, or a file whose content
    may have changed, is a real failure."""
    lines = [ln for ln in tar_err.decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return False
    for ln in lines:
        m = CHANGED.match(ln)
        if not m or m.group(1) not in before:
            return False
        try:
            if _stamp(root / m.group(1)) != before[m.group(1)]:
                return False
        except OSError:
            return False
    return True


def _tail(data: bytes, n: int = 1500) -> str:
    return data.decode(errors="replace").strip()[-n:]


def _route(host, source, remote_command: str, transport: str) -> tuple[int, bytes]:
    """Feed ``source`` (a binary file object: a pipe or a file) to ``remote_command``'s stdin on
    the host; closes ``source``. Returns (remote exit status, remote stderr)."""
    if transport == "ssh":
        return _over_openssh(host, source, remote_command)
    if transport == "local":
        return _over_pipe(source, remote_command)
    return _over_connection(host, source, remote_command)


def send(host, root: Path, paths: list[str], remote_command: str, transport: str) -> Sent:
    """Stream ``paths`` (relative to ``root``) as a tar archive into ``remote_command`` on the
    host (which must read the archive on stdin). Raises TransferError naming the host."""
    before = {p: _stamp(root / p) for p in paths}
    size = sum(st[0] for st in before.values())
    t0 = time.monotonic()
    tar = _tar_process(root, paths)
    try:
        rc, err = _route(host, tar.stdout, remote_command, transport)
        tar_rc = tar.wait()
        tar_err = tar.stderr.read() if tar.stderr else b""
    finally:
        if tar.poll() is None:
            tar.kill()
            tar.wait()
    if tar_rc == 1 and only_links_changed(tar_err, root, before):
        tar_rc = 0
    # a local read error truncates the stream (and fails the remote end too): it is the cause;
    # a broken pipe only means the remote end stopped reading
    if tar_rc != 0 and tar_rc != -signal.SIGPIPE and b"Broken pipe" not in tar_err:
        raise TransferError(
            f"{host.name}: reading the local files under {root} failed (tar exit {tar_rc}): {_tail(tar_err)}"
        )
    if rc != 0:
        raise TransferError(f"{host.name}: the transfer failed (remote exit {rc}): {_tail(err)}")
    if tar_rc != 0:
        raise TransferError(
            f"{host.name}: reading the local files under {root} failed (tar exit {tar_rc}): {_tail(tar_err)}"
        )
    return Sent(len(paths), size, time.monotonic() - t0, transport)


def send_file(host, path: Path, remote_command: str, transport: str) -> Sent:
    """Stream one local file into ``remote_command``'s stdin on the host (e.g. `docker load`):
    nothing is written to the host's disk on the way."""
    size = path.stat().st_size
    t0 = time.monotonic()
    rc, err = _route(host, open(path, "rb"), remote_command, transport)  # noqa: SIM115 - closed by _route
    if rc != 0:
        raise TransferError(
            f"{host.name}: streaming {path} into `{remote_command[:80]}` failed (remote exit {rc}): {_tail(err)}"
        )
    return Sent(1, size, time.monotonic() - t0, transport)


def _over_openssh(host, source, remote_command: str) -> tuple[int, bytes]:
    try:
        proc = subprocess.Popen(
            ssh_argv(host, remote_command),
            stdin=source,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent(),
        )
    finally:
        source.close()  # ssh holds its own copy now
    _, err = proc.communicate()
    return proc.returncode, err


def _over_pipe(source, command: str) -> tuple[int, bytes]:
    """The "remote" command on this machine (pyinfra's @local connector)."""
    try:
        proc = subprocess.Popen(command, shell=True, stdin=source, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finally:
        source.close()
    _, err = proc.communicate()
    return proc.returncode, err


class _Silent(OSError):
    """The host took no data and sent nothing for the dead-link bound."""


def _send_all(channel, data: bytes, bound: float) -> None:
    """``channel.sendall`` that gives up once the host has taken nothing for ``bound`` seconds
    (paramiko's own sendall waits for the host's window forever)."""
    view = memoryview(data)
    quiet_since = time.monotonic()
    while view:
        try:
            n = channel.send(view[:CHUNK])
        except TimeoutError:
            n = 0
        if n:
            view, quiet_since = view[n:], time.monotonic()
        elif channel.closed or time.monotonic() - quiet_since >= bound:
            raise _Silent(f"the host took no data for {bound:.0f}s")


def _over_connection(host, source, remote_command: str) -> tuple[int, bytes]:
    interval, count = _keepalive(host)
    bound = interval * count
    transport = host.connector.client.get_transport()
    dead = (f"; a host counts as gone after ssh_keepalive_interval x ssh_keepalive_count = {bound}s").encode()
    try:
        channel = transport.open_session(window_size=16 << 20, max_packet_size=1 << 15, timeout=bound)
        channel.settimeout(interval)
        channel.exec_command(remote_command)
    except (SSHException, EOFError, OSError) as e:
        source.close()
        return -1, (
            f"no answer from the host (could not start `{remote_command[:60]}`: {e or type(e).__name__}"
        ).encode() + dead + b")"
    silent = ""
    try:
        try:
            while True:
                chunk = source.read(CHUNK)
                if not chunk or channel.exit_status_ready():
                    break  # all sent, or the remote end gave up (its error follows)
                _send_all(channel, chunk, bound)
            channel.shutdown_write()
        except _Silent as e:
            silent = str(e)
        except (OSError, EOFError):
            pass  # the channel closed under us: the exit status and stderr say why
        finally:
            source.close()
        # the exit status, while the connection lives (its keepalive closes it once the host
        # stops answering: tritonfleet.pyinfra_ext.connection)
        while not silent and not channel.status_event.wait(interval):
            if not transport.is_active():
                break
        if silent or not transport.is_active():
            return -1, f"no answer from the host ({silent or 'the SSH connection closed'}".encode() + dead + b")"
        rc = channel.recv_exit_status()
        err = channel.makefile_stderr("rb").read()
        return rc, err
    finally:
        channel.close()
