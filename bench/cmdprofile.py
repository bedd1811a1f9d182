"""Run the pyinfra CLI with every remote command counted and timed per host.

    python bench/cmdprofile.py [--out FILE.json] -- -y inventories/testbed.py deploys/triton.py

Prints (to stderr) one line per remote command (host, seconds, command) when --verbose, and a
summary; --out writes {host: [[seconds, command], ...]} as JSON, with the run's phases
(``phases``: seconds from TRITONFLEET_BENCH_T0, the launcher's clock when it started this
process: ``start`` pyinfra's CLI about to run (interpreter and imports), ``connect`` each SSH
handshake, ``commands`` each remote command, ``http`` each HTTP request to a host's Triton,
``lock`` when the deploy lock's holders were started (as pyinfra connects, from config.py, then
by the deploy file's install()) and each wait for them to hold their locks, ``main_done`` the CLI's end) and the HTTP connections opened (``http_connections``).
Measures only; changes nothing in pyinfra's behaviour.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

T0 = float(os.environ.get("TRITONFLEET_BENCH_T0") or time.time())


def _at() -> float:
    return round(time.time() - T0, 4)


class _LockTimer:
    """Times the deploy lock (tritonfleet.pyinfra_ext.hostlock) once the deploy file imports it:
    ``acquire_all``'s start (the holders started) and every ``wait_all`` that waited for holders,
    without importing anything of tritonfleet before the run does."""

    NAME = "tritonfleet.pyinfra_ext.hostlock"

    def __init__(self, phases: dict):
        self.phases = phases
        phases["lock"] = {"started": [], "waits": []}

    def find_spec(self, name, path=None, target=None):
        if name != self.NAME:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader, lock = spec.loader, self.phases["lock"]

        class Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                acquire_all, wait_all = module.acquire_all, module.wait_all
                start_connecting = module.start_connecting

                def timed_acquire(*args, **kwargs):
                    lock["started"].append(_at())
                    return acquire_all(*args, **kwargs)

                def timed_start_connecting(*args, **kwargs):  # a repository's config.py: as pyinfra connects
                    lock["started"].append(_at())
                    return start_connecting(*args, **kwargs)

                def timed_wait():
                    pending, start = bool(module._pending), _at()
                    try:
                        return wait_all()
                    finally:
                        if pending:
                            lock["waits"].append([start, _at()])

                module.acquire_all, module.wait_all = timed_acquire, timed_wait
                module.start_connecting = timed_start_connecting

        spec.loader = Loader()
        return spec


def main(argv: list[str]) -> int:
    out, verbose = None, False
    while argv and argv[0] != "--":
        opt = argv.pop(0)
        if opt == "--out":
            out = argv.pop(0)
        elif opt == "--verbose":
            verbose = True
        else:
            print(f"unknown option {opt}", file=sys.stderr)
            return 2
    if argv:
        argv.pop(0)
    import pyinfra_cli.main as cli  # patches gevent first, as the pyinfra command does
    from pyinfra.connectors.ssh import SSHConnector

    log: dict[str, list] = {}
    phases: dict = {"connect": [], "commands": [], "http": []}
    connections = [0]
    original = SSHConnector.run_shell_command
    import paramiko

    original_connect = paramiko.SSHClient.connect  # the handshake (pyinfra's connect wraps it)

    @functools.wraps(original_connect)  # its signature stays paramiko's (tritonfleet's compat reads it)
    def timed_connect(self, *args, **kwargs):
        start = _at()
        try:
            return original_connect(self, *args, **kwargs)
        finally:
            phases["connect"].append([start, _at()])

    @functools.wraps(original)
    def timed(self, command, *args, **kwargs):
        t0, start = time.perf_counter(), _at()
        try:
            return original(self, command, *args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            text = str(command.get_raw_value() if hasattr(command, "get_raw_value") else command)
            log.setdefault(self.host.name, []).append([round(dt, 4), text])
            phases["commands"].append([start, _at(), text[:80]])
            if verbose:
                print(f"[cmd] {self.host.name} {dt * 1000:7.1f} ms  {text[:150]}", file=sys.stderr)

    SSHConnector.run_shell_command = timed
    paramiko.SSHClient.connect = timed_connect
    import requests
    import urllib3.connectionpool

    original_request, original_new_conn = requests.Session.request, urllib3.connectionpool.HTTPConnectionPool._new_conn

    def timed_request(self, method, url, *args, **kwargs):
        start = _at()
        try:
            return original_request(self, method, url, *args, **kwargs)
        finally:
            phases["http"].append([start, _at(), f"{method} {url.split('/', 3)[-1]}"])

    def counted_new_conn(self, *args, **kwargs):
        connections[0] += 1
        return original_new_conn(self, *args, **kwargs)

    requests.Session.request = timed_request
    sys.meta_path.insert(0, _LockTimer(phases))
    urllib3.connectionpool.HTTPConnectionPool._new_conn = counted_new_conn
    phases["start"] = _at()
    sys.argv = ["pyinfra", *argv]
    t0 = time.perf_counter()
    try:
        rc = cli.main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    wall = time.perf_counter() - t0
    phases["main_done"] = _at()
    counts = {h: len(v) for h, v in log.items()}
    busy = {h: round(sum(c[0] for c in v), 2) for h, v in log.items()}
    print(f"[cmdprofile] wall {wall:.2f}s commands per host {counts} seconds in commands {busy}",
          file=sys.stderr)
    if out:
        with open(out, "w") as f:
            json.dump({"wall": wall, "rc": rc, "hosts": log, "phases": phases,
                       "http_connections": connections[0]}, f)
    return rc or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
