"""A fleet of cheap fake SSH hosts on loopback addresses, for measuring the control side alone.

Every fake host is one address in 127.0.0.0/8 with an SSH endpoint (paramiko's server side, all
hosts in this one process) that answers each remote command with the answer a real converged
host gave to the same command, recorded from a converged testbed host (bench/fakefleet.json).
A command with no recorded answer fails loudly: the command's exit status is 255, its stderr
names the command, and the server exits non-zero naming every unmatched command, so a changed
deploy can never be measured against stale answers.

    # record (a converged testbed host: `tritonfleet testbed up --hosts 1` and a deploy first)
    export TRITONFLEET_TESTBED=<n>
    .venv/bin/python bench/fakefleet.py record [--host NAME]
    .venv/bin/python bench/fakefleet.py record --ansible [--host NAME]   # the Ansible anchor's answers
    # serve N fake hosts, write their inventory data, run until SIGTERM/SIGINT
    .venv/bin/python bench/fakefleet.py serve --hosts 100 --hosts-file bench/.work/fake-hosts.json \
        [--log bench/.work/received.jsonl]    # every command and request received, exactly
    .venv/bin/python bench/fakefleet.py commands bench/.work/received.jsonl  # as matched, per host:
        # the oracle of a refactor (two runs of the same deploy print the same text)
    # (one process answers a few hundred hosts before it is CPU-bound: bench/scale.py splits a
    # fleet over processes with --shard I --shards K, each its own hosts file, merged)
    .venv/bin/pyinfra -y bench/fake_inventory.py deploys/triton.py   # TRITONFLEET_FAKEFLEET=<hosts file>

Recording runs the deploy (no-op), `tritonfleet status` and a `--dry` plan against one fake
host that forwards every command to the real host (``record``), so what is recorded is exactly
what goes over the wire. Per-host values (the host's name and address) are normalised
(``normalise``) in commands and answers, and put back for each fake host when answering.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import io
import json
import os
import re
import selectors
import signal
import socket
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import paramiko

ROOT = Path(__file__).resolve().parent.parent
ANSWERS = Path(__file__).resolve().parent / "fakefleet.json"
# the Ansible playbook's answers (bench/ansible/triton.yml), recorded on their own
# (`record --ansible`) and merged in when the pyinfra answers are loaded (Answers.load)
ANSIBLE_ANSWERS = Path(__file__).resolve().parent / "fakefleet-ansible.json"
SSH_PORT = 2222
HOST_MARK, ADDR_MARK = "@@HOST@@", "@@ADDR@@"
# inventory data that names files of the machine a recording was made on, not the recorded
# host's state: the stand-in image archives (tritonfleet_testbed.standin_images) are built on
# each machine and their image IDs differ from build to build (layer times), so a replay that
# kept them sent every fake host down the `docker load` path, which a converged host never
# takes. Without them the deploy asks the host for the image (DockerImageId), finds it, and
# sends the same commands as with them (steps/triton.py ensure_image: one fact either way); the
# fake hosts get a client key of their own (write_hosts) in place of the recorded ssh_key.
LOCAL_ARTEFACTS = ("image_archives",)


class UnknownCommand(Exception):
    pass


# --- normalisation ----------------------------------------------------------------------------

# Ansible's remote temp directory: the command that makes it echoes its name back, which the
# control side then uses; an answer gets the name the command asked for (echoed)
ANSIBLE_TMP, ANSIBLE_TMP_MARK = re.compile(r"ansible-tmp-[0-9.]+-\d+-\d+"), "ansible-tmp-@@TMP@@"

# volatile parts of a command that differ between runs (none of these change what a converged
# host answers): pyinfra's and the deploy's temp names, run ids, timestamps
VOLATILE = [
    (re.compile(r"/tmp/pyinfra-[0-9a-f]+"), "/tmp/pyinfra-@@TMP@@"),
    (re.compile(r"\b(tritonfleet-run|run_id|runid)=[0-9A-Za-z._:-]+"), r"\1=@@RUN@@"),
    # the deploy lock's holder line (tritonfleet.core.runid.holder): user@machine, pid, start, run id, argv
    (re.compile(r"\S+@\S+ pid \d+, started [0-9-]+ [0-9:]+ UTC, run [0-9A-Za-z-]+: [^'\"\n]*"), "@@HOLDER@@"),
    # Ansible (bench/ansible/triton.yml): its remote temp directory's name (time, pid, random:
    # ansible/plugins/shell/__init__.py mkdtemp), the modules' zip entry time (AnsiballZ's
    # date_time, the build time), a copy task's local temp file for `content:` (its
    # _original_basename) and the local temp directory of the run
    (ANSIBLE_TMP, ANSIBLE_TMP_MARK),
    (re.compile(r"date_time = \(\d+, \d+, \d+, \d+, \d+, \d+\)"), "date_time = @@TIME@@"),
    (re.compile(r'(\\?"_original_basename\\?": \\?")(\.[0-9a-z_]{8}|tmp[0-9a-z_]+)(?=\\?")'), r"\1@@TMP@@"),
    (re.compile(r"ansible-local-\d+[0-9A-Za-z_]+"), "ansible-local-@@TMP@@"),
]
# commands that answer, then stay open until the control side closes them (the deploy lock:
# tritonfleet.pyinfra_ext.hostlock holds it for as long as the channel lives, sending heartbeats on stdin)
HOLD = re.compile(r"; while read -r -t \d+ _; do :; done")
# commands that read stdin until EOF: Ansible with pipelining runs every
# module as `/bin/sh -c '/usr/bin/python3 && sleep 0'` and sends the module (AnsiballZ) on
# stdin, then EOF (ansible/plugins/action/__init__.py _low_level_execute_command with in_data).
# Only these wait for stdin: pyinfra's commands never send EOF (the deploy lock's stdin stays
# open for its heartbeats), so waiting on theirs would hang them. Their answer is keyed on the
# command and a hash of the normalised stdin (stdin_key), as HTTP bodies are (Answers.http_key).
PIPELINED = re.compile(r"/bin/sh -c '(/\S*/)?python[0-9.]* && sleep 0'"
                       # and its file transfer when sftp and scp are refused (a changed file: a
                       # converged host is never sent one) (ansible/plugins/connection/ssh.py, piped)
                       r"|dd of=\S+ bs=\d+( count=\d+)?")
STDIN_TIMEOUT = 300  # seconds a pipelined command may take to send its stdin and EOF
# the module's zip (base64) inside an AnsiballZ payload: its bytes hold each entry's build time
ZIPDATA = re.compile(r"ZIPDATA = '([A-Za-z0-9+/=]*)'")
MODULE = re.compile(r"prefix='ansible_' \+ '([\w.]+)' \+ '_payload_'")
PARAMS = re.compile(r"ANSIBALLZ_PARAMS = '(.*)'")


def normalise(text: str, host: str, address: str) -> str:
    """``text`` with this host's own values replaced by markers (longest first, so an address that
    contains the name, or the other way round, is replaced whole), and volatile parts masked."""
    for value, mark in sorted(((host, HOST_MARK), (address, ADDR_MARK)), key=lambda p: -len(p[0])):
        if value:
            text = text.replace(value, mark)
    for rx, repl in VOLATILE:
        text = rx.sub(repl, text)
    return text


# an HTTP body's digest as matched, by the body's own sha256, for bodies that name no host: the
# same for every fake host. The warm gate's first inference of resnet50_onnx is a 0.75 MB body,
# and masking it (VOLATILE's expressions) for every host was a third of the fake fleet's CPU
# (py-spy on a 100-host shard); a fake host's CPU shares the machine with the control side.
_BODY_DIGESTS: dict[bytes, str] = {}


def body_digest(body: bytes, host: str, address: str) -> str:
    """The first 16 hex digits of the sha256 of ``body`` as normalised for this host."""
    text = body.decode(errors="replace")
    if (host and host in text) or (address and address in text):
        return hashlib.sha256(normalise(text, host, address).encode()).hexdigest()[:16]
    # naming neither, normalise() replaces nothing of this host's: the digest is any host's
    raw = hashlib.sha256(body).digest()
    digest = _BODY_DIGESTS.get(raw)
    if digest is None:
        digest = _BODY_DIGESTS[raw] = hashlib.sha256(normalise(text, "", "").encode()).hexdigest()[:16]
    return digest


def _zip_digest(m: re.Match) -> str:
    """An AnsiballZ module zip by its entries' names and contents (not their times)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(base64.b64decode(m.group(1), validate=True)))
        h = hashlib.sha256()
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            h.update(info.filename.encode() + b"\0" + zf.read(info) + b"\0")
    except (ValueError, zipfile.BadZipFile):
        return m.group(0)  # not a zip: compared as it is
    return f"ZIPDATA = @@ZIP {h.hexdigest()[:16]}@@"


def normalise_stdin(data: bytes, host: str, address: str) -> str:
    """A pipelined command's stdin as compared: the module zip by content, then ``normalise``."""
    return normalise(ZIPDATA.sub(_zip_digest, data.decode(errors="replace")), host, address)


def stdin_key(command: str, data: bytes, host: str, address: str) -> str:
    digest = hashlib.sha256(normalise_stdin(data, host, address).encode()).hexdigest()[:16]
    return f"{normalise(command, host, address)} <stdin {digest}>"


def describe_stdin(data: bytes) -> str:
    """What a pipelined command was asked to run: the Ansible module and its arguments."""
    text = data.decode(errors="replace")
    module, params = MODULE.search(text), PARAMS.search(text)
    if module is None:
        return f"{len(data)} bytes of stdin: {text[:200]!r}"
    return f"Ansible module {module.group(1)} {params.group(1)[:1500] if params else ''}"


def echoed(answer: str, command: str) -> str:
    """A recorded answer with the masked values its command asked for put back (Ansible's temp
    directory name, which the mkdir command prints and the control side uses next)."""
    m = ANSIBLE_TMP.search(command)
    return answer.replace(ANSIBLE_TMP_MARK, m.group(0)) if m else answer


def personalise(text: str, host: str, address: str) -> str:
    """A recorded (normalised) answer for one fake host."""
    return text.replace(HOST_MARK, host).replace(ADDR_MARK, address)


class Answers:
    """Recorded answers: normalised command -> (stdout, stderr, exit status)."""

    def __init__(self, commands: dict[str, dict] | None = None, meta: dict | None = None,
                 http: dict[str, dict] | None = None):
        self.commands = dict(commands or {})
        self.http = dict(http or {})  # "PORT METHOD PATH BODY-SHA" -> {"status", "type", "body"}
        self.meta = dict(meta or {})
        self.unknown: list[tuple[str, str]] = []  # (host, command as received)
        self.counts: dict[str, int] = {}  # remote commands a host answered
        self.http_counts: dict[str, int] = {}  # HTTP requests (the health gate's)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path = ANSWERS) -> Answers:
        """The answers in ``path``, and for the default file the Ansible playbook's too
        (ANSIBLE_ANSWERS, where recorded: without them an Ansible run fails loudly)."""
        if not path.is_file():
            raise SystemExit(f"{path} not found: record it with `python bench/fakefleet.py record` "
                             "(see the docstring of bench/fakefleet.py)")
        data = json.loads(path.read_text())
        answers = cls(data["commands"], data.get("meta"), data.get("http"))
        if path.resolve() == ANSWERS and ANSIBLE_ANSWERS.is_file():
            answers.merge(json.loads(ANSIBLE_ANSWERS.read_text()))
        return answers

    def merge(self, data: dict) -> None:
        """Another recording's commands and HTTP answers, where these have none (its meta stays
        its own; a request both recorded keeps this recording's answer)."""
        self.commands = {**data.get("commands", {}), **self.commands}
        self.http = {**data.get("http", {}), **self.http}

    def save(self, path: Path = ANSWERS) -> None:
        path.write_text(json.dumps({"meta": self.meta, "commands": self.commands, "http": self.http}, indent=1,
                                   sort_keys=True) + "\n")

    @staticmethod
    def http_key(port: int, method: str, path: str, body: bytes, host: str, address: str) -> str:
        return f"{port} {method} {normalise(path, host, address)} {body_digest(body, host, address)}"

    @staticmethod
    def command_key(command: str, host: str, address: str, stdin: bytes | None = None) -> str:
        """A command as it is matched against the recording (normalised; a pipelined command by
        what it read on stdin too)."""
        return normalise(command, host, address) if stdin is None else stdin_key(command, stdin, host, address)

    def answer(self, command: str, host: str, address: str,
               stdin: bytes | None = None) -> tuple[str, str, int, bool]:
        """``stdin``: what a pipelined command (PIPELINED) read to EOF, part of its key."""
        key = self.command_key(command, host, address, stdin)
        rec = self.commands.get(key)
        with self._lock:
            self.counts[host] = self.counts.get(host, 0) + 1
            if rec is None:
                self.unknown.append((host, command))
        if rec is None:
            raise UnknownCommand(key if stdin is None else f"{key} ({describe_stdin(stdin)})")
        return (echoed(personalise(rec["stdout"], host, address), command),
                echoed(personalise(rec["stderr"], host, address), command), int(rec["status"]), bool(rec.get("hold")))

    def http_answer(self, port: int, method: str, path: str, body: bytes, host: str, address: str) -> dict:
        key = self.http_key(port, method, path, body, host, address)
        rec = self.http.get(key)
        with self._lock:
            self.http_counts[host] = self.http_counts.get(host, 0) + 1
            if rec is None:
                self.unknown.append((host, key))
        if rec is None:
            raise UnknownCommand(key)
        return {**rec, "body": personalise(rec["body"], host, address)}

    def add(self, command: str, host: str, address: str, stdout: str, stderr: str, status: int,
            stdin: bytes | None = None) -> None:
        key = self.command_key(command, host, address, stdin)
        rec = {"stdout": normalise(stdout, host, address), "stderr": normalise(stderr, host, address),
               "status": status, "hold": bool(HOLD.search(key))}
        if stdin is not None:  # what it ran, for a reader of the file (the key holds only a hash)
            rec["stdin"] = describe_stdin(stdin)[:300]
        with self._lock:
            self.commands[key] = rec


# --- the SSH side -----------------------------------------------------------------------------

class _Server(paramiko.ServerInterface):
    def __init__(self, fleet: FakeFleet, host: str, address: str):
        self.fleet, self.host, self.address = fleet, host, address
        self.upstream: paramiko.SSHClient | None = None

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_auth_password(self, username, password):
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username):
        return "publickey,password"

    def check_channel_request(self, kind, chanid):
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        self.fleet.fail(self.host, f"channel of kind {kind!r} (no recorded answer for anything but commands)")
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_pty_request(self, *args):
        return True

    def check_channel_env_request(self, channel, name, value):
        return True

    def check_channel_subsystem_request(self, channel, name):
        self.fleet.fail(self.host, f"subsystem {name!r} (file transfer: not part of a converged host's run)")
        return False

    def check_channel_exec_request(self, channel, command):
        text = command.decode() if isinstance(command, bytes) else command
        channel._fake_exec = (self, text)  # started once paramiko has replied (_handle_request)
        return True


_handle_request = paramiko.Channel._handle_request


def _handle_request_then_exec(self, m):
    """paramiko sends the reply to an exec request after the server's check returns: answering
    from the check itself could send output and close the channel before that reply."""
    _handle_request(self, m)
    pending = self.__dict__.pop("_fake_exec", None)
    if pending is not None:
        server, text = pending
        threading.Thread(target=server.fleet.exec, args=(server, self, text), daemon=True).start()


paramiko.Channel._handle_request = _handle_request_then_exec
paramiko.Transport._channel_handler_table[paramiko.common.MSG_CHANNEL_REQUEST] = _handle_request_then_exec


class FakeFleet:
    """``hosts``: [(name, address)]; ``answers``: what to reply; ``upstream``: record mode, every
    command goes to this paramiko-connect kwargs' host and its answer is recorded."""

    def __init__(self, hosts: list[tuple[str, str]], answers: Answers, port: int = SSH_PORT,
                 upstream: dict | None = None, upstream_name: str | None = None, http_ports: tuple[int, ...] = (),
                 log: Path | None = None):
        self.http_ports = http_ports
        # every command and HTTP request as received, one JSON line each (serve --log)
        self.log = open(log, "a", buffering=1) if log else None  # noqa: SIM115 - closed in stop()
        self.hosts, self.answers, self.port, self.upstream = hosts, answers, port, upstream
        self.upstream_name = upstream_name
        self.key = paramiko.ECDSAKey.generate(bits=256)
        self.sel = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        self.failures: list[str] = []
        self.transports: list[paramiko.Transport] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        for name, addr in self.hosts:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((addr, self.port))
            except OSError as e:
                raise SystemExit(f"fakefleet: cannot listen on {addr}:{self.port} for {name}: {e}") from e
            s.listen(128)
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, (name, addr))
            self.socks.append(s)
        for name, addr in self.hosts:  # Triton's ports: accepted by the same loop, a thread a connection
            for port in self.http_ports:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((addr, port))
                except OSError as e:
                    raise SystemExit(f"fakefleet: cannot listen on {addr}:{port} for {name}: {e}") from e
                s.listen(128)
                s.setblocking(False)
                self.sel.register(s, selectors.EVENT_READ, (name, addr, port))
                self.socks.append(s)
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.sel.select(timeout=0.5):
                try:
                    conn, _peer = key.fileobj.accept()
                except (BlockingIOError, OSError):
                    continue
                conn.setblocking(True)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if len(key.data) == 3:  # HTTP
                    handler = _http_handler(self, *key.data)
                    threading.Thread(target=_serve_http, args=(handler, conn, _peer), daemon=True).start()
                    continue
                name, addr = key.data
                threading.Thread(target=self._serve, args=(conn, name, addr), daemon=True).start()

    def _serve(self, conn: socket.socket, name: str, addr: str) -> None:
        t = paramiko.Transport(conn)
        t.add_server_key(self.key)
        server = _Server(self, name, addr)
        try:
            t.start_server(server=server)
        except (paramiko.SSHException, EOFError, OSError):
            return
        # paramiko wakes an idle transport every 0.1 s: with hundreds of fake hosts that alone kept
        # a CPU busy (tritonfleet.pyinfra_ext.connection does the same on the control side)
        conn.settimeout(1.0)
        with self._lock:  # the transport's own thread serves it; channels are answered by exec threads
            self.transports.append(t)

    def received(self, host: str, kind: str, text: str, key: Callable[[], str], answered: bool,
                 status: int | None = None) -> None:
        """One line of the --log file: what a fake host was sent, exactly (``request``), as it was
        matched against the recording (``key``: normalised, what ``commands`` prints), and whether
        the recording answered it (``status``: the exit status or HTTP status it got). ``key`` is
        computed only when there is a log."""
        if self.log is None:
            return
        line = json.dumps({"time": round(time.time(), 3), "host": host, "kind": kind, "answered": answered,
                           "status": status, "request": text, "key": key()})
        with self._lock:
            self.log.write(line + "\n")

    def fail(self, host: str, what: str) -> None:
        msg = f"{host}: {what}"
        with self._lock:
            self.failures.append(msg)
        print(f"[fakefleet] NO RECORDED ANSWER: {msg}", file=sys.stderr, flush=True)

    def exec(self, server: _Server, channel: paramiko.Channel, command: str) -> None:
        try:
            hold = False
            stdin = None
            if PIPELINED.fullmatch(command):
                try:
                    stdin = read_stdin(channel, STDIN_TIMEOUT)
                except TimeoutError:
                    self.fail(server.host, f"command {command!r}: no end of its stdin within {STDIN_TIMEOUT} s")
                    channel.sendall_stderr(f"fakefleet: stdin not closed within {STDIN_TIMEOUT} s\n".encode())
                    channel.send_exit_status(255)
                    return

            def key() -> str:
                return Answers.command_key(command, server.host, server.address, stdin)

            if self.upstream is not None and HOLD.search(command):
                status = self._forward_hold(server, channel, command)
                self.received(server.host, "ssh", command, key, True, status)
                channel.send_exit_status(status)
                return
            if self.upstream is not None:
                out, err, status = self._forward(server, command, stdin)
                self.received(server.host, "ssh", command, key, True, status)
            else:
                try:
                    out, err, status, hold = self.answers.answer(command, server.host, server.address, stdin)
                    self.received(server.host, "ssh", command, key, True, status)
                except UnknownCommand as e:
                    self.received(server.host, "ssh", command, key, False, 255)
                    self.fail(server.host, f"command {str(e)[:3000]!r}")
                    out, err, status = "", f"fakefleet: no recorded answer for this command on {server.host}: " \
                                           f"{command[:500]}\n", 255
            if out:
                channel.sendall(out.encode())
            if err:
                channel.sendall_stderr(err.encode())
            while hold and channel.recv(4096):  # until the control side sends EOF or closes
                pass
            channel.send_exit_status(status)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            try:
                channel.close()
            except (OSError, EOFError, paramiko.SSHException):  # the client is gone already
                pass

    def _forward(self, server: _Server, command: str, stdin: bytes | None = None) -> tuple[str, str, int]:
        self._forward_connect(server)
        si, so, se = server.upstream.exec_command(command)
        if stdin is not None:
            si.write(stdin)
            si.channel.shutdown_write()
        out, err = so.read().decode(), se.read().decode()
        status = so.channel.recv_exit_status()
        # the real host's name appears in its answers as the real name: record it as the fake's
        real = self.upstream_name or server.host
        out, err = out.replace(real, server.host), err.replace(real, server.host)
        self.answers.add(command, server.host, server.address, out, err, status, stdin)
        return out, err, status

    def _forward_hold(self, server: _Server, channel: paramiko.Channel, command: str) -> int:
        """A command that answers, then stays open (the deploy lock) in record mode: its answer up
        to ``locked`` is recorded and sent, then the control side's stdin (the lock's heartbeats)
        goes to the real host until the control side closes, as a replay holds it."""
        self._forward_connect(server)
        si, so, se = server.upstream.exec_command(command)
        lines = []
        while line := so.readline():
            lines.append(line)
            if line.strip() == "locked":
                break
        out = "".join(lines).replace(self.upstream_name or server.host, server.host)
        channel.sendall(out.encode())
        if not lines or lines[-1].strip() != "locked":  # busy, or no lock: it ended with its status
            status = so.channel.recv_exit_status()
            self.answers.add(command, server.host, server.address, out, se.read().decode(), status)
            return status
        self.answers.add(command, server.host, server.address, out, "", 0)
        while data := channel.recv(4096):  # until the control side sends EOF or closes
            si.write(data)
        si.channel.shutdown_write()
        so.channel.recv_exit_status()
        return 0

    def _forward_connect(self, server: _Server) -> None:
        with self._lock:  # one upstream connection a fake host (Ansible runs commands on it at once)
            if server.upstream is None:
                c = paramiko.SSHClient()
                c.set_missing_host_key_policy(paramiko.AutoAddPolicy())
                c.connect(**self.upstream)
                server.upstream = c

    def stop(self) -> None:
        self._stop.set()
        for t in list(self.transports):
            t.close()
        for s in self.socks:
            s.close()
        if self.log is not None:
            with self._lock:
                self.log.close()
                self.log = None

    def http(self, name: str, addr: str, port: int, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if self.upstream is not None:
            c = http.client.HTTPConnection(self.upstream["hostname"], port, timeout=30)
            c.request(method, path, body=body or None, headers={"Content-Type": "application/json"} if body else {})
            r = c.getresponse()
            data, ctype, status = r.read(), r.getheader("Content-Type", ""), r.status
            c.close()
            text = data.decode(errors="replace")
            key = Answers.http_key(port, method, path, body, name, addr)
            with self.answers._lock:
                self.answers.http[key] = {"status": status, "type": ctype, "body": normalise(text, name, addr)}
            return status, ctype, data
        request = f"{port} {method} {path}" + (f" <{len(body)} bytes: {body[:200]!r}>" if body else "")

        def key() -> str:
            return Answers.http_key(port, method, path, body, name, addr)

        try:
            rec = self.answers.http_answer(port, method, path, body, name, addr)
        except UnknownCommand as e:
            self.received(name, "http", request, key, False, 599)
            self.fail(name, f"HTTP request {e}")
            return 599, "text/plain", f"fakefleet: no recorded answer for {method} {path} on {name}\n".encode()
        self.received(name, "http", request, key, True, rec["status"])
        return rec["status"], rec["type"], rec["body"].encode()


def read_stdin(channel: paramiko.Channel, timeout: float = STDIN_TIMEOUT) -> bytes:
    """A pipelined command's stdin, to EOF (raises on a client that never sends it)."""
    channel.settimeout(timeout)
    parts = []
    while chunk := channel.recv(65536):
        parts.append(chunk)
    channel.settimeout(None)
    return b"".join(parts)


def _serve_http(handler, conn: socket.socket, peer) -> None:
    try:
        handler(conn, peer, None)
    except OSError:  # the client gave up (its timeout): that is the client's to report
        pass
    finally:
        conn.close()


def _http_handler(fleet: FakeFleet, name: str, addr: str, port: int):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, ctype, data = fleet.http(name, addr, port, self.command, self.path, body)
            self.send_response(status)
            if ctype:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_HEAD = _any

        def log_message(self, *args):
            pass

    return Handler


# --- addresses and inventory ------------------------------------------------------------------

def addresses(n: int, testbed: int) -> list[tuple[str, str]]:
    """``n`` fake hosts: names fake-0001.., addresses 127.<100 + testbed>.x.y (y in 1..250), so
    two testbeds on one machine never share one."""
    if not 0 <= testbed < 150:
        raise SystemExit(f"TRITONFLEET_TESTBED={testbed}: fake fleets take 0-149")
    out = []
    for i in range(n):
        out.append((f"fake-{i + 1:04d}", f"127.{100 + testbed}.{i // 250}.{i % 250 + 1}"))
    return out


def shard(hosts: list[tuple[str, str]], i: int, k: int) -> list[tuple[str, str]]:
    """Process ``i`` of ``k``'s share of the fleet: every k-th host (the shares are disjoint and
    together the whole fleet)."""
    if not 0 <= i < k:
        raise SystemExit(f"fakefleet: --shard {i} of --shards {k}: 0 <= shard < shards")
    return hosts[i::k]


def replayable(data: dict) -> dict:
    """The recorded host's inventory data without what names the recording machine's own build
    artefacts (LOCAL_ARTEFACTS): what a replay on any machine, or a recording, gives the fake hosts."""
    return {k: v for k, v in data.items() if k not in LOCAL_ARTEFACTS}


def write_hosts(path: Path, hosts: list[tuple[str, str]], answers: Answers, port: int,
                own_key: bool = True) -> None:
    """The hosts file bench/fake_inventory.py reads. ``own_key``: the fake hosts get a client key
    of their own next to it (they accept any key), so the recorded host's key need not exist."""
    meta = answers.meta
    data = replayable(meta.get("data", {}))
    if own_key:
        key = path.parent / "fakefleet-client-key"
        if not key.exists():
            paramiko.ECDSAKey.generate(bits=256).write_private_key_file(str(key))
            key.chmod(0o600)
        data["ssh_key"] = str(key)
    path.write_text(json.dumps({"group": meta.get("group", "t4"), "data": data, "port": port,
                                "hosts": [[n, a] for n, a in hosts]}, indent=1))


# parts of a request that differ from run to run but are no part of what the deploy decides: a
# failure record's time stamp (tritonfleet.core.report), as written and as JSON inside a command
VIEW_VOLATILE = [(re.compile(r'(\\?"time\\?": \\?")[0-9T:Z.-]+'), r"\1@@TIME@@")]


def command_log(logs: list[Path], skip: dict[Path, int] | None = None) -> str:
    """The --log files as a refactor's oracle: every request as it was matched (``key``:
    per-host values and volatile parts masked), one line each, ``host<TAB>ssh|http<space>key``,
    per host in the order received, hosts sorted. Two runs of the same deploy print the same
    text, so a change that should change nothing on the wire is compared byte for byte against a
    run of the code before it. ``skip``: lines of each file already seen (an earlier run's)."""
    by_host: dict[str, list[str]] = {}
    for path in logs:
        for line in path.read_text().splitlines()[(skip or {}).get(path, 0):]:
            rec = json.loads(line)
            key = rec["key"]
            for pattern, mask in VIEW_VOLATILE:
                key = pattern.sub(mask, key)
            by_host.setdefault(rec["host"], []).append(f"{rec['kind']} {key}".replace("\n", "\\n"))
    return "".join(f"{h}\t{line}\n" for h in sorted(by_host) for line in by_host[h])


def _testbed() -> int:
    if "TRITONFLEET_TESTBED" not in os.environ:
        raise SystemExit("export TRITONFLEET_TESTBED=<n> first")
    return int(os.environ["TRITONFLEET_TESTBED"])


def serve(args, stop: threading.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop``); exit status 3 if any request had no answer."""
    answers = Answers.load(Path(args.answers))
    hosts = addresses(args.hosts, _testbed())
    hosts = shard(hosts, args.shard, args.shards)
    fleet = FakeFleet(hosts, answers, port=args.port, http_ports=_http_ports(answers.meta.get("data", {})),
                      log=Path(args.log) if args.log else None)
    fleet.start()
    write_hosts(Path(args.hosts_file), hosts, answers, args.port)
    if stop is None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *a: stop.set())
        signal.signal(signal.SIGINT, lambda *a: stop.set())
    def dump(*_):
        if args.counts_file:
            with answers._lock:
                Path(args.counts_file).write_text(json.dumps({"counts": answers.counts, "http": answers.http_counts,
                                                            "failures": fleet.failures}))

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, dump)
    print(f"[fakefleet] ready: {len(hosts)} hosts", flush=True)
    stop.wait()
    fleet.stop()
    dump()
    if fleet.failures:
        print(f"[fakefleet] FAILED: {len(fleet.failures)} request(s) had no recorded answer; re-record with "
              f"`python bench/fakefleet.py record` if the deploy changed on purpose:", file=sys.stderr)
        for f in fleet.failures[:20]:
            print(f"  {f[:600]}", file=sys.stderr)
        return 3
    return 0


def record(args) -> int:
    """Run the deploy (no-op), status and a --dry plan against one fake host that forwards to a
    converged testbed host, and store every command with its answer."""
    import subprocess

    sys.path.insert(0, str(ROOT))
    from tritonfleet.inventory.roster import load_inventory

    testbed = _testbed()
    real = [h for h in load_inventory("inventories/testbed.py") if not args.host or h.name == args.host]
    if not real:
        raise SystemExit(f"no testbed host {args.host or ''}: `tritonfleet testbed up` first")
    h = real[0]
    group = "l4" if "l4" in h.groups else "t4"
    from tritonfleet.settings.defaults import DEFAULTS

    # everything the host's inventory and group data set (the defaults apply to the fake hosts too)
    data = replayable({k: v for k, v in h.data.items()
                       if not k.startswith("_pyinfra") and k not in ("ssh_hostname", "ssh_port")
                       and (k not in DEFAULTS or DEFAULTS[k] != v)})
    json.dumps(data)  # fails here, naming the value, if some data is not plain JSON
    answers = Answers(meta={"group": group, "data": data, "recorded_from": h.name,
                            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "command": "python bench/fakefleet.py record"})
    name, addr = addresses(1, testbed)[0]
    upstream = {"hostname": h.address, "username": data.get("ssh_user", "root"),
                "key_filename": data["ssh_key"], "allow_agent": False, "look_for_keys": False}
    fleet = FakeFleet([(name, addr)], answers, port=args.port, upstream=upstream, upstream_name=h.name,
                      http_ports=_http_ports(h.data))
    fleet.start()
    work = ROOT / "bench" / ".work"
    work.mkdir(parents=True, exist_ok=True)
    hosts_file = work / "fake-record.json"
    write_hosts(hosts_file, [(name, addr)], answers, args.port, own_key=False)
    env = dict(os.environ, TRITONFLEET_FAKEFLEET=str(hosts_file))
    binp = Path(sys.executable).parent
    runs = [[str(binp / "pyinfra"), "-y", "bench/fake_inventory.py", "deploys/triton.py"],
            [str(binp / "pyinfra"), "-y", "bench/fake_inventory.py", "deploys/triton.py"],
            [str(binp / "pyinfra"), "-y", "--json", "--dry", "--limit", name, "bench/fake_inventory.py",
             "deploys/triton.py"],
            [str(binp / "tritonfleet"), "status", "bench/fake_inventory.py"],
            # what the health gate asks while it waits (a host slow to answer): tritonfleet.serving.unit_watch
            [sys.executable, "-c", "from tritonfleet.inventory import roster; from tritonfleet.serving import unit_watch; h = roster.load_inventory("
             "'bench/fake_inventory.py')[0]; g = h.get; print(roster.run(h, unit_watch.watch_command("
             "g('triton_service'), g('triton_container_name'), g('triton_base_dir')))[0])"]]
    try:
        for cmd in runs:
            res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
            print(f"[fakefleet] {' '.join(cmd[1:])}: exit {res.returncode}", file=sys.stderr)
            if res.returncode != 0 and "status" not in cmd:
                print(res.stderr[-3000:], file=sys.stderr)
                return 1
    finally:
        fleet.stop()
    if fleet.failures:
        return 1
    answers.save(Path(args.answers))
    print(f"[fakefleet] {len(answers.commands)} commands recorded in {args.answers}", file=sys.stderr)
    return 0


def record_ansible(args) -> int:
    """The Ansible playbook's no-op (bench/ansible/triton.yml, as bench/run.py's 1-host comparison
    runs it) through one fake host forwarding to a converged testbed host: a warm-up run (Ansible
    installs what its modules need), then the recorded run, which must be a clean no-op; then
    the recording replayed (no forwarding) must answer a third run whole. Writes ANSIBLE_ANSWERS."""
    import subprocess

    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    import ansible_scale

    from tritonfleet.inventory.roster import load_inventory
    from tritonfleet.settings.defaults import DEFAULTS

    if not ansible_scale.ANSIBLE.exists():
        raise SystemExit("Ansible missing: run `bash bench/setup` first")
    testbed = _testbed()
    real = [h for h in load_inventory("inventories/testbed.py") if not args.host or h.name == args.host]
    if not real:
        raise SystemExit(f"no testbed host {args.host or ''}: `tritonfleet testbed up` first")
    h = real[0]
    work = ROOT / "bench" / ".work" / "ansible-record"
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "ansible_vars.py"), "inventories/testbed.py",
                          str(work), "--limit", h.name], cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stderr[-3000:], file=sys.stderr)
        return 1
    host_vars = json.loads((work / "host_vars" / f"{h.name}.json").read_text())
    user = h.data.get("ssh_user") or "root"
    answers = Answers(meta={"group": "gpu", "data": {"ssh_user": user, "ssh_key": h.data["ssh_key"]},
                            "vars": ansible_scale.recorded_vars(host_vars, ROOT / str(h.data.get("model_repository") or DEFAULTS["model_repository"])),
                            "recorded_from": h.name,
                            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "command": "python bench/fakefleet.py record --ansible"})
    name, addr = addresses(1, testbed)[0]
    upstream = {"hostname": h.address, "username": user, "key_filename": h.data["ssh_key"],
                "allow_agent": False, "look_for_keys": False}
    hosts_file = work / "fake-hosts.json"
    write_hosts(hosts_file, [(name, addr)], answers, args.port, own_key=False)
    cfg = ansible_scale.write_inventory(work, hosts_file, answers.meta["vars"])

    # one fake host for all three runs (forwarding, then answering from the recording)
    fleet = FakeFleet([(name, addr)], Answers(), port=args.port, upstream=upstream, upstream_name=h.name,
                      http_ports=_http_ports(h.data))

    def playbook(what: str) -> bool:
        res = subprocess.run([sys.executable, str(ROOT / "bench" / "ansible_scale.py"), "run", str(cfg), "1",
                              "5"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
        print(f"[fakefleet] Ansible {what}: exit {res.returncode}", file=sys.stderr)
        if res.returncode != 0 or fleet.failures:
            print(res.stdout[-4000:] + res.stderr[-3000:], file=sys.stderr)
            return False
        return True

    fleet.start()
    try:
        # the warm-up may change the host (one Ansible never ran on): only the next run is recorded
        playbook("warm-up run (not recorded)")
        fleet.failures.clear()
        fleet.answers = answers
        if not playbook("recorded run"):
            return 1
        fleet.upstream, fleet.answers = None, Answers(answers.commands, answers.meta, answers.http)
        if not playbook("replayed from the recording"):
            print("[fakefleet] the recording does not answer a second run: some part of what Ansible sends "
                  "differs between runs and is not masked yet (VOLATILE in bench/fakefleet.py)", file=sys.stderr)
            return 1
    finally:
        fleet.stop()
    answers.save(Path(args.answers or ANSIBLE_ANSWERS))
    print(f"[fakefleet] {len(answers.commands)} commands and {len(answers.http)} HTTP requests recorded in "
          f"{args.answers or ANSIBLE_ANSWERS}", file=sys.stderr)
    return 0


def _http_ports(data: dict) -> tuple[int, ...]:
    """Triton's HTTP and metrics ports: what the health gate reads from the control machine."""
    from tritonfleet.settings.defaults import DEFAULTS

    return tuple(int(data.get(k) or DEFAULTS[k]) for k in ("triton_http_port", "triton_metrics_port"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--hosts", type=int, required=True)
    s.add_argument("--hosts-file", required=True)
    s.add_argument("--counts-file")
    s.add_argument("--answers", default=str(ANSWERS))
    s.add_argument("--port", type=int, default=SSH_PORT)
    s.add_argument("--shard", type=int, default=0, help="serve every SHARDS-th host from this one (0-based)")
    s.add_argument("--shards", type=int, default=1, help="processes the fleet is split over")
    s.add_argument("--log", help="append every command and HTTP request received, as JSON lines (host, kind, "
                   "answered, status, request: exactly; key: as matched, what `commands` prints)")
    c = sub.add_parser("commands", help="print serve --log files as matched, per host (a refactor's oracle)")
    c.add_argument("logs", nargs="+")
    r = sub.add_parser("record")
    r.add_argument("--host")
    r.add_argument("--answers", help=f"default {ANSWERS.name}, with --ansible {ANSIBLE_ANSWERS.name}")
    r.add_argument("--port", type=int, default=SSH_PORT)
    r.add_argument("--ansible", action="store_true",
                   help=f"record the Ansible playbook's no-op (bench/ansible/triton.yml) into {ANSIBLE_ANSWERS.name}")
    args = ap.parse_args(argv)
    if args.what == "serve":
        return serve(args)
    if args.what == "commands":
        sys.stdout.write(command_log([Path(p) for p in args.logs]))
        return 0
    if args.ansible:
        return record_ansible(args)
    args.answers = args.answers or str(ANSWERS)
    return record(args)


if __name__ == "__main__":
    sys.exit(main())
