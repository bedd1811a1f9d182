"""Failure reports on the testbed: a plain deploy of a model whose ``initialize`` raises fails the
host as soon as Triton failed the same way twice (not after health_timeout), with one clean
report; `tritonfleet status` shows the same report; the rollback command it prints works. At the
same time, on another host, the same deploy with auto_rollback serves the previous deployment
again on the spot.

Leaves the fleet serving the default model repository, as the shared `deployed` fixture made it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from tests.support.testbed import (
    BROKEN_INIT_ERROR,
    add_model_failing_at_initialize,
    changed_ops,
    env,
    infer_resnet,
    lines_of,
    live_release,
    pyinfra,
    repository_copy,
    status_of,
)
from tritonfleet import ROOT

INV = "inventories/testbed.py"


def test_a_model_failing_at_initialize_plain_and_with_auto_rollback(deployed, tmp_path):
    """The same broken release to two hosts at once (independent runs): a plain deploy on the
    first, one with auto_rollback on the last."""
    testbed, _, _ = deployed
    plain, auto = testbed.hosts[0], testbed.hosts[-1]
    before = {plain.name: live_release(plain), auto.name: live_release(auto)}
    bad = add_model_failing_at_initialize(repository_copy(tmp_path / "bad"))

    def timed(*args):
        t0 = time.monotonic()
        res, _ = pyinfra("deploys/models.py", *args)
        return res, time.monotonic() - t0

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(timed, "--limit", plain.name, "--data", f"model_repository={bad}")
        second = pool.submit(timed, "--limit", auto.name, "--data", f"model_repository={bad}",
                             "--data", "auto_rollback=true")
        res_plain, took = first.result()
        res_auto, _ = second.result()
    fails_fast_with_a_clean_report(plain, before[plain.name], res_plain, took)
    auto_rollback_puts_the_previous_deployment_back(auto, before[auto.name], res_auto)


def fails_fast_with_a_clean_report(h, before: str, res, took: float) -> None:
    err = res.stderr
    assert res.returncode != 0 and f"[{h.name}] Error" in err, err[-3000:]
    report = err[err.index(f"tritonfleet: {h.name} failed at health gate"):]
    gate_s = int(re.search(r"found:    after (\d+)s, without waiting out health_timeout \(180s\)", report).group(1))
    print(f"\nplain deploy of a model failing at initialize: {h.name} failed after {gate_s}s of the gate "
          f"(whole run {took:.0f}s)")
    # the cause, detected from the unit: the same load error on two consecutive starts
    assert "stopped with the same error on two consecutive starts" in report
    assert f"failed to load 'broken_init' version 1: Internal: RuntimeError: {BROKEN_INIT_ERROR}" in report
    # Triton's own words on real lines, then what the host runs now and the command that rolls back
    lines = report.splitlines()
    assert any(ln.strip() == "At:" for ln in lines), report
    assert any(ln.strip().endswith("/broken_init/1/model.py(3): initialize") for ln in lines), report
    assert re.search(r"the host now: triton.service is \w+ \([\w-]+\), systemd restarted it \d+ times?", report), report
    assert "nothing is served" in report, report
    rollback = f"pyinfra -y {INV} deploys/rollback.py --limit {h.name}"
    assert f"the host served before this deploy; put that deployment back with: {rollback}" in report
    # no Python repr, no traceback, no "crash" wording for an expected failure
    for wrong in ("Traceback", "Unexpected error", "HealthError(", "\\n"):
        assert wrong not in err, wrong

    # status says the same, until a healthy deployment is recorded
    rc, row = status_of(h.name)
    assert rc == 1 and lines_of(row["last_failure"]["text"]) in lines_of(report), row
    assert any(d.startswith("last run failed") and "broken_init" in d for d in row["drift"]), row["drift"]

    # the printed command puts the previous deployment back
    back = subprocess.run(shlex.split(rollback), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
    assert back.returncode == 0, back.stderr[-3000:]
    assert live_release(h) == before and infer_resnet(h.address).shape == (1, 1000)
    rc, row = status_of(h.name)
    assert rc == 0 and row["last_failure"] is None, row


def auto_rollback_puts_the_previous_deployment_back(h, before: str, res) -> None:
    """auto_rollback: the host fails but serves its previous deployment again, on the spot."""
    err = res.stderr
    # the host still fails (the deploy did), but serves what it served before, and says so
    assert res.returncode != 0 and f"auto_rollback: back to release {before.rsplit('/', 1)[-1]}" in err, err[-3000:]
    assert "Starting nested operation: Rollback | restart triton on the earlier deployment" in err
    report = err[err.index(f"tritonfleet: {h.name} failed at health gate"):]
    assert "the host now: rolled back on the spot (auto_rollback): serves release" in report, report
    assert "failed to load 'broken_init'" in report and "Traceback" not in err
    assert live_release(h) == before and infer_resnet(h.address).shape == (1, 1000)
    rc, row = status_of(h.name)
    assert "rolled back on the spot" in row["last_failure"]["text"], row
    # the next healthy run clears the report as part of its gate: it changes nothing
    res2, data2 = pyinfra("deploys/models.py", "--limit", h.name)
    assert res2.returncode == 0 and changed_ops(data2) == [], res2.stderr[-3000:]
    rc, row = status_of(h.name)
    assert rc == 0 and row["last_failure"] is None, row
