"""A driver branch change as a rollout (tritonfleet.fleet.rollout.driver, engine): the CUDA
validation after each batch, a failing host back on its branch, validated again and held, no other
host touched; held hosts left out of a later rollout until released. pyinfra, the probe, the gate
and the hosts' shell are a model of hosts whose driver branch the deploy sets."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet import ROOT
from tritonfleet.fleet import probe
from tritonfleet.fleet import rollout as ro
from tritonfleet.fleet.rollout import driver, engine
from tritonfleet.gpu import cuda_check
from tritonfleet.host import driver_hold
from tritonfleet.inventory import roster
from tritonfleet.settings.defaults import DEFAULTS

PASSED = "GPU 0 (NVIDIA L4): vectorAdd of 50000 elements with 196 blocks of 256 threads: PASSED\nTest PASSED\n"
FAILED = ("GPU 0 (NVIDIA L4): vectorAdd of 50000 elements: FAILED: cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED (719)\n"
          "Test FAILED: GPU 0 (NVIDIA L4)\n")


class Fleet:
    """Hosts with a driver branch (set by a deploy's nvidia_driver_branch), a CUDA kernel that fails
    on the branches listed per host, and a hold file."""

    def __init__(self, names, branch="580", faults=None, holds=None):
        self.branch = dict.fromkeys(names, branch)
        self.faults = faults or {}
        self.holds = dict(holds or {})
        self.runs: list[tuple[str, list[str], dict, bool]] = []
        self.checked: list[tuple[str, str]] = []

    def run_pyinfra(self, inventory, deploy, targets, data, dry=False, **kw):
        self.runs.append((Path(deploy).name, list(targets), dict(data), dry))
        if not dry and data.get("nvidia_driver_branch") and Path(deploy).name != "rollback.py":
            for t in targets:
                self.branch[t] = str(data["nvidia_driver_branch"])
        return ro.PyinfraRun(0, {"results": {"failed_hosts": [], "operations": [
            {"name": "driver", "success": list(targets)}]}}, "")

    def shell(self, fh, command, timeout=60):
        if "--entrypoint python3" in command:
            self.checked.append((fh.name, self.branch[fh.name]))
            return True, FAILED if self.branch[fh.name] in self.faults.get(fh.name, ()) else PASSED
        if command.startswith("mkdir -p") and driver_hold.HOLD_FILE in command:
            text = command.split("printf '%s\\n' ", 1)[1].split(" > ", 1)[0].strip("'")
            self.holds[fh.name] = __import__("json").loads(text)
            return True, ""
        if command == driver_hold.RELEASE_COMMAND:
            self.holds.pop(fh.name, None)
            return True, ""
        raise AssertionError(f"unexpected command on {fh.name}: {command[:80]}")

    def probe(self, fh, **kw):
        return SimpleNamespace(reachable=True, release="r0", unit="u0", version="v0", error="",
                               driver=f"{self.branch[fh.name]}.82.07", toolkit="1.17.8-1",
                               driver_hold=self.holds.get(fh.name))


def rollout(monkeypatch, tmp_path, fleet: Fleet, wanted: str | None = "590", max_fail=0, **kw):
    data = {**DEFAULTS, "fleet_parallel": 10, "fleet_workers": 1, "rollout_metrics_listen": None,
            "nvidia_driver_branch": wanted}
    hosts = [SimpleNamespace(name=n, get=lambda k, d=None: data.get(k, d)) for n in fleet.branch]
    monkeypatch.setenv("TRITONFLEET_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(roster, "load_inventory", lambda *a, **k: hosts)
    monkeypatch.setattr(roster, "run", fleet.shell)
    monkeypatch.setattr(probe, "probe", fleet.probe)
    monkeypatch.setattr(engine, "_gate_all", lambda run, names: {})
    monkeypatch.setattr(engine, "_versions", lambda hs, results: None)
    monkeypatch.setattr(engine.workers, "run_pyinfra", fleet.run_pyinfra)
    extra = {"nvidia_driver_branch": wanted} if wanted else {}
    return ro.rollout("inventory.py", str(ROOT / "deploys" / "triton.py"), canary=1, batch="100%",
                      max_fail=max_fail, data=extra, echo=lambda m: None, **kw)


def test_a_canary_whose_cuda_kernel_fails_goes_back_holds_and_no_other_host_is_touched(monkeypatch, tmp_path):
    fleet = Fleet(["a", "b", "c"], faults={"a": {"590"}})
    report = rollout(monkeypatch, tmp_path, fleet)
    deploys = [(name, targets, data.get("nvidia_driver_branch")) for name, targets, data, dry in fleet.runs if not dry]
    assert deploys[0] == ("triton.py", ["a"], "590")  # the canary moved first
    assert deploys[1] == ("triton.py", ["a"], "580")  # then back to the branch it ran
    assert all(t == ["a"] for _, t, _ in deploys)  # b and c never deployed
    assert fleet.branch == {"a": "580", "b": "580", "c": "580"}
    assert fleet.checked == [("a", "590"), ("a", "580")]  # validated on the new branch, then on the old
    assert fleet.holds["a"]["branch"] == "580" and fleet.holds["a"]["tried"] == "590"
    assert "CUDA_ERROR_LAUNCH_FAILED" in fleet.holds["a"]["reason"]
    by = {h.host: h for h in report.hosts}
    assert by["a"].result == "rolled back" and "driver held at 580: 590 failed" in by["a"].detail
    assert by["b"].result == by["c"].result == "not touched" and report.halted
    steps = [v["passed"] for v in report.driver["hosts"]["a"]["validations"]]
    assert steps == [False, True]
    assert any("driver a: 580 -> 590; CUDA validation 590: FAILED, 580: passed" in ln
               for ln in ro.table(report).splitlines())


def test_a_passing_driver_change_moves_every_host_and_validates_each(monkeypatch, tmp_path):
    fleet = Fleet(["a", "b", "c"])
    report = rollout(monkeypatch, tmp_path, fleet)
    assert report.ok and fleet.branch == dict.fromkeys("abc", "590") and not fleet.holds
    assert sorted(fleet.checked) == [("a", "590"), ("b", "590"), ("c", "590")]


def test_a_rollout_that_does_not_move_the_driver_runs_no_cuda_validation(monkeypatch, tmp_path):
    fleet = Fleet(["a", "b"])
    report = rollout(monkeypatch, tmp_path, fleet, wanted="580")
    assert report.ok and fleet.checked == [] and not report.driver


def test_a_held_host_is_left_out_until_its_hold_is_released(monkeypatch, tmp_path):
    hold = {"branch": "580", "tried": "590", "reason": "cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED (719)"}
    fleet = Fleet(["a", "b"], holds={"a": hold})
    report = rollout(monkeypatch, tmp_path, fleet)
    by = {h.host: h for h in report.hosts}
    assert by["a"].result == "held" and "--release-holds" in by["a"].detail and fleet.branch["a"] == "580"
    assert fleet.branch["b"] == "590" and not report.ok  # the fleet is not where it was asked to be

    report = rollout(monkeypatch, tmp_path, fleet, release_holds=True)
    assert report.ok and fleet.branch["a"] == "590" and "a" not in fleet.holds


def test_a_rollout_to_the_held_branch_does_not_leave_the_host_out(monkeypatch, tmp_path):
    fleet = Fleet(["a"], holds={"a": {"branch": "580", "tried": "590"}})
    report = rollout(monkeypatch, tmp_path, fleet, wanted="580")
    assert report.ok and report.hosts[0].result in ("updated", "unchanged")


holds = st.one_of(st.none(), st.dictionaries(st.sampled_from(["branch", "tried", "reason", "time", "x"]),
                                             st.one_of(st.text(max_size=8), st.integers(), st.none()), max_size=5))


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_any_hold_file_text_parses_and_never_releases_a_host(text):
    """A hold file's text: nothing is no hold; anything else is a hold (an unreadable one too)."""
    hold = driver_hold.parse_hold(text.splitlines())
    if text.strip():
        assert isinstance(hold, dict)
        assert driver_hold.describe(hold).startswith("driver held")
    else:
        assert hold is None


@settings(max_examples=200, deadline=None)
@given(hold=holds, wanted=st.sampled_from([None, "570", "580", "590"]))
def test_held_out_leaves_out_exactly_the_hosts_it_would_move(hold, wanted):
    fh = SimpleNamespace(name="h", get=lambda k, d=None: wanted if k == "nvidia_driver_branch" else d)
    out = driver.held_out([fh], {"h": hold})
    if hold is None:
        assert out == {}
    elif not hold.get("branch"):
        assert "h" in out  # a hold that says no branch never lets the host go
    else:
        assert ("h" in out) == bool(wanted and wanted != str(hold["branch"]))


def test_the_check_runs_the_program_through_the_containers_python():
    cmd = cuda_check.command("nvcr.io/nvidia/tritonserver:24.08-py3")
    assert "docker run --rm -i --gpus all --network none --entrypoint python3 " in cmd
    assert cmd.endswith("nvcr.io/nvidia/tritonserver:24.08-py3 - 2>&1")
