"""The wheel on its own: built from this checkout, installed into a fresh virtual environment in
an empty directory, `tritonfleet init` run there, and the new repository's inventory pointed at
the session's converged testbed hosts; from that repository a deploy, `tritonfleet status` and a
`tritonfleet rollout` run against them.

How the fresh environment gets its dependencies without a download: the wheel alone is installed
(pip install --no-deps), and a .pth line adds this environment's site-packages, where
requirements.lock's packages are installed, after the new environment's own. `.pth` files of that
directory are not processed, so this checkout's editable install is not reachable; the checkout
is on no import path; the test asserts that every tritonfleet module comes from the new
environment, so every template, data file, entry point and default the commands use comes from
the wheel. `pip check` in the new environment checks the wheel's own requirements against those
packages.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.testbed import changed_ops
from tests.support.wheel import build_wheel
from tests.unit.test_package import SKELETON_FILES
from tritonfleet import ROOT


def run(argv: list, cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of the fresh environment, its bin directory, the environment for commands)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)  # from a clean copy: no build/ left over from earlier builds
    venv = tmp / "venv"
    res = run([sys.executable, "-m", "venv", "--without-pip", venv], tmp, dict(os.environ))
    assert res.returncode == 0, res.stderr
    python = venv / "bin" / "python"
    res = run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
              tmp, dict(os.environ))
    assert res.returncode == 0, res.stderr[-3000:]
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp,
                  dict(os.environ)).stdout.strip()
    Path(purelib, "zz-locked-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # nothing of the checkout or its environment on PATH or in PYTHONPATH
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"
    return python, venv / "bin", env, tmp


def test_the_wheel_alone_serves_the_fleet_from_a_new_repository(deployed, installed):
    testbed, _, _ = deployed
    python, bindir, env, tmp = installed
    empty = tmp / "work"
    empty.mkdir()

    # the wheel's modules, not the checkout's; its requirements met
    res = run([python, "-c", (
        "import json, sys, tritonfleet.cli, tritonfleet.steps.host_prep, tritonfleet.steps.triton, "
        "tritonfleet.steps.verify, tritonfleet.steps.rollback, tritonfleet.preflight\n"
        "print(json.dumps(sorted({m.__file__ for n, m in sys.modules.items() if n.split('.')[0] == 'tritonfleet'})))")],
        empty, env)
    assert res.returncode == 0, res.stderr[-3000:]
    files = json.loads(res.stdout)
    venv = str(bindir.parent)
    assert files and all(f.startswith(venv + "/") for f in files), [f for f in files if not f.startswith(venv)]
    res = run([sys.executable, "-m", "pip", "--python", python, "check"], empty, env)
    assert res.returncode == 0, res.stdout + res.stderr

    # tritonfleet init: the operator's repository, its models valid
    res = run([bindir / "tritonfleet", "init", "fleet"], empty, env)
    assert res.returncode == 0 and f"{len(SKELETON_FILES)} file(s) written" in res.stdout, res.stdout + res.stderr
    repo = empty / "fleet"
    res = run([bindir / "tritonfleet", "validate"], repo, env)
    assert res.returncode == 0, res.stdout + res.stderr

    # its inventory pointed at the testbed's hosts, with the testbed inventory's data
    ns = runpy.run_path(str(ROOT / "inventories" / "testbed.py"))
    lines = ["# the local testbed's hosts with the testbed inventory's data"]
    for group in ("t4", "l4"):
        hosts = [(h.name, {"ssh_hostname": h.address, **ns["_test_data"]}) for h in ns["_state"].hosts
                 if h.gpu_class == group]
        lines.append(f"{group} = {hosts!r}")
    (repo / "inventories" / "testbed.py").write_text("\n".join(lines) + "\n")
    names = [h.name for h in ns["_state"].hosts]

    # a deploy of the converged hosts from the new repository: nothing to change
    res = run([python, "-m", "pyinfra", "-y", "--json", "inventories/testbed.py", "deploys/models.py"], repo, env)
    try:
        data = json.loads(res.stdout)
    except ValueError:
        data = {}
    assert res.returncode == 0 and data.get("results", {}).get("failed_hosts") == [], res.stderr[-4000:]
    assert changed_ops(data) == [], changed_ops(data)
    assert res.stderr.count("healthy in") == len(names), res.stderr[-3000:]

    # status: every host reachable, serving what this repository asks for (unit rendered from the
    # wheel's template, release from its model repository), no drift
    res = run([bindir / "tritonfleet", "status", "inventories/testbed.py", "--json"], repo, env)
    rows = {r["host"]: r for r in json.loads(res.stdout or "[]")}
    assert sorted(rows) == sorted(names), res.stdout + res.stderr[-3000:]
    assert {n: r["drift"] for n, r in rows.items()} == {n: [] for n in names}, res.stdout
    assert res.returncode == 0, res.stderr[-3000:]

    # a rollout from there, one host: planned, deployed, gated; nothing to change
    res = run([bindir / "tritonfleet", "rollout", "inventories/testbed.py", "deploys/models.py",
               "--limit", names[0], "--json"], repo, env)
    try:
        report = json.loads(res.stdout)
    except ValueError:
        report = {}
    assert res.returncode == 0 and report.get("ok") is True, res.stdout + res.stderr[-4000:]
    assert [(h["host"], h["result"]) for h in report["hosts"]] == [(names[0], "unchanged")], report
    assert (repo / ".tritonfleet" / "rollouts").is_dir()  # its journal and logs: in the repository
