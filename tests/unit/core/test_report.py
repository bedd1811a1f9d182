"""Failure reports after pre-flight: the format, how a check fails a host (no traceback for an
expected failure, one with a "bug" line otherwise), the health gate's reading of the unit's
starts (generated journals, and the real tritonserver's own log of a model whose initialize
raises), the structured channel to the rollout, status, and the quiet relaxed host-key mode."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinfra.api import deploy

from tests.support.fakehost import run_fake
from tritonfleet.core import report as failure
from tritonfleet.core.report import Failure, HostFailure
from tritonfleet.fleet import probe
from tritonfleet.fleet.rollout import PyinfraRun
from tritonfleet.pyinfra_ext.check import check
from tritonfleet.serving import unit_watch

PREFIX = "E1203 18:08:02.107760 929 model_lifecycle.cc:642] "


def load_error(model: str, error: str) -> str:
    """A journal line as tritonserver 2.51 writes a model that failed to load (escaped newlines)."""
    msg = f"failed to load '{model}' version 1: Internal: RuntimeError: {error}\n\nAt:\n  /models/{model}/1/model.py(3): initialize\n"
    return PREFIX + json.dumps(msg)


NOISE = ['E1203 18:08:01.175422 929 server.cc:241] "CudaDriverHelper has not been initialized."',
         'I1203 18:08:01.179100 929 model_lifecycle.cc:472] "loading: m:1"',
         "Error: No such container: triton-server", ""]


def example_failure() -> Failure:
    return Failure("tb1-t4", "health gate", "Triton ready", "the same error twice",
                   ["E1203 x] failed to load 'm'", "At:", "  /models/m/1/model.py(3): initialize"],
                   "Triton's own words", "nothing is served", "pyinfra -y inv.py deploys/rollback.py --limit tb1-t4",
                   cause="failed to load 'm'")


def test_report_text_has_each_part_on_real_lines():
    text = example_failure().text()
    lines = text.splitlines()
    assert lines[0] == "tritonfleet: tb1-t4 failed at health gate"
    for part in ("expected: Triton ready", "found:    the same error twice", "Triton's own words:",
                 "    At:", "      /models/m/1/model.py(3): initialize", "the host now: nothing is served",
                 "to fix:   pyinfra -y inv.py deploys/rollback.py --limit tb1-t4"):
        assert any(part in ln for ln in lines), part
    assert "\\n" not in text and "Failure(" not in text
    # the table cell: the step and the cause, without the host name
    assert example_failure().short() == "health gate: failed to load 'm'"
    assert str(HostFailure(example_failure())) == text


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300), max_size=40))
def test_trim_keeps_real_lines_bounded(lines):
    out = failure.trim(lines, keep=10, width=80)
    assert len(out) <= 11
    assert all(len(ln) <= 80 or ln.startswith("... (") for ln in out)
    if out:
        assert out[0].strip() and out[-1].strip()


def test_trim_says_how_many_lines_it_left_out():
    assert failure.trim([f"l{i}" for i in range(20)], keep=3) == ["l0", "l1", "l2", "... (17 more lines)"]


# --- the gate's reading of the unit ----------------------------------------------------------

def journal(starts: list[tuple[str, list[str]]]) -> str:
    """journalctl -o json of the unit: each start's output lines (with _SYSTEMD_INVOCATION_ID), and
    systemd's own messages (with INVOCATION_ID), one of them non-UTF-8 (a list of bytes). Start i
    begins at second 100 + 10 i."""
    out = []
    for i, (inv, lines) in enumerate(starts):
        out.append({"MESSAGE": "Started triton.service - Triton Inference Server.", "INVOCATION_ID": inv,
                    "__REALTIME_TIMESTAMP": str((100 + 10 * i) * 1_000_000)})
        out += [{"MESSAGE": ln, "_SYSTEMD_INVOCATION_ID": inv} for ln in lines]
        out.append({"MESSAGE": list(b"triton.service: Main process exited, code=exited, status=1/FAILURE"),
                    "INVOCATION_ID": inv})
    return "\n".join(json.dumps(e) for e in out)


def watch_text(show: dict, starts, container="nvcr.io/nvidia/tritonserver:24.08-py3 exited 1",
               release="releases/abc", last=None) -> str:
    s = unit_watch.SECTION
    show_text = "\n".join(f"{k}={v}" for k, v in show.items())
    return (f"{show_text}\n{s}\n{journal(starts)}\n{s}\n{container}\n{s}\n{release}\n{s}\n"
            f"{json.dumps(last) if last else ''}\n")


CAUSES = ["", "boom", "weights missing"]
STATES = {"running": ("active", "running"), "auto-restart": ("activating", "auto-restart"),
          "failed": ("failed", "failed")}


@st.composite
def unit_histories(draw):
    causes = draw(st.lists(st.sampled_from(CAUSES), min_size=1, max_size=7))
    restarts = draw(st.integers(0, len(causes) - 1))
    state = draw(st.sampled_from(sorted(STATES)))
    noise = draw(st.lists(st.sampled_from(NOISE), max_size=3))
    return causes, restarts, state, noise


def snapshot_of(causes, restarts, state, noise):
    starts = [(f"inv{i}", [*noise, *([load_error("m", c)] if c else [])]) for i, c in enumerate(causes)]
    active, sub = STATES[state]
    show = {"ActiveState": active, "SubState": sub, "Result": "exit-code" if state != "running" else "success",
            "NRestarts": restarts, "InvocationID": f"inv{len(causes) - 1}"}
    return unit_watch.parse_watch(watch_text(show, starts))


@settings(max_examples=300, deadline=None)
@given(unit_histories())
def test_the_gate_stops_only_on_a_definitive_cause(history):
    causes, restarts, state, noise = history
    snap = snapshot_of(*history)
    assert [s.invocation for s in snap.starts] == [f"inv{i}" for i in range(len(causes))]
    verdict = unit_watch.assess(snap)
    window = causes[-(restarts + 1):]  # the starts since the last start by hand
    # a running start is over once a model failed to load in it (it cannot end well any more)
    ended = window if state != "running" or window[-1] else window[:-1]
    same_twice = len(ended) >= 2 and ended[-1] and ended[-1] == ended[-2]
    assert (verdict is not None) == (state == "failed" or bool(same_twice)), (history, verdict)
    if same_twice and state != "failed":
        assert "same error on two consecutive starts" in verdict.cause
        assert f"failed to load 'm' version 1: Internal: RuntimeError: {ended[-1]}" in verdict.cause
        assert verdict.words[1:3] == ["", "At:"] or verdict.words[1:2] == ["At:"]
    # starts before the last start by hand never count
    only_window = snapshot_of(window, restarts, state, noise)
    assert (unit_watch.assess(only_window) is None) == (verdict is None)


def test_a_slow_start_is_never_definitive():
    # one failed start, the next one still loading (no error yet): wait
    snap = snapshot_of(["boom", ""], 1, "running", NOISE)
    assert unit_watch.assess(snap) is None
    # two different errors in a row: no verdict either
    assert unit_watch.assess(snapshot_of(["boom", "weights missing"], 1, "auto-restart", [])) is None


def test_a_start_whose_tritonserver_is_exiting_counts_as_ended():
    exiting = [load_error("m", "boom"), "error: creating server: Internal - failed to load all models"]
    show = {"ActiveState": "active", "SubState": "running", "NRestarts": 1, "InvocationID": "b"}
    verdict = unit_watch.assess(unit_watch.parse_watch(watch_text(show, [("a", exiting), ("b", exiting)])))
    assert verdict is not None and "failed to load 'm'" in verdict.cause
    # a model that failed to load ends the start too (tritonserver only finishes the other loads)
    assert unit_watch.assess(unit_watch.parse_watch(watch_text(show, [("a", exiting), ("b", exiting[:1])]))) is not None
    # other E-level lines do not
    assert unit_watch.assess(unit_watch.parse_watch(watch_text(show, [("a", exiting), ("b", NOISE)]))) is None


def test_starts_before_the_gate_do_not_count():
    # an earlier run left a crash loop with this error; a restart by hand during systemd's wait
    # does not reset the restart counter (measured on systemd 252), so the window is also by time
    snap = snapshot_of(["boom", "boom", "boom", ""], 3, "running", [])
    assert unit_watch.assess(snap) is not None  # by the counter alone: the old starts count
    assert unit_watch.assess(snap, since=125 * 1_000_000) is None  # only the start at 130 s counts
    assert unit_watch.assess(snapshot_of(["boom", "boom", "boom", "boom"], 3, "auto-restart", []),
                         since=115 * 1_000_000) is not None  # 120 s and 130 s: the same error twice


def test_docker_causes_are_definitive_at_once():
    show = {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": 0, "InvocationID": "a"}
    for line, meaning in (
        ("docker: Error response from daemon: driver failed programming external connectivity on endpoint "
         "triton-server: Bind for 0.0.0.0:8000 failed: port is already allocated.", "already bound"),
        ("Unable to find image 'nvcr.io/nvidia/tritonserver:24.08-py3' locally", "image is not on the host"),
    ):
        verdict = unit_watch.assess(unit_watch.parse_watch(watch_text(show, [("a", [line])])))
        assert verdict is not None and meaning in verdict.cause and line[:40] in verdict.cause


def test_what_the_host_runs_now_and_the_rollback_command(monkeypatch):
    monkeypatch.setattr("sys.argv", ["pyinfra", "-y", "inventories/prod.py", "deploys/triton.py"])
    show = {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": 3, "InvocationID": "a"}
    last = {"time": "2026-12-03T06:16:40Z", "action": "deploy", "release": "old", "image": "tritonserver:24.08-py3"}
    snap = unit_watch.parse_watch(watch_text(show, [("a", [])], release="releases/new", last=last))
    now, fix = unit_watch.serving_now(snap, "triton", "tb1-t4")
    assert "triton.service is activating (auto-restart), systemd restarted it 3 times" in now and "nothing is served" in now
    assert "live model release new" in now and "last healthy deployment: release old" in now
    assert fix.endswith("pyinfra -y inventories/prod.py deploys/rollback.py --limit tb1-t4")
    assert "served before this deploy" in fix
    assert unit_watch.serving_now(snap, "triton", "tb1-t4", rollout=True)[1].startswith("the rollout rolls")


# --- how a check fails a host ----------------------------------------------------------------

def expected_failure():
    raise HostFailure(example_failure())


def a_bug():
    return {}["missing"]


@deploy("Test step")
def failing(function):
    check(name="check: something", function=function)


def test_an_expected_failure_prints_the_report_and_no_traceback(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    _, cmds, state = run_fake(failing, {}, yes=True, function=expected_failure)
    assert state.failed_hosts
    log = caplog.text
    assert "tritonfleet: tb1-t4 failed at health gate" in log and "expected: Triton ready" in log
    assert "Traceback" not in log and "Unexpected error" not in log and "HostFailure(" not in log
    # the report is left on the host for `tritonfleet status`
    assert any(failure.HOST_RECORD in c for c in cmds)


def test_a_bug_prints_its_traceback_and_says_it_is_one(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    _, _, state = run_fake(failing, {}, yes=True, function=a_bug)
    assert state.failed_hosts
    assert "Traceback" in caplog.text and "KeyError: 'missing'" in caplog.text
    assert "this is a bug in tritonfleet" in caplog.text and "Test step | check: something" in caplog.text


def test_the_channel_carries_the_report_to_the_rollout(tmp_path, monkeypatch):
    monkeypatch.setenv(failure.CHANNEL_ENV, str(tmp_path))
    failure.write_channel(example_failure())
    got = failure.read_channel(tmp_path)
    assert got["tb1-t4"].text() == example_failure().text()


def test_why_pyinfra_failed_a_host_comes_from_its_json_result():
    data = {"results": {"failed_hosts": ["tb1-t4", "tb3-t4"], "operations": [
        {"name": "Model repository | model release r1 (live: none)", "success": ["tb2-l4"], "error": ["tb1-t4"],
         "no_change": []}]}}
    log = "--> Starting operation: x | y\n    [tb1-t4] docker pull failed: no such host\nRuntimeError: tb1-t4: broke\n"
    run = PyinfraRun(1, data, log, "logs/batch-1.log")
    assert run.reason("tb1-t4") == ("Model repository | model release r1 (live: none): failed "
                                    "(pyinfra's output: logs/batch-1.log)")
    assert run.reached("tb2-l4") and not run.reached("tb3-t4")
    assert run.reason("tb3-t4").startswith("no operation ran on it")
    assert PyinfraRun(1, {}, log).reason("tb1-t4") == "pyinfra gave no result (exit status 1)"


@deploy("Test step")
def apt_step():
    from pyinfra.operations import server

    failure.report_operation_errors()
    server.shell(name="install nosuch", commands=["apt-get install -y nosuch"])


def test_a_failed_command_reaches_the_rollout_with_its_own_output(tmp_path, monkeypatch):
    monkeypatch.setenv(failure.CHANNEL_ENV, str(tmp_path))
    said = ["Reading package lists...", "E: Unable to locate package nosuch"]
    _, _, state = run_fake(apt_step, {"apt-get install -y nosuch": {"success": False, "stderr": said}}, yes=True)
    assert state.failed_hosts
    failure.write_unreported()  # at the end of a run (atexit)
    got = Failure.from_json(json.loads((tmp_path / "@fake" / "gpu1.json").read_text()))  # (the fake host's name)
    assert got.step == "Test step | install nosuch" and got.found == said[-1] and got.words == said
    assert got.short() == "Test step | install nosuch: E: Unable to locate package nosuch"


def test_a_step_s_own_report_is_not_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv(failure.CHANNEL_ENV, str(tmp_path))

    own = Failure("@fake/gpu1", "health gate", "Triton ready", "not ready", cause="not ready")

    def fails():
        raise HostFailure(own)

    @deploy("Test step")
    def reported_step():
        failure.report_operation_errors()
        check(name="check: something", function=fails)

    _, _, state = run_fake(reported_step, {}, yes=True)
    assert state.failed_hosts
    failure.write_unreported()
    got = Failure.from_json(json.loads((tmp_path / "@fake" / "gpu1.json").read_text()))
    assert got.text() == own.text()


def test_status_shows_a_failure_newer_than_the_last_healthy_deployment():
    report = json.dumps({**example_failure().to_json(), "time": "2026-12-03T10:00:00Z"})
    older = {"time": "2026-12-03T09:00:00Z", "action": "deploy"}
    newer = {"time": "2026-12-03T11:00:00Z", "action": "rollback"}
    shown = probe.current_failure([report], older)
    assert shown and shown["text"] == example_failure().text() and shown["short"] == example_failure().short()
    assert probe.current_failure([report], newer) is None
    assert probe.current_failure([report], None)
    # a record that cannot be read is not "no failure": status shows it as unknown (drift)
    with pytest.raises(ValueError, match="not a failure report"):
        probe.current_failure(["not json"], None)


@pytest.mark.parametrize("policy,shown", [("off", False), ("yes", True), ("accept-new", True)])
def test_relaxed_host_key_mode_is_quiet(caplog, policy, shown, tmp_path):
    from paramiko import SSHClient
    from paramiko.ssh_exception import SSHException
    from pyinfra.connectors.sshuserclient.client import get_missing_host_key_policy

    from tritonfleet.pyinfra_ext.connection import quiet_relaxed_host_keys

    quiet_relaxed_host_keys()  # what pyinfra_patches.install() and the fleet commands add
    caplog.set_level(logging.INFO, logger="pyinfra")
    client = SSHClient()
    client._host_keys_filename = str(tmp_path / "known_hosts")
    try:
        get_missing_host_key_policy(policy).missing_host_key(client, "10.77.6.11", _Key())
    except SSHException:
        pass
    assert ("10.77.6.11" in caplog.text) == shown


class _Key:
    def get_name(self):
        return "ssh-ed25519"

    def asbytes(self):
        return b"key"

    def get_base64(self):
        return "a2V5"


def test_a_failed_pull_reports_dockers_words_and_what_still_serves(caplog):
    from tritonfleet.steps.triton import triton_image

    caplog.set_level(logging.INFO, logger="pyinfra")
    said = 'Error response from daemon: Get "https://registry.invalid:5999/v2/": connect: connection refused'
    _, cmds, state = run_fake(triton_image, {"docker pull": {"success": False, "stderr": said}}, yes=True)
    assert state.failed_hosts
    log = caplog.text
    assert "failed at docker pull nvcr.io/nvidia/tritonserver:24.08-py3" in log and f"found:    {said}" in log
    assert "the running Triton container, its unit and the live model release are unchanged" in log
    assert "Traceback" not in log and any(failure.HOST_RECORD in c for c in cmds)


def test_a_failed_gpu_check_reports_expected_and_found(caplog):
    from tests.unit.steps.test_verify import DOCKER_ERR, QUERY_T4, SECTION, SUMMARY, answer
    from tritonfleet.steps.verify import verify_gpus

    caplog.set_level(logging.INFO, logger="pyinfra")
    _, _, state = run_fake(verify_gpus, {SECTION: answer(QUERY_T4, SUMMARY, DOCKER_ERR)}, yes=True, load_image=False)
    assert state.failed_hosts
    log = caplog.text
    assert "failed at GPU verification" in log and "expected: GPU class T4 (Tesla T4 or NVIDIA T4)" in log
    assert "(container): nvidia-smi failed" in log and "could not select device driver" in log
    assert "Triton was not changed by this run" in log and "Traceback" not in log


def fail_with_helper():
    failure.fail("docker-ce at docker_version (5:27.3.1-*)", "@fake/gpu1: docker-ce is 5:27.4.0-1", fix="set it")


def test_fail_names_the_running_step_and_drops_the_host_prefix(caplog):
    caplog.set_level(logging.INFO, logger="pyinfra")
    _, _, state = run_fake(failing, {}, yes=True, function=fail_with_helper)
    assert state.failed_hosts
    log = caplog.text
    assert "tritonfleet: @fake/gpu1 failed at Test step | check: something" in log
    assert "found:    docker-ce is 5:27.4.0-1" in log and "Traceback" not in log
