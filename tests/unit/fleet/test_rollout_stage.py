"""rollout --stage (tritonfleet.fleet.rollout.engine): every target staged before any batch, a
host that cannot stage left out before any host changes, more than --max-fail of them halting.
pyinfra, the probe and the gate are replaced."""

from __future__ import annotations

from pathlib import Path


def fake_rollout(monkeypatch, tmp_path, failed_stage: list[str], max_fail: int, through_workers: bool = False):
    """A rollout over three hosts with pyinfra, the probe and the gate replaced: which pyinfra
    runs it makes, and its report."""
    from types import SimpleNamespace

    from tritonfleet import ROOT
    from tritonfleet.fleet import probe
    from tritonfleet.fleet import rollout as ro
    from tritonfleet.fleet.rollout import engine
    from tritonfleet.inventory import roster

    names = ["a", "b", "c"]
    from tritonfleet.settings.defaults import DEFAULTS

    # the hosts' settings as the inventory gives them (the defaults), the rollout's state metrics not served
    settings = {**DEFAULTS, "fleet_parallel": 10, "fleet_workers": 1, "rollout_metrics_listen": None}
    hosts = [SimpleNamespace(name=n, get=lambda k, d=None: settings.get(k, d)) for n in names]
    monkeypatch.setenv("TRITONFLEET_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(roster, "load_inventory", lambda *a, **k: hosts)
    monkeypatch.setattr(probe, "probe", lambda h, **k: SimpleNamespace(
        reachable=True, release="r0", unit="u0", version="v0", error=""))
    monkeypatch.setattr(engine, "_gate_all", lambda run, names: {})
    monkeypatch.setattr(engine, "_versions", lambda hs, results: None)
    runs = []

    def run_pyinfra(inventory, deploy, targets, data, dry=False, **kw):
        runs.append((Path(deploy).name, list(targets), dry))
        if Path(deploy).name == "stage.py":
            ops = [{"name": "stage", "success": [t for t in targets if t not in failed_stage],
                    "error": [t for t in targets if t in failed_stage]}]
            return ro.PyinfraRun(1 if failed_stage else 0, {"results": {"failed_hosts": failed_stage,
                                                                         "operations": ops}}, "")
        return ro.PyinfraRun(0, {"results": {"failed_hosts": [], "operations": [
            {"name": "restart triton", "success": list(targets)}]}}, "")

    if not through_workers:  # every pyinfra run of a rollout goes through it
        monkeypatch.setattr(engine.workers, "run_pyinfra", run_pyinfra)
    report = ro.rollout("inventory.py", str(ROOT / "deploys" / "models.py"), canary=1, batch="100%",
                        max_fail=max_fail, stage=not through_workers, echo=lambda m: None)
    return runs, report


def test_a_host_that_cannot_stage_is_left_out_before_any_host_changes(monkeypatch, tmp_path):
    runs, report = fake_rollout(monkeypatch, tmp_path, ["b"], max_fail=1)
    assert runs[0] == ("models.py", ["a", "b", "c"], True)  # the plan
    assert runs[1] == ("stage.py", ["a", "b", "c"], False)  # every target staged before any batch
    assert [r[1] for r in runs[2:]] == [["a"], ["c"]]  # b never deployed
    by = {h.host: h for h in report.hosts}
    assert by["b"].result == "failed" and by["b"].detail.startswith("staging") and by["b"].batch is None
    assert by["a"].result == by["c"].result == "updated"
    assert report.staged["failed"] == ["b"] and not report.halted

    # one failure more than --max-fail: halted after staging, no batch ran
    runs, report = fake_rollout(monkeypatch, tmp_path, ["b"], max_fail=0)
    assert [r[0] for r in runs] == ["models.py", "stage.py"]
    assert "could not stage" in report.halted and "no host was changed" in report.halted




def test_hosts_of_a_pyinfra_run_that_raised_are_failed_not_unchanged(monkeypatch, tmp_path):
    """A batch whose pyinfra process could not run (ENOSPC writing its log) gives no result: its
    hosts are reported failed with the reason, never "unchanged" because the old release still
    passes the gate."""
    from tritonfleet.fleet.runner import pyinfra_run

    fake = {}

    def inner(inventory, deploy, hosts, data, dry=False, log_path=None, **kw):
        fake.setdefault("calls", []).append((Path(deploy).name, list(hosts), dry))
        if not dry and Path(deploy).name == "models.py":
            raise OSError(28, "No space left on device")
        return pyinfra_run.PyinfraRun(0, {"results": {"failed_hosts": [], "operations": [
            {"name": "x", "no_change": list(hosts)}]}}, "")

    monkeypatch.setattr(pyinfra_run, "run_pyinfra", inner)
    runs, report = fake_rollout(monkeypatch, tmp_path, [], max_fail=5, through_workers=True)
    by = {h.host: h for h in report.hosts}
    assert by["a"].result in ("failed", "rolled back", "rollback failed")
    assert "No space left on device" in by["a"].detail
    assert not any(h.result == "unchanged" for h in report.hosts)
    assert not report.ok
