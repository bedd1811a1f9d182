"""The whole test suite as five pytest runs side by side (``bash scripts/test``).

Most of the suite's time is spent waiting on test hosts (reboots, timeouts of the fault tests,
apt inside the hosts), not computing. So the testbed tests are split in three parts, each with a
testbed instance of its own (``TRITONFLEET_TESTBED`` = base, base + 1 and base + 2: own hosts,
bridge, subnet, NAT table), and the unit tier (pure, no server) and the integration tier (real
servers on loopback, no test hosts) run next to them as two parts: the unit part ends in minutes
and says so, and the integration part, which also mostly waits (on servers starting), overlaps
the testbed parts. Every test is in exactly one part (tests/integration/testbed_tooling/test_suite_parts.py checks that against pytest's own collection).

Each part's output goes to a log file and is printed whole when the part ends (no interleaved
lines); a line a minute says which parts still run. The exit status is the worst of the parts.
Every testbed instance is taken down at the end, also after Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The fault tests and the fleet operations (rollouts, the rebuild from bare) are about half the
# testbed tests' time (measured: 32 and 17 minutes of 90 on a loaded machine); the first part
# holds them, the second everything else but the third part's files (the data plane's
# tests/testbed/test_model_origin.py among them: one session host, and a few minutes).
FIRST_PART_FILES = ("tests/testbed/test_faults.py", "tests/testbed/test_fleet_ops.py")
# The third part: the run-time safety tests on real hosts (the deploy lock, the drain behind a
# real HAProxy, GPU health's quarantine, the traffic canary and capacity rules behind HAProxy and
# Prometheus), pull mode on two session hosts, and the operator-facing checks, each bringing up
# only what it needs, so that no part runs much past the others (the second part alone had grown
# to over 25 minutes; the third took 14.6), and the Debian 13 host from bare to serving (one host
# of its own, tb21: docs/driver-sources.md), and the image fan-out (three hosts, a few minutes), which
# had made the second part run 39 minutes.
THIRD_PART_FILES = ("tests/testbed/test_deploy_lock.py", "tests/testbed/test_drain.py",
                    "tests/testbed/test_operator_repository.py", "tests/testbed/test_wheel.py",
                    "tests/testbed/test_quarantine.py", "tests/testbed/test_canary.py",
                    "tests/testbed/test_pull.py", "tests/testbed/test_driver_rollout.py",
                    "tests/testbed/test_debian13.py", "tests/testbed/test_image_fanout.py")


@dataclass(frozen=True)
class Part:
    name: str
    args: tuple[str, ...]  # pytest arguments selecting the part's tests
    instance: int | None  # testbed instance, None: the part uses no test host


def parts(base: int) -> list[Part]:
    ignore = tuple(f"--ignore={f}" for f in FIRST_PART_FILES + THIRD_PART_FILES)
    return [
        Part("testbed-a", ("-m", "testbed", *FIRST_PART_FILES), base),
        Part("testbed-b", ("-m", "testbed", "tests", *ignore), base + 1),
        Part("testbed-c", ("-m", "testbed", *THIRD_PART_FILES), base + 2),
        Part("unit", ("-m", "not testbed and not integration", "tests"), None),
        Part("integration", ("-m", "integration", "tests"), None),
    ]


def base_instance() -> int:
    base = int(os.environ.get("TRITONFLEET_TESTBED", "0") or 0)
    if not 0 <= base <= 7:
        raise SystemExit(f"scripts/test: TRITONFLEET_TESTBED={base}: the suite uses three testbed instances, "
                         "base to base + 2, so the base must be 0-7")
    return base


def _down(instance: int) -> None:
    env = dict(os.environ, TRITONFLEET_TESTBED=str(instance))
    subprocess.run([sys.executable, "-m", "tritonfleet_testbed", "down"], cwd=ROOT, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def main(argv: list[str]) -> int:
    base = base_instance()
    logdir = ROOT / ".tritonfleet" / "test-logs"
    logdir.mkdir(parents=True, exist_ok=True)
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15", *argv]
    running: dict[str, tuple[subprocess.Popen, Path, float]] = {}
    results: dict[str, int] = {}
    t0 = time.monotonic()
    try:
        for part in parts(base):
            env = dict(os.environ)
            if part.instance is not None:
                env["TRITONFLEET_TESTBED"] = str(part.instance)
            log = logdir / f"{part.name}.log"
            with open(log, "w") as out:
                proc = subprocess.Popen([*pytest, *part.args], cwd=ROOT, env=env, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            running[part.name] = (proc, log, time.monotonic())
            where = f"testbed instance {part.instance}" if part.instance is not None else "no test hosts"
            print(f"[suite] {part.name}: pytest {' '.join(part.args)} ({where}), log {log}", flush=True)
        last_note = time.monotonic()
        while running:
            time.sleep(1)
            for name, (proc, log, started) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                results[name] = proc.returncode
                print(f"\n[suite] ===== {name}: exit {proc.returncode} after "
                      f"{(time.monotonic() - started) / 60:.1f} min =====", flush=True)
                sys.stdout.write(log.read_text(errors="replace"))
                sys.stdout.flush()
            if running and time.monotonic() - last_note >= 60:
                last_note = time.monotonic()
                print(f"[suite] {(time.monotonic() - t0) / 60:.0f} min: still running: {', '.join(running)}",
                      flush=True)
    except KeyboardInterrupt:
        for proc, _, _ in running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for proc, _, _ in running.values():
            proc.wait()
        results["interrupted"] = 130
    finally:
        for p in parts(base):
            if p.instance is not None:
                _down(p.instance)
    print(f"\n[suite] {(time.monotonic() - t0) / 60:.1f} min in all: "
          + ", ".join(f"{n} exit {rc}" for n, rc in results.items()), flush=True)
    # pytest's 5 (nothing collected) in one part is a failure of the split, not a pass
    return max((rc for rc in results.values()), default=1)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
