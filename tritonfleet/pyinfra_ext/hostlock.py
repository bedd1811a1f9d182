"""One run at a time per host: a deploy lock on the host, held for the whole run.

Two operators' runs interleaving on one host (one switching the model release while the other
builds it, one restarting Triton in the middle of the other's health gate) is prevented by an
exclusive ``flock`` on ``/run/tritonfleet/deploy.lock`` on the host (a 0700 directory of root's own). The lock is held by a small
remote process, started by the deploy file's ``pyinfra_patches.install()`` (pyinfra has
connected to every host by then, and has read no fact yet). ``acquire_all(wait=False)`` starts
every host's holder and returns; the deploy file goes on importing its steps while the holders
connect (speed-only ``lock_early``, docs/scale.md: time a run otherwise spends idle), and
:func:`wait_all` waits for them: called by pyinfra's every way to a host (``gate_host_io``) and
by every step of the package, so no command reaches any host before every lock is held, but
one read-only command that is kept only if no other run held the lock in between
(:func:`read_before_lock`, below):

    bash: mkdir -p -m 700 /run/tritonfleet; exec 9>>LOCK; flock 9 (waiting up to
          deploy_lock_timeout); print the line it found, then write who holds it;
          then read heartbeats from the control machine, one every ssh_keepalive_interval

The holder ends, and the kernel releases the lock, when the run ends or can no longer hold it:

* the run ends (normally, Ctrl-C, SIGKILL): its heartbeat process stops within one interval
  (it watches the run's pid), the SSH session sees end of input;
* the link or the control machine dies: no heartbeat arrives for ssh_keepalive_interval x
  ssh_keepalive_count seconds (``read -t``), whatever the TCP connection still believes;
* the host reboots (/run is a tmpfs): the deploy takes the lock again after the reboot
  (tritonfleet.host.ops.reboot).

The run checks before each command to a host that the host's holder still runs
(:func:`check_held`): a holder that ended (its SSH connection died while pyinfra's survived) fails
the host before its next command there, since another run may hold the lock by then.

A second run waits up to ``deploy_lock_timeout`` seconds, saying whom it waits for; then it stops
before anything changed on any host, naming the holder (user, control machine, pid, start time,
run id, command). The heartbeats come from a separate process, not from the deploy's Python,
so a long CPU-bound phase of pyinfra (hashing a large model repository) never starves them: one
process for all of a run's hosts (``start_beater``), writing a line down each holder's pipe; the
holders are started with posix_spawn, not fork (``Child``). A run thus costs one OpenSSH client a
host and one more process, not three processes a host (docs/scale.md). The holder runs over the OpenSSH client when the host
allows it (tritonfleet.pyinfra_ext.transfer's ``auto`` rule), else on pyinfra's own connection (heartbeats
then come from the deploy process).

``--dry`` runs and the Python API take no lock: they change nothing.
"""

from __future__ import annotations

import atexit
import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pyinfra
from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.context import ctx_state

from ..core import runid, speed
from ..core.errors import TritonfleetError
from ..core.exits import exit_for
from ..core.shell import q
from ..settings.defaults import DEFAULTS
from . import transfer
from .children import Child, available, cooperative, start_beater
from .connection import keepalive

# in a directory of root's own (0700, made by the lock's command): in world-writable /run/lock,
# any local user could open the file and flock it (flock works on a read-only descriptor) and so
# block every deploy, or pre-create it; in /run (a tmpfs: gone at a reboot) only root creates it
LOCK_FILE = "/run/tritonfleet/deploy.lock"
BUSY, NO_FLOCK, NO_FILE = 75, 72, 71
# the holder's first try for the lock waits this long (seconds) before it says whom it waits for:
# a run's read of the host before its lock (pre-flight's facts, :func:`seen_command`) holds the
# lock shared for a few milliseconds, and must not read as another run holding it (with
# deploy_lock_timeout = 0 a holder that found the lock taken at once gave up at once)
FIRST_TRY = 1
# the holder's OpenSSH connection offers curve25519 first, the key exchange pyinfra's own
# connection (paramiko) makes: OpenSSH 9's default, sntrup761x25519, made the holder's start to
# "locked" 65 ms slower on a testbed host (median 250 against 185 ms, 6 runs each, 2026-12-06), and
# the deploy waits for that start. The holder's session carries only the lock's script and
# heartbeats; the server still picks, and a server without curve25519 gets OpenSSH's default list
HOLDER_KEX_FIRST = "curve25519-sha256,curve25519-sha256@libssh.org"
GROUP_DATA = "inventories/group_data/all.py"


class LockError(TritonfleetError):
    """Stops the run before any operation ran (raised while pyinfra prepares operations)."""

    def __init__(self, message: str):
        super().__init__(f"tritonfleet: no host was changed:\n{message}")


def lock_script(holder: str, wait: int, dead: int) -> str:
    """bash: take the lock (waiting up to ``wait`` s), record ``holder`` in it, then hold it while
    a heartbeat line arrives on stdin at least every ``dead`` seconds."""
    take = (
        f'flock -w {int(wait)} 9 || {{ echo "busy $(head -n 1 {LOCK_FILE})"; exit {BUSY}; }}'
        if wait > 0
        else f'{{ echo "busy $(head -n 1 {LOCK_FILE})"; exit {BUSY}; }}'
    )
    lock_dir = os.path.dirname(LOCK_FILE)
    return (
        f"command -v flock >/dev/null || {{ echo 'noflock'; exit {NO_FLOCK}; }}; "
        f"umask 077; mkdir -p {q(lock_dir)} && chmod 700 {q(lock_dir)} || exit {NO_FILE}; "
        f"exec 9>>{LOCK_FILE} || exit {NO_FILE}; "
        f'if ! flock -w {FIRST_TRY} 9; then echo "waiting $(head -n 1 {LOCK_FILE})"; {take}; fi; '
        f"_tfprev=; IFS= read -r _tfprev < {LOCK_FILE} || :; printf 'prev %s\\n' \"$_tfprev\"; "
        f"printf '%s\\n' {q(holder)} > {LOCK_FILE}; echo locked; "
        f"while read -r -t {int(dead)} _; do :; done"
    )


# --------------------------------------------------------------------------- read while locking
#
# A run's first read of a host (pre-flight's facts) may go out while the host's holder connects;
# it is kept only if no other run held the lock from that read until this run's holder took it,
# else read again under the lock. It starts with seen_command: a shared flock tried at once
# (refused while any run holds the lock) and the holder line then in the file (every holder, of
# every version, writes its run's own line as it takes the lock). The holder prints the line it
# found ("prev ..."): the same line means no run took the lock since the read began, and none held it then.
# A read that finds the lock held by this run's own holder (its line in the file: a holder writes it
# only once it holds the lock, and holds it to the run's end) stands too: the facts after it were
# read under this run's lock. That is the common case when the holder connects before the deploy
# file's imports are done (a slow control machine, many hosts): without it every such host was
# read twice (bench/run.py noop, 2026-12-07: 2 commands a no-op, the second 0.18 s).

SEEN = "@@tritonfleet-lock-seen@@"


class Seen(NamedTuple):
    """What :func:`seen_command` found: whether no run held the lock, and the holder line then in
    the lock file ("" for none, or when it could not be read)."""

    free: bool
    line: str


def seen_command() -> str:
    """sh (dash too): ``SEEN free <line>`` when no run holds the deploy lock (the holder line in the
    lock file, empty when there is none), else ``SEEN held <line>`` (held, unreadable, no flock;
    the line read without the lock, empty when unreadable)."""
    return (
        f"if [ ! -e {LOCK_FILE} ]; then echo '{SEEN} free'; "
        f"elif command -v flock >/dev/null 2>&1 && {{ flock -n -s 8 && {{ _tfl=; IFS= read -r _tfl <&8 || :; "
        f"printf '{SEEN} free %s\\n' \"$_tfl\"; }}; }} 8<{LOCK_FILE}; then :; "
        f"else _tfl=; IFS= read -r _tfl <{LOCK_FILE} || :; printf '{SEEN} held %s\\n' \"$_tfl\"; fi"
    )


def parse_seen(lines: list[str] | None) -> Seen | None:
    """What :func:`seen_command` printed, else None (no such line: the read says nothing)."""
    for line in lines or ():
        for free in (True, False):
            head = f"{SEEN} {'free' if free else 'held'}"
            if line == head or line.startswith(f"{head} "):
                return Seen(free, line[len(head) + 1 :])
    return None


def remote_command(host, script: str) -> str:
    """``script`` under bash on the host, with sudo when the inventory asks for it."""
    command = f"bash -c {q(script)}"
    data = getattr(host, "data", None)
    if data is not None and data.get("_sudo"):
        command = f"sudo -n -H -- {command}"
    return command


class Holder:
    """The process holding one host's lock (see the module docstring)."""

    def __init__(self, host, wait: int, interval: int, count: int, holder: str | None = None):
        self.host, self.wait, self.interval, self.count = host, wait, interval, count
        self.holder = holder or runid.holder()
        self.procs: list = []  # Child (the holder), then its own heartbeat process if it has one
        self.channel = None
        self.beat_fd: int | None = None
        self.waited_for = ""
        self.previous: str | None = None  # the holder line the lock file had when this holder took it
        self.ending = False  # the host reboots: its holder's end is expected (reacquire follows)

    def _script(self) -> str:
        return lock_script(self.holder, self.wait, self.interval * self.count)

    def start(self, beater: bool = True) -> None:
        """Start the holder process. Its heartbeats come from a process of its own (``beater``),
        or, for a whole run's holders started together, from one shared process that
        ``acquire_all`` starts once they all are (``beat_fd`` is then this holder's pipe end)."""
        how = transfer.choose(self.host, "auto")
        if how == "connection":
            self._start_channel()
            return
        argv = self.argv(how)
        read, self.beat_fd = os.pipe()
        # posix_spawn, not fork: the cost does not grow with this process's size (gevent's Popen,
        # pyinfra's under its patching, forks and copies the page tables: docs/scale.md,
        # "Speed-only features"). No die_with_parent (it needs fork): the holder ends
        # with the run anyway, as the run's end ends its heartbeat process (PR_SET_PDEATHSIG) and
        # the holder reads end of input and lets go
        try:
            proc = Child(argv, stdin=read)
        finally:
            os.close(read)
        self.procs = [proc]
        if beater:
            self.procs.append(start_beater([self.beat_fd], self.interval))
            self.beat_fd = None

    def argv(self, how: str) -> list[str]:
        """The holder's command line: over its own OpenSSH client (``how`` "ssh") or, for the
        control machine itself, a local shell."""
        remote = remote_command(self.host, self._script())
        if how == "ssh":
            return transfer.ssh_argv(self.host, remote, kex_first=HOLDER_KEX_FIRST)
        return ["sh", "-c", remote]

    def _start_channel(self) -> None:
        transport = self.host.connector.client.get_transport()
        chan = transport.open_session(timeout=self.interval * self.count)
        chan.exec_command(remote_command(self.host, self._script()))
        self.channel = chan

        def beat():
            while not chan.closed:
                try:
                    chan.sendall(b"\n")
                except OSError:
                    return
                time.sleep(self.interval)

        threading.Thread(target=beat, daemon=True).start()

    def _lines(self):
        if self.channel is not None:
            f = self.channel.makefile("rb")
            yield from (ln.decode(errors="replace") for ln in f)
            return
        for ln in cooperative(self.procs[0].stdout):
            yield ln.decode(errors="replace")

    def _stderr(self) -> str:
        if self.channel is not None:
            return self.channel.makefile_stderr("rb").read().decode(errors="replace").strip()
        proc = self.procs[0]
        try:
            proc.wait(self.interval * self.count)
        except subprocess.TimeoutExpired:
            return ""
        return cooperative(proc.stderr).read().decode(errors="replace").strip()

    def acquire(self, say=None, started: bool = False) -> str:
        """Wait for the lock. Returns "" once held, else why not (one line, naming the fix).
        ``started``: start() was called already (acquire_all starts every holder first)."""
        if not started:
            self.start()
        for line in self._lines():
            line = line.rstrip("\n")
            if line == "locked":
                return ""
            if line.startswith("prev "):
                self.previous = line[len("prev ") :]
            if line.startswith("waiting "):
                self.waited_for = line[len("waiting ") :]
                if say:
                    say(
                        f"{self.host.name}: waiting up to {self.wait}s for the deploy lock, held by "
                        f"{self.waited_for or 'an earlier run'}"
                    )
            elif line.startswith("busy "):
                who = line[len("busy ") :] or self.waited_for or "another run"
                self.release()
                return (
                    f"{self.host.name}: another run holds the deploy lock ({LOCK_FILE} on the host): "
                    f"{who}. Waited {self.wait}s for it (deploy_lock_timeout in {GROUP_DATA} or the "
                    "inventory). Let that run finish (or stop it), then run again"
                )
            elif line == "noflock":
                self.release()
                return (
                    f"{self.host.name}: the host has no `flock` command (util-linux), which the deploy "
                    "lock needs: install util-linux on the host"
                )
        err = self._stderr()
        self.release()
        return (
            f"{self.host.name}: could not take the deploy lock ({LOCK_FILE} on the host): "
            f"{err or 'the holder process ended'}"
        )

    def alive(self) -> bool:
        """Whether the holder still runs (and so still holds the lock on the host)."""
        if self.channel is not None:
            return not (self.channel.closed or self.channel.exit_status_ready())
        return bool(self.procs) and self.procs[0].poll() is None

    def last_words(self) -> str:
        """How an ended holder ended, for the report: its exit (the OpenSSH client's 255 is its
        connection; 0 is the lock script's own end, no heartbeat having reached it for
        ssh_keepalive_interval x ssh_keepalive_count seconds) and the end of what it said."""
        if self.channel is not None or not self.procs:
            return "on pyinfra's own connection"
        code = self.procs[0].returncode
        if code == 255:
            what = "exit 255: its SSH connection failed"
        elif code == 0:
            what = f"exit 0: no heartbeat reached it for {self.interval * self.count}s"
        elif code is not None and code < 0:
            what = f"killed by signal {-code}"
        else:
            what = f"exit {code}"
        said = " ".join(available(self.procs[0].stderr).decode(errors="replace").split())
        return what + (f"; it said: {said[-300:]}" if said else "")

    def end(self) -> None:
        """Send the holder's processes SIGKILL without waiting for them (release waits)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def release(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.beat_fd is not None:  # started, its shared heartbeat process never was
            os.close(self.beat_fd)
            self.beat_fd = None
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            if isinstance(p, Child):
                p.close()
        self.procs = []


_beaters: list[Child] = []


_held: dict[str, Holder] = {}


def enabled() -> bool:
    """Locks are taken by pyinfra's CLI runs that change hosts (not --dry, not the API)."""
    return bool(pyinfra.is_cli) and "--dry" not in sys.argv[1:]


def _settings(host) -> tuple[int, int, int]:
    data = host.data
    interval, count = keepalive(data)  # ValueError names the tunable
    wait = data.get("deploy_lock_timeout")
    try:
        wait = int(DEFAULTS["deploy_lock_timeout"] if wait is None else wait)
        if wait < 0:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"deploy_lock_timeout must be a whole number of seconds >= 0, not {wait!r}") from None
    return wait, interval, count


def lockable(host) -> bool:
    return transfer.is_ssh_host(host) or transfer.is_local_host(host)


def acquire_all(state=None, say=None, wait: bool = True) -> int:
    """Take the deploy lock on every connected host of the run, all at once; stop the run
    (LockError, nothing changed) naming every host whose lock another run kept. Returns how
    many locks are held. ``wait=False``: start every holder and return at once (the holders
    connect while the deploy file goes on loading); :func:`wait_all` waits for them."""
    if state is None:
        if not ctx_state.isset():
            return 0
        state = ctx_state.get()
    if say is None:
        say = logger.warning
    todo, errors, started = [], [], _started()
    for h in getattr(state, "inventory", []) or []:
        if not getattr(h, "connected", False) or h.name in started or not lockable(h):
            continue
        try:
            todo.append(Holder(h, *_settings(h)))
        except (ValueError, transfer.TransferError) as e:
            errors.append(f"{h.name}: {e}" if not str(e).startswith(f"{h.name}:") else str(e))
    if errors:
        raise LockError("\n".join(errors) + f" (set it in {GROUP_DATA} or the inventory)")
    if not todo:
        return wait_all() if wait else len(_held)
    _start_all(todo, say)
    return wait_all() if wait else len(_held)


def _started() -> set[str]:
    """The hosts whose holder this run started already (held, or not waited for yet)."""
    return {*_held, *(lk.host.name for pending, _ in _pending for lk in pending)}


def start_connecting(hosts, say=None) -> int:
    """Start the holders of ``hosts`` before pyinfra has connected to them (tritonfleet.pyinfra_ext.
    connecting: pyinfra's ``host_before_connect``), so that the locks are taken while pyinfra
    connects and the deploy file loads; :func:`wait_all` waits for them as for any others.
    Only the holders that need nothing of pyinfra's connection (their own OpenSSH client, or this
    machine's shell) and whose settings are valid: any other host is left to :func:`acquire_all`,
    which starts it, or names what is wrong, once pyinfra has connected. Returns how many started."""
    todo, started = [], _started()
    for h in hosts:
        if h.name in started or not lockable(h):
            continue
        try:
            if transfer.choose(h, "auto") == "connection":  # the holder runs on pyinfra's connection
                continue
            todo.append(Holder(h, *_settings(h)))
        except (ValueError, transfer.TransferError):
            continue  # acquire_all names it, after pyinfra connected
    if todo:
        _start_all(todo, say or logger.warning)
    return len(todo)


def forget(host) -> None:
    """End the holder started for ``host`` and not waited for yet: pyinfra could not connect to
    it, so the run leaves the host alone (and must not keep its lock, nor stop on it)."""
    for entry in list(_pending):
        for lk in [lk for lk in entry[0] if lk.host.name == host.name]:
            entry[0].remove(lk)
            lk.release()
        if not entry[0]:
            _pending.remove(entry)


def _start_all(todo: list[Holder], say) -> None:
    """Start ``todo``'s holders, then one heartbeat process for all of them; :func:`wait_all`
    waits for them."""
    _refused.clear()  # a new run's locks (a process runs one; tests run several)
    started = []
    try:
        for lk in todo:  # every holder process first (cheap), then one heartbeat process for all
            lk.start(beater=False)
            started.append(lk)
        fds = [lk.beat_fd for lk in started if lk.beat_fd is not None]
        if fds:
            for lk in started:
                lk.beat_fd = None
            _beaters.append(start_beater(fds, min(lk.interval for lk in started)))
    except BaseException:
        for lk in started:
            lk.release()
        raise
    if not _gates:
        _gates.append(threading.Lock())
    _pending.append((todo, say))


# Holders started and not waited for yet (acquire_all(wait=False)), and the run's refusal once a
# wait found a lock kept by another run: every later wait raises it again (every host stops).
_pending: list[tuple[list[Holder], Callable[[str], object]]] = []
_refused: list[LockError] = []
_gates: list = []  # made by the first acquire_all: threading.Lock as patched by then (gevent: a
# greenlet waiting for it lets the other hosts' greenlets run)


def wait_all() -> int:
    """Wait until every started holder has its lock; LockError (every lock of the run released)
    naming every host whose lock another run kept, raised again by every later call. Cheap once
    the locks are held: pyinfra's every command to a host calls it (gate_host_io)."""
    if not _pending and not _refused:
        return len(_held)
    with _gates[0]:  # the hosts' greenlets: the first waits for every holder, the others for it
        if _refused:
            raise _refused[0]
        while _pending:
            todo, say = _pending[0]
            with ThreadPoolExecutor(max_workers=min(32, len(todo))) as pool:
                results = list(pool.map(lambda lk, say=say: lk.acquire(say, started=True), todo))
            _pending.pop(0)
            failed = [why for why in results if why]
            for lk, why in zip(todo, results, strict=True):
                if not why:
                    _held[lk.host.name] = lk
            if failed:
                release_all()
                _refused.append(LockError("\n".join(failed)))
                raise _refused[0]
    return len(_held)


HOST_IO = ("run_shell_command", "put_file", "get_file", "rsync")  # pyinfra's Host: all a run sends a host


def gate_host_io() -> None:
    """Make pyinfra's way to a host (Host.run_shell_command, put_file, get_file, rsync: facts,
    operations and uploads all go through them) wait for :func:`wait_all` first: the locks started
    by ``acquire_all(wait=False)`` are held before the run's first command reaches any host, and a
    lock another run keeps stops the run there (SystemExit, as pre-flight's refusals do) with
    nothing sent. Once per process; a no-op call once the locks are held."""
    for name in HOST_IO:
        method = getattr(Host, name)
        if not getattr(method, "_tritonfleet_lock_gate", False):
            setattr(Host, name, _gated(method))


class LockLost(TritonfleetError, OSError):
    """A host's lock holder ended while the run went on: the host is no longer locked. An
    OSError, as a lost connection is: pyinfra fails that host at the command (and sends it
    nothing more) while the other hosts go on."""


def check_held(host) -> None:
    """LockLost when the holder of ``host``'s lock has ended (its SSH connection died, its
    heartbeats stopped) while the run still holds it as taken: another run may hold the lock by
    now, so this run must send nothing more."""
    lk = _held.get(getattr(host, "name", None))
    if lk is not None and not lk.ending and not lk.alive():
        raise LockLost(
            f"{host.name}: the deploy lock's holder on the host ended (its SSH connection or its "
            f"heartbeats stopped; the holder: {lk.last_words()}), so the host is no longer locked ({LOCK_FILE} on the host): the run "
            "failed the host before its next command there (the other hosts go on). What it did so far "
            "is on the host; check the link to the host (ssh_keepalive_interval, ssh_keepalive_count), "
            "then run again"
        )


def rebooting(host) -> None:
    """``host`` is about to reboot: the end of its holder is expected until :func:`reacquire`."""
    lk = _held.get(host.name)
    if lk is not None:
        lk.ending = True


def _gated(method):
    @functools.wraps(method)
    def gated(self, *args, **kwargs):
        if (_pending and getattr(self, "name", None) not in _reading) or _refused:
            wait_or_exit()
        if _held:
            check_held(self)
        return method(self, *args, **kwargs)

    gated._tritonfleet_lock_gate = True  # type: ignore[attr-defined]
    return gated


_reading: set[str] = set()  # hosts whose read before the lock (read_before_lock) is under way


def pending(host) -> bool:
    """Whether ``host``'s holder was started and has not taken its lock yet."""
    name = getattr(host, "name", None)
    return name not in _held and name in _started()


def read_before_lock(host, read: Callable[[], Seen | None]) -> bool | None:
    """Run ``read`` (read-only commands to ``host``, the first :func:`seen_command`; it returns
    what :func:`parse_seen` made of that) past the gate while ``host``'s holder is still taking the
    lock, then wait for every lock (:func:`wait_or_exit`). True: what ``read`` read stands (no run
    held the lock from that read until this run's holder took it, or this run's holder held it
    then); False: it does not (read it
    again); None: ``read`` did not run (no holder pending for the host, or the speed switch off):
    the locks are held, read as usual. Speed-only (``read_while_locking``): the same commands
    reach the host either way, only sooner."""
    if not pending(host) or not speed.on("read_while_locking"):
        wait_or_exit()
        return None
    _reading.add(host.name)
    try:
        seen = read()
    finally:
        _reading.discard(host.name)
    wait_or_exit()
    return stands(seen, _held.get(host.name))


def stands(seen: Seen | None, lk: Holder | None) -> bool:
    """Whether a read that began with ``seen`` (:func:`parse_seen`) stands, ``lk`` this run's
    holder of the host's lock, held: the lock was free then and ``lk`` found the same holder line
    (no run took it in between), or ``lk`` held it then (its own line in the file)."""
    if seen is None or lk is None:
        return False
    return seen.line == (lk.previous if seen.free else lk.holder)


def wait_or_exit() -> None:
    """:func:`wait_all`, a refusal ending the run as pre-flight's do (tritonfleet.core.exits)."""
    try:
        wait_all()
    except LockError as e:
        raise exit_for(e) from None


def reacquire(host, say=None) -> None:
    """Take the host's lock again on its new connection (after a reboot ended the holder).
    Raises RuntimeError naming the holder when another run took it in the meantime."""
    old = _held.pop(host.name, None)
    if old is None:
        return
    old.release()
    lk = Holder(host, old.wait, old.interval, old.count, old.holder)
    why = lk.acquire(say)
    if why:
        raise RuntimeError(why)
    _held[host.name] = lk


def release_all() -> None:
    # every holder is sent its SIGKILL first, then each is waited for: one at a time, a 500-host
    # run's exit waited for 500 processes to die in turn (10 s when each wait polled every 20 ms)
    started = [lk for todo, _ in _pending for lk in todo]  # a run that ended before it waited
    for lk in [*_held.values(), *started]:
        lk.end()
    for name in list(_held):
        _held.pop(name).release()
    while _pending:
        for lk in _pending.pop()[0]:
            lk.release()
    while _beaters:
        p = _beaters.pop()
        if p.poll() is None:
            p.kill()
            p.wait()


atexit.register(release_all)  # at once on a normal exit (else within one heartbeat interval)
