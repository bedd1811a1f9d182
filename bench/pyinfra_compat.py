"""What the run-time check of pyinfra's internals costs (tritonfleet.pyinfra_ext.compat.check, run
by every deploy file's pyinfra_patches.install()).

    .venv/bin/python bench/pyinfra_compat.py [--runs N]

Imports what a deploy has imported by the time install() runs (pyinfra's CLI, API, the operations
the steps use, paramiko), then times check() N times: the usual case (every module file a checked
release's: hashed whole, no source read), and the slow path a changed release takes (no file
matches: every internal's source read and hashed). Prints the median and the worst, in ms, as JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def main(argv: list[str]) -> int:
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 50
    import paramiko  # noqa: F401
    import pyinfra.api  # noqa: F401
    import pyinfra.operations.apt  # noqa: F401
    import pyinfra.operations.files  # noqa: F401
    import pyinfra.operations.systemd  # noqa: F401
    import pyinfra_cli.main  # noqa: F401

    from tritonfleet.pyinfra_ext import compat

    record = compat.load_record()
    out = {}
    for case, rec in (("checked release", record), ("every file differs", {**record, "files": {}})):
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            res = compat.check(record=rec)
            times.append((time.perf_counter() - t0) * 1000)
            if res.mismatches:
                print(f"mismatches: {res.mismatches}", file=sys.stderr)
                return 1
        out[case] = {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1), "runs": runs}
    out["internals"] = len(compat.INTERNALS)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
