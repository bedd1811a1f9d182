"""The settings check's cost: loading an inventory of N hosts (the fleet commands' path, with and
without the check) and one host's check (a deploy's pre-flight path), with every tunable set.

    .venv/bin/python bench/settings_check.py [--hosts 10,100,500] [--runs 5]

Prints a table (median of --runs); no timing is asserted anywhere: this reports. The numbers are
in docs/tunables.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tritonfleet.gpu.rules import GPU_CLASSES  # noqa: E402
from tritonfleet.inventory import roster  # noqa: E402
from tritonfleet.settings import check  # noqa: E402
from tritonfleet.settings.defaults import DEFAULTS  # noqa: E402


def inventory(d: Path, n: int) -> Path:
    (d / "group_data").mkdir(parents=True, exist_ok=True)
    (d / "group_data" / "t4.py").write_text('gpu_class = "T4"\n')
    every = {k: v for k, v in DEFAULTS.items()}
    hosts = ", ".join(f'("h{i}", {{"ssh_hostname": "192.0.2.{i % 250 + 1}", **EVERY}})' for i in range(n))
    (d / "inv.py").write_text(f"EVERY = {every!r}\nt4 = [{hosts}]\n")
    return d / "inv.py"


def timed(fn, runs: int) -> float:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="10,100,500")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    from pyinfra_cli import util

    check.known_names()  # the first call loads pyinfra's connector entry points: once a process
    print("| hosts | load_inventory (the check included) | the check alone | per host |")
    print("|---|---|---|---|")
    for n in [int(x) for x in args.hosts.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            inv = inventory(Path(tmp), n)

            def load(inv=inv):
                util.PYTHON_CODES.clear()
                roster.load_inventory(inv)

            total = timed(load, args.runs)
            util.PYTHON_CODES.clear()
            hosts = roster.load_inventory(inv)
            pyinfra_hosts = [h.pyinfra_host for h in hosts]
            origins = check.ValueSources(pyinfra_hosts[0].inventory, str(inv), check.group_dirs(str(inv)))
            alone = timed(lambda hs=pyinfra_hosts, o=origins: check.check_hosts(hs, o, GPU_CLASSES), args.runs)
        print(f"| {n} | {total * 1000:.0f} ms | {alone * 1000:.1f} ms | {alone / n * 1000:.3f} ms |")
    data = {**DEFAULTS, "ssh_hostname": "a", "gpu_class": "T4"}
    one = timed(lambda: [check.problems("h", data, lambda k: "x", GPU_CLASSES) for _ in range(100)], args.runs) / 100
    print(f"\none host's check (every tunable set): {one * 1000:.3f} ms")


if __name__ == "__main__":
    main()
