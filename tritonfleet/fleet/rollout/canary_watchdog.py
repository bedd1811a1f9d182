"""A dead-man for a traffic canary's weights: a small detached process that puts HAProxy's weights
back when the rollout that changed them stops without doing it itself.

The rollout's own ``finally`` and signal handling restore the weights on Ctrl-C, SIGTERM and any
exception (tritonfleet.fleet.rollout.engine). What no code in the rollout can answer for (SIGKILL,
the OOM killer, the control machine's session ending, a process stopped or hung) is covered here:
when the rollout sets the canary's share it starts this watchdog in its own session (a signal to
the rollout's process group or terminal does not reach it) with the weights to restore and a
heartbeat file, which the rollout touches every few seconds. The watchdog restores the weights
through HAProxy's runtime API and exits when the rollout's process is gone, or when the heartbeat
is older than ``canary_watchdog_ttl``. A clean finish removes the heartbeat: the watchdog then
exits without touching anything.

``python -m tritonfleet.fleet.rollout.canary_watchdog SPEC``: SPEC is a JSON file (0600, in the rollout's
log directory) {"pid", "sockets", "backend", "original", "heartbeat", "ttl"}; what it did goes to
``watchdog.log`` beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ...core.procs import alive
from ...serving.drain import DrainError
from ...serving.haproxy_weights import Weights

POLL_SECONDS = 0.5


def _real(module: str, name: str):
    """The standard library's own ``module.name``, also where gevent patched it (the command line
    does): the heartbeat must beat while the rollout's main greenlet blocks in a call gevent
    cannot switch out of, or the watchdog would take the canary's share away from a live rollout."""
    try:
        from gevent.monkey import get_original
    except ImportError:
        return getattr(__import__(module), name)
    return get_original(module, name)


class Watchdog:
    """The rollout's side: the detached process and the heartbeat (an OS thread)."""

    def __init__(self, spec: Path, proc: subprocess.Popen, heartbeat: Path, ttl: float):
        self.spec, self.proc, self.heartbeat, self.ttl = spec, proc, heartbeat, ttl
        self._stopped = False
        _real("_thread", "start_new_thread")(self._run, ())

    def _run(self) -> None:
        sleep = _real("time", "sleep")
        every = max(0.2, min(5.0, self.ttl / 4))
        while True:
            sleep(every)
            if self._stopped:
                return
            try:
                os.utime(self.heartbeat)
            except OSError:
                pass  # a heartbeat that cannot be renewed ends in a restore: the safe side

    def stop(self) -> None:
        """The rollout put the weights back itself: the watchdog exits without acting."""
        self._stopped = True
        try:
            self.heartbeat.unlink()
        except FileNotFoundError:
            pass
        try:
            self.proc.wait(POLL_SECONDS * 4 + 1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(directory: Path, sockets: list[str], backend: str, original: dict[str, int], ttl: float) -> Watchdog:
    """Start the watchdog for the weights ``original`` of ``backend`` (the rollout's log directory
    ``directory`` holds its spec, heartbeat and log). OSError when it cannot start."""
    heartbeat = directory / "canary-watchdog.heartbeat"
    spec = directory / "canary-watchdog.json"
    heartbeat.touch()
    fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(
            {
                "pid": os.getpid(),
                "sockets": list(sockets),
                "backend": backend,
                "original": original,
                "heartbeat": str(heartbeat),
                "ttl": float(ttl),
            },
            f,
        )
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    with open(directory / "watchdog.log", "a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tritonfleet.fleet.rollout.canary_watchdog", str(spec)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    return Watchdog(spec, proc, heartbeat, ttl)


def watch(spec: dict, say=print, clock=time.time, sleep=time.sleep) -> str:
    """Wait until the heartbeat is removed (the rollout finished: "stopped"), or the rollout is
    gone or silent for the TTL: then restore the weights ("restored" / "restore failed")."""
    beat = Path(spec["heartbeat"])
    pid, ttl = int(spec["pid"]), float(spec["ttl"])
    while True:
        try:
            age = clock() - beat.stat().st_mtime
        except FileNotFoundError:
            return "stopped"
        if not alive(pid):
            why = f"the rollout (pid {pid}) is gone"
            break
        if age > ttl:
            why = f"the rollout (pid {pid}) has not renewed its heartbeat for {age:.0f}s (canary_watchdog_ttl {ttl:g})"
            break
        sleep(POLL_SECONDS)
    say(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} {why}: putting back the weights of backend {spec['backend']}: "
        f"{spec['original']}"
    )
    last = ""
    for _ in range(5):
        try:
            Weights(list(spec["sockets"]), spec["backend"]).restore({s: int(w) for s, w in spec["original"].items()})
            say("weights restored")
            beat.unlink(missing_ok=True)
            return "restored"
        except DrainError as e:
            last = str(e)
            sleep(1)
    say(f"could not put the weights back: {last}; set them by hand (`set weight <backend>/<server> <weight>`)")
    return "restore failed"


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    return 0 if watch(spec, say=lambda m: print(m, flush=True)) != "restore failed" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
