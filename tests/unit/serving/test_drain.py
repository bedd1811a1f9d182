"""The load-balancer drain (tritonfleet.serving.drain): the hooks against real commands, the
deploy's use of it with pyinfra's @fake connector (against a real HAProxy:
tests/integration/serving/test_drain.py)."""

from __future__ import annotations

import itertools
import re
import time

import pytest

from tests.support.fakehost import defaults, run_fake
from tritonfleet.serving import drain

METRICS = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="m",version="1"}} {done}
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="m",version="1"}} {pending}
"""


def test_hooks_run_with_the_hosts_name_and_address_and_wait_for_triton_to_go_quiet(tmp_path, monkeypatch):
    log = tmp_path / "hooks.log"
    answers = iter([(2, 10), (0, 12), (0, 12), (0, 12), (0, 12), (0, 12), (0, 12)])
    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    hooks = drain.Hooks(f'echo "out $TRITONFLEET_HOST $TRITONFLEET_ADDRESS $TRITONFLEET_HTTP_PORT" >> {log}',
                        f'echo "in $TRITONFLEET_HOST" >> {log}',
                        {"TRITONFLEET_HOST": "tb1-t4", "TRITONFLEET_ADDRESS": "10.0.0.2",
                         "TRITONFLEET_HTTP_PORT": "8000"},
                        lambda: METRICS.format(**dict(zip(("pending", "done"), next(answers), strict=True))))
    hooks.drain()
    seen = []
    now = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    while True:
        n = hooks.in_flight(clock=lambda: next(now))
        seen.append(n)
        if n == 0:
            break
    # queue not empty, then counters moving (12 just arrived), still for 1 s, still for 2 s: idle
    assert seen == [2, 1, 1, 0]
    hooks.ready()
    assert log.read_text().splitlines() == ["out tb1-t4 10.0.0.2 8000", "in tb1-t4"]
    del clock


def _raises(error: BaseException):
    def read():
        raise error
    return read


def test_hooks_never_read_metrics_they_cannot_read_as_nothing_in_flight():
    """The drain fails safe: metrics that cannot be read (the host not answering, curl's error, an
    answer that is not Triton's or not Prometheus's format) are "unknown", never 0; only a host
    whose Triton does not run has nothing in flight, and says so."""
    for error in (OSError("no route to host"), drain.DrainError("Triton's metrics at ... do not answer")):
        with pytest.raises(drain.InFlightUnknown, match=re.escape(str(error))):
            drain.Hooks("true", "true", {}, _raises(error)).in_flight()
    for text, why in (("<html>401 Authorization Required</html>", "not Triton's metrics"),
                      ("", "not Triton's metrics"),
                      ("nv_inference_request_success{model=\"m\"} one two\n", None)):
        with pytest.raises(drain.InFlightUnknown, match=why):
            drain.Hooks("true", "true", {}, lambda text=text: text).in_flight()
    down = drain.Hooks("true", "true", {}, _raises(drain.TritonNotRunning("no Triton runs (triton.service is "
                                                                           "inactive): no request can be in flight")))
    assert down.in_flight() == 0 and "triton.service is inactive" in down.note


def test_wait_idle_counts_an_unreadable_host_as_busy_until_the_timeout():
    said = []
    clock = iter(float(t) for t in range(100))
    hooks = drain.Hooks("true", "true", {}, _raises(drain.DrainError("curl: (7) Failed to connect")))
    with pytest.raises(drain.InFlightUnknown, match=r"could not be read for 5s \(lb_drain_timeout\): "
                                                     r"curl: \(7\) Failed to connect"):
        hooks.wait_idle(5, sleep=lambda s: None, clock=lambda: next(clock), say=said.append)
    assert len(said) == 1 and "counts as busy" in said[0]
    # unreadable for a while, then readable and quiet: the drain completes
    reads = itertools.chain([drain.DrainError("down")] * 3, itertools.repeat(METRICS.format(pending=0, done=5)))

    def read():
        a = next(reads)
        if isinstance(a, Exception):
            raise a
        return a
    clock = iter(float(t) for t in range(100))
    hooks = drain.Hooks("true", "true", {}, read)
    waited = hooks.wait_idle(60, sleep=lambda s: time.sleep(0.1), clock=lambda: next(clock))
    assert 0 < waited < 60


def test_the_metrics_command_says_which_triton_runs(tmp_path):
    """drain.metrics_command in a real shell (curl and systemctl stand-ins on PATH) and
    read_metrics on what it printed: an answer, a refused connection of a running unit (unknown:
    an error), of a stopped one (nothing in flight), and one Triton of two stopped."""
    import os
    import subprocess

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    # curl: answers for port 8002, refuses the others (curl's words and exit status 7)
    (bin_ / "curl").write_text(
        "#!/bin/sh\nfor a in \"$@\"; do url=$a; done\n"
        "case $url in *:8002/*) printf '%s\\n' '# TYPE nv_inference_request_success counter' "
        "'nv_inference_request_success{model=\"m\",version=\"1\"} 7' "
        "'nv_inference_pending_request_count{model=\"m\",version=\"1\"} 0';;\n"
        "*) echo \"curl: (7) Failed to connect to 127.0.0.1 port ${url##*:} after 0 ms: Couldn't connect to server\" >&2;"
        " exit 7;; esac\n")
    (bin_ / "systemctl").write_text("#!/bin/sh\ncase \"$2\" in triton.service) echo active;; *) echo inactive; exit 3;; esac\n")
    for f in bin_.iterdir():
        f.chmod(0o755)

    def run(instances):
        out = subprocess.run(["sh", "-c", drain.metrics_command(instances)], capture_output=True, text=True,
                             env={**os.environ, "PATH": f"{bin_}:/usr/bin:/bin"})
        return drain.read_metrics(out.stdout.splitlines() + out.stderr.splitlines())

    [text] = run([("triton", "http://127.0.0.1:8002/metrics")])
    assert drain.triton_busy(text) == (0.0, 7.0)
    with pytest.raises(drain.DrainError, match=r"metrics at http://127.0.0.1:9002/metrics do not answer "
                                               r"\(curl: \(7\) Failed to connect.*\) while triton.service is active"):
        run([("triton", "http://127.0.0.1:9002/metrics")])
    with pytest.raises(drain.TritonNotRunning, match="triton-gpu0.service is inactive"):
        run([("triton-gpu0", "http://127.0.0.1:9002/metrics")])
    texts = run([("triton-gpu0", "http://127.0.0.1:9002/metrics"), ("triton", "http://127.0.0.1:8002/metrics")])
    assert len(texts) == 1 and drain.triton_busy(texts) == (0.0, 7.0)
    with pytest.raises(drain.DrainError, match="printed nothing it knows"):
        drain.read_metrics(["bash: curl: command not found"])


def test_a_failing_hook_fails_with_its_words():
    hooks = drain.Hooks("echo 'consul says no' >&2; exit 3", "true", {}, lambda: "")
    with pytest.raises(drain.DrainError, match=r"lb_drain_command failed \(exit 3\).*consul says no"):
        hooks.drain()
    with pytest.raises(drain.DrainError, match="needs both"):
        drain.Hooks("true", None, {}, lambda: "")


def test_settings_pick_the_balancer():
    get = {"lb": None}
    assert drain.from_settings(get, "h", "10.0.0.2", str) is None
    data = {"lb": "haproxy", "lb_haproxy_sockets": "/run/haproxy/admin.sock", "lb_haproxy_backend": "triton",
            "lb_haproxy_server": None}
    ha = drain.from_settings(data, "tb1-t4", "10.0.0.2", str)
    assert isinstance(ha, drain.HAProxy) and ha.describe() == "haproxy triton/tb1-t4"
    with pytest.raises(drain.DrainError, match="lb must be one of haproxy, hooks"):
        drain.from_settings({"lb": "f5"}, "h", "a", str)


# ------------------------------------------------------------------ in the deploy (@fake hosts)

def _service_responses(running: bool) -> dict:
    import hashlib

    from tritonfleet.serving.unit import render_unit, unit_context

    data = defaults("t4")
    unit_sha = hashlib.sha256(render_unit(unit_context(data)).encode()).hexdigest()
    return {
        "docker inspect --format '{{.State.Running}}": ["running=true", "image=sha256:" + "a" * 64, "started=1000.5",
                                                        "/etc/systemd/system/triton.service=900.0",
                                                        "/opt/triton/model_repository=950.0"] if running else [],
        "docker image inspect": "sha256:" + "a" * 64,
        re.compile(r"\[ -f /etc/systemd/system/triton.service \] && stat"): ["mode=644 user=root group=root", unit_sha],
        re.compile(r"\[ -f /etc/tritonfleet/triton-api-key \] && stat"): ["mode=600 user=root group=root", "0" * 64],
        "systemctl show": ["ActiveState=active", "UnitFileState=enabled"],
        "curl -sSf -m 5": [f"{drain.METRICS_MARK} triton http://127.0.0.1:8002/metrics",
                           *METRICS.format(pending=0, done=7).splitlines()],
    }


def test_a_restart_is_preceded_by_the_drain_and_a_converged_host_drains_nothing(tmp_path):
    from tritonfleet.steps.triton import triton_service

    log = tmp_path / "hooks.log"
    hooks = {"lb": "hooks", "lb_drain_command": f"echo drain $TRITONFLEET_HOST >> {log}",
             "lb_ready_command": f"echo ready >> {log}"}
    # converged: no restart, so no drain planned or run
    _, _, state = run_fake(triton_service, _service_responses(True), hooks)
    names = [n for meta in state.op_meta.values() for n in meta.names]
    assert not any("drain" in n for n in names) and not log.exists()
    # the unit changes (another stop timeout): drain, then the restart
    _, cmds, state = run_fake(triton_service, _service_responses(True), {**hooks, "triton_stop_timeout": 40})
    assert not state.failed_hosts
    order = [n for op in state.get_op_order() for n in state.op_meta[op].names]
    drain_at = next(i for i, n in enumerate(order) if "drain @fake/gpu1 in the load balancer" in n)
    restart_at = next(i for i, n in enumerate(order) if "restart triton" in n)
    assert drain_at == restart_at - 1, order
    assert log.read_text().splitlines() == ["drain @fake/gpu1"]
    assert any("curl -sSf -m 5 http://127.0.0.1:8002/metrics" in str(c) for c in cmds)


def test_a_drain_that_fails_stops_the_host_before_triton_is_touched(tmp_path):
    from tritonfleet.steps.triton import triton_service

    _, cmds, state = run_fake(triton_service, _service_responses(True),
                              {"lb": "hooks", "lb_drain_command": "echo no LB >&2; exit 1",
                               "lb_ready_command": "true", "triton_stop_timeout": 40})
    assert state.failed_hosts
    assert not any("systemctl restart triton" in str(c) for c in cmds)


def test_a_drain_that_does_not_go_idle_puts_the_host_back_untouched(tmp_path, monkeypatch):
    """Hooks: the drain ran, the host never went idle within lb_drain_timeout: the ready command
    runs (Triton is not restarted, the host goes back in), and the host fails."""
    from tritonfleet.steps.triton import triton_service

    log = tmp_path / "hooks.log"
    monkeypatch.setattr(drain.Hooks, "in_flight", lambda self, clock=None: 3)
    _, cmds, state = run_fake(triton_service, _service_responses(True),
                              {"lb": "hooks", "lb_drain_command": f"echo drain >> {log}",
                               "lb_ready_command": f"echo ready >> {log}", "lb_drain_timeout": 0.5,
                               "triton_stop_timeout": 40})
    assert state.failed_hosts
    assert log.read_text().splitlines() == ["drain", "ready"]
    assert not any("systemctl restart triton" in str(c) for c in cmds)


def test_a_drain_whose_metrics_cannot_be_read_restarts_nothing_and_says_why(tmp_path, caplog):
    """Hooks, Triton's metrics refused while its unit is active: the host counts as busy until
    lb_drain_timeout, then the drain fails naming why; the ready command puts it back and Triton
    is not restarted."""
    import logging

    from tritonfleet.steps.triton import triton_service

    caplog.set_level(logging.INFO, logger="pyinfra")
    log = tmp_path / "hooks.log"
    responses = {**_service_responses(True),
                 "curl -sSf -m 5": [f"{drain.METRICS_MARK} triton http://127.0.0.1:8002/metrics",
                                    "curl: (7) Failed to connect to 127.0.0.1 port 8002 after 0 ms: Couldn't connect "
                                    "to server", f"{drain.METRICS_MARK}-failed 7 active"]}
    _, cmds, state = run_fake(triton_service, responses,
                              {"lb": "hooks", "lb_drain_command": f"echo drain >> {log}",
                               "lb_ready_command": f"echo ready >> {log}", "lb_drain_timeout": 0.6,
                               "triton_stop_timeout": 40})
    assert state.failed_hosts
    assert log.read_text().splitlines() == ["drain", "ready"]
    assert not any("systemctl restart triton" in str(c) for c in cmds)
    text = caplog.text
    assert "the requests in flight cannot be read" in text and "counts as busy" in text
    assert "could not be read for 1s (lb_drain_timeout)" in text and "while triton.service is active" in text
    assert "Triton was not restarted" in text and "curl -sf http://127.0.0.1:8002/metrics" in text


# ------------------------------------------------------------------ who took a server out

def _restart_and_ready():
    """triton_service (a restart when the unit changes: the drain before it), then what the health
    gate step does once the gate passed (tritonfleet.steps.triton.health_gate)."""
    from pyinfra.api import deploy

    from tritonfleet.pyinfra_ext.check import check
    from tritonfleet.serving.ops import lb as lb_ops
    from tritonfleet.steps.triton import triton_service

    @deploy("restart and ready")
    def run():
        triton_service()
        check(name="check: back in the load balancer once healthy", function=lb_ops.ready_now)

    return run


def _marker_commands(cmds) -> list[str]:
    from tritonfleet.serving.ops.lb import MARKER

    return [str(c) for c in cmds if MARKER in str(c)]


def test_hooks_ready_only_after_a_deploys_drain(tmp_path):
    """Hooks have no state to read: a healthy run that did not drain runs lb_ready_command only
    over a cut run's marker (a host the receiver took out with lb_drain_command stays out)."""
    from tritonfleet.serving.ops.lb import MARKER

    log = tmp_path / "hooks.log"
    hooks = {"lb": "hooks", "lb_drain_command": f"echo drain >> {log}", "lb_ready_command": f"echo ready >> {log}"}
    run_fake(_restart_and_ready(), _service_responses(True), hooks)
    assert not log.exists()
    run_fake(_restart_and_ready(), {**_service_responses(True), f"cat {MARKER}": "run-1 root@ctl"}, hooks)
    assert log.read_text().splitlines() == ["ready"]
    log.unlink()
    run_fake(_restart_and_ready(), _service_responses(True), {**hooks, "triton_stop_timeout": 40})
    assert log.read_text().splitlines() == ["drain", "ready"]


