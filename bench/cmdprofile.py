"""Run the pyinfra CLI with every remote command counted and timed per host.

    python bench/cmdprofile.py [--out FILE.json] -- -y inventories/testbed.py deploys/triton.py

Prints (to stderr) one line per remote command (host, seconds, command) when --verbose, and a
summary; --out writes {host: [[seconds, command], ...]} as JSON. Measures only; changes nothing
in pyinfra's behaviour.
"""

from __future__ import annotations

import json
import sys
import time


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
    original = SSHConnector.run_shell_command

    def timed(self, command, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(self, command, *args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            text = str(command.get_raw_value() if hasattr(command, "get_raw_value") else command)
            log.setdefault(self.host.name, []).append([round(dt, 4), text])
            if verbose:
                print(f"[cmd] {self.host.name} {dt * 1000:7.1f} ms  {text[:150]}", file=sys.stderr)

    SSHConnector.run_shell_command = timed
    sys.argv = ["pyinfra", *argv]
    t0 = time.perf_counter()
    try:
        rc = cli.main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    wall = time.perf_counter() - t0
    counts = {h: len(v) for h, v in log.items()}
    busy = {h: round(sum(c[0] for c in v), 2) for h, v in log.items()}
    print(f"[cmdprofile] wall {wall:.2f}s commands per host {counts} seconds in commands {busy}",
          file=sys.stderr)
    if out:
        with open(out, "w") as f:
            json.dump({"wall": wall, "rc": rc, "hosts": log}, f)
    return rc or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
