"""A converged host's no-op as an operator's installation runs it (`bench/run.py noop-installed`;
docs/scale.md "A converged host's no-op, one host"). No test host: one fake host
(bench/fakefleet.py), and two virtualenvs run alternately against it:

* ``installed``: tritonfleet and its runtime dependencies alone, installed as README's
  "Install" says (``pip install --require-hashes --no-deps -r requirements-runtime.lock``, then the
  package itself), in ``bench/.work/installed-venv`` (made on the first run, about a minute);
* ``development``: this checkout's ``.venv``, which also holds the test and bench tools.

Why both: pyinfra's start-up runs gevent's ``patch_all``, which asks ``importlib.metadata`` for
plugin entry points 25 times, and each time every installed distribution is read; the
development virtualenv has about twice the distributions of an installation. The figure an
operator gets is the installed one.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def venv(root: Path, venv: Path, log) -> Path:
    """The installed virtualenv (made once; remade when the lock or the package changed)."""
    stamp = venv / "tritonfleet-installed.stamp"
    want = f"{(root / 'requirements-runtime.lock').stat().st_mtime_ns} {_tree_mtime(root / 'tritonfleet')}"
    if (venv / "bin" / "pyinfra").exists() and stamp.exists() and stamp.read_text() == want:
        return venv
    log(f"installing tritonfleet as an operator does into {venv} (runtime lock + the package)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-deps"]
    subprocess.run([*pip, "--require-hashes", "-r", str(root / "requirements-runtime.lock")], check=True)
    subprocess.run([*pip, str(root)], check=True, cwd=venv)
    stamp.write_text(want)
    return venv


def _tree_mtime(path: Path) -> int:
    return max((p.stat().st_mtime_ns for p in path.rglob("*.py")), default=0)


def _distributions(venv: Path) -> int:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(len(list(m.distributions())))"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def run(results, args, log) -> int:
    import scale
    from run import ROOT, WORK, Row

    venvs = {"installed": venv(ROOT, WORK / "installed-venv", log), "development": ROOT / ".venv"}
    dists = {name: _distributions(v) for name, v in venvs.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in venvs}
    fleet = scale.Fleet(1)
    try:
        for i in range(args.runs):
            for name, where in venvs.items():  # alternately, so that a change of load hits both
                cmd = [str(where / "bin" / "pyinfra"), "-y", "bench/fake_inventory.py", "deploys/triton.py"]
                r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                res = subprocess.run(cmd, cwd=ROOT, env=fleet.env, capture_output=True, text=True,
                                     stdin=subprocess.DEVNULL, timeout=300)
                wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
                if res.returncode != 0:
                    raise SystemExit(f"[bench] the {name} no-op failed (exit {res.returncode}): "
                                     f"{res.stdout[-1500:]}{res.stderr[-1500:]}")
                times[name].append((wall, cpu))
                log(f"  run {i + 1}, {name}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    finally:
        if fleet.stop() != 0:
            raise SystemExit("[bench] the fake host had no recorded answer for something: re-record "
                             "(python bench/fakefleet.py record)")
    results.meta["noop_installed"] = {"distributions": dists, "runs": times, "load": os.getloadavg()}
    for name in venvs:
        for what, k in (("wall", 0), ("CPU", 1)):
            row = Row(f"no-op, 1 converged fake host, {name} ({dists[name]} distributions): {what}",
                      target="(goal 0.8 s)" if what == "wall" else "")
            row.values = [t[k] for t in times[name]]
            if what == "wall":
                row.met = statistics.median(row.values) <= 0.8
            results.add(row)
    return 0


if __name__ == "__main__":
    sys.exit("run it as: .venv/bin/python bench/run.py noop-installed")
