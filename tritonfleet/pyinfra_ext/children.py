"""The processes the deploy lock starts on the control machine (tritonfleet.pyinfra_ext.hostlock):
each host's holder, started with ``posix_spawn`` (:class:`Child`), and the one heartbeat process of a
run's holders (:func:`start_beater`). Why posix_spawn and one heartbeat process: docs/scale.md,
"Speed-only features"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from gevent.monkey import is_module_patched

from ..core import speed

# The heartbeat process: a newline to every holder's pipe every interval, for as long as the run's
# process lives (and PR_SET_PDEATHSIG ends it with that process). A holder that is gone (its pipe
# closed) is dropped; a holder that reads slowly is skipped, never waited for (non-blocking).
BEAT = """
import ctypes, os, signal, sys, time
run, interval, fds = int(sys.argv[1]), float(sys.argv[2]), [int(a) for a in sys.argv[3:]]
try:  # SIGKILL when the run's process ends (Linux PR_SET_PDEATHSIG; the loop checks it too)
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
except (OSError, AttributeError):
    pass
for fd in fds:
    os.set_blocking(fd, False)
while fds and os.getppid() == run:
    kept = []
    for fd in fds:
        try:
            os.write(fd, b"\\n")
        except BlockingIOError:
            pass
        except OSError:
            os.close(fd)
            continue
        kept.append(fd)
    fds = kept
    time.sleep(interval)
"""


class Child:
    """A child process started with ``posix_spawn`` (the C library starts it the vfork way: the
    cost does not grow with this process's size, unlike fork), its stdin ``stdin`` (a file
    descriptor), its stdout and stderr pipes to this process. The subset of subprocess.Popen the
    holder uses: poll, wait, kill, stdout, stderr. Speed-only (``posix_spawn``): with
    ``TRITONFLEET_SPEED=off`` it is a subprocess.Popen, the same process with the same pipes."""

    def __init__(self, argv: list[str], stdin: int | None, keep: tuple[int, ...] = ()):
        """``stdin`` None: a child that reads nothing and writes nothing of interest (stdin and
        stdout /dev/null, stderr this process's, as subprocess.Popen would leave it). ``keep``:
        file descriptors it inherits besides those (inheritable ones)."""
        self.stdout = self.stderr = None
        self._popen: subprocess.Popen | None = None
        self.returncode: int | None = None
        self._pidfd: int | None = None
        if not speed.on("posix_spawn"):  # the plain way: fork and exec
            self._popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL if stdin is None else stdin,
                stdout=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stderr=None if stdin is None else subprocess.PIPE,
                pass_fds=keep,
            )
            self.pid, self.stdout, self.stderr = self._popen.pid, self._popen.stdout, self._popen.stderr
            return
        if stdin is None:
            self.pid = os.posix_spawnp(
                argv[0],
                argv,
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                ],
            )
        else:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            actions = [
                (os.POSIX_SPAWN_DUP2, stdin, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ]
            try:
                self.pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions)
            except BaseException:
                os.close(out_r)
                os.close(err_r)
                raise
            finally:
                os.close(out_w)
                os.close(err_w)
            self.stdout, self.stderr = open(out_r, "rb"), open(err_r, "rb")  # noqa: SIM115 - closed in close()
        # a pidfd names this process, not whoever gets its pid once it is reaped (Linux >= 5.3)
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pass

    def poll(self) -> int | None:
        if self._popen is not None:
            self.returncode = self._popen.poll()
        elif self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else (gevent's child watcher): gone
                pid, status = self.pid, 255 << 8
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self._done()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._popen is not None:
            self.returncode = self._popen.wait(timeout)
            return self.returncode
        end = None if timeout is None else time.monotonic() + timeout
        pause = 0.001  # a killed process is gone within a millisecond or two: look again soon,
        while self.poll() is None:  # then less often (a run's exit waited 20 ms for each holder)
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(pause)  # gevent's sleep under its patching: the other hosts go on
            pause = min(pause * 2, 0.02)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is not None:
            return
        if self._popen is not None:
            self._popen.kill()
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _done(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def close(self) -> None:
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()


def cooperative(f):
    """``f`` (a pipe from a child) to read without stopping every other host's greenlet while
    this one waits, when the run is under gevent's patching; else ``f`` itself."""
    try:
        from gevent.fileobject import FileObjectPosix
    except ImportError:  # pragma: no cover
        return f
    return FileObjectPosix(f.fileno(), "rb", close=False) if is_module_patched("threading") else f


def available(f) -> bytes:
    """What a child's pipe ``f`` holds now, without waiting (a process the child started may keep
    the pipe open after the child itself ended)."""
    if f is None:
        return b""
    fd = f.fileno()
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 65536) or b""
    except OSError:  # BlockingIOError included: nothing there yet
        return b""


def start_beater(fds: list[int], interval: int) -> Child:
    """One process sending heartbeats down every pipe end in ``fds`` (closed here once it has
    them): one process for a whole run's holders, instead of one per host. Started with
    posix_spawn, as the holders are (subprocess.Popen forked the run's process and ran a
    preexec_fn before the deploy's steps could load: docs/scale.md); it ends with
    the run's process (PR_SET_PDEATHSIG, set by the process itself, and its parent checked)."""
    try:
        for fd in fds:
            os.set_inheritable(fd, True)  # closed here right after: only the beater keeps them
        return Child(
            [sys.executable, "-I", "-S", "-c", BEAT, str(os.getpid()), str(interval), *map(str, fds)],
            stdin=None,
            keep=tuple(fds),
        )
    finally:
        for fd in fds:
            os.close(fd)
