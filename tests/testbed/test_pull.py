"""Pull mode on test hosts: a bare host given only its bootstrap script reaches serving with no
command from the control machine; a release published for a wave reaches that wave and no other
host; a host whose run fails is reported, rolled back, and the rollout halts before the next wave.

The origin is a directory here served by a real nginx on the testbed bridge's address (the test
hosts' gateway), PUT allowed for reports/. One extra host (tb4-l4) comes up bare for the module
and is destroyed at its end; tb1-t4, converged by the session, joins pull mode through its own
bootstrap script (its first run changes nothing) and leaves it again at the end (timer, agent,
configuration and state removed; it serves what the session deployed).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.support.testbed import TRITONFLEET, env, ssh
from tritonfleet import ROOT
from tritonfleet.fleet import pull

BARE, OTHER = "tb4-l4", "tb1-t4"
POLL = 3  # seconds between a host's looks at its pointer (pull_poll_interval)
DATA = ("--data", f"pull_poll_interval={POLL}")
INVENTORY = "inventories/testbed.py"
LEAVE_PULL_MODE = (
    "systemctl disable --now tritonfleet-converge.timer >/dev/null 2>&1; systemctl stop tritonfleet-converge.service; "
    "rm -f /etc/systemd/system/tritonfleet-converge.service /etc/systemd/system/tritonfleet-converge.timer; "
    "systemctl daemon-reload; rm -rf /opt/tritonfleet /etc/tritonfleet/pull.json /etc/tritonfleet/release-signers "
    "/var/lib/tritonfleet/pull /var/lib/tritonfleet/bootstrap.sh /var/lib/prometheus/node-exporter/tritonfleet_pull.prom; "
    "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q python3-venv 'python3.*-venv' python3-pip-whl "
    "python3-setuptools-whl >/dev/null 2>&1; true")


def tf(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([TRITONFLEET, *args], cwd=ROOT, capture_output=True, text=True, env=env(), timeout=timeout)


class PullFleet:
    def __init__(self, origin: pull.Origin, url: str, key: Path, hosts: dict, boot: Path):
        self.origin, self.url, self.key, self.hosts, self.boot = origin, url, key, hosts, boot
        self.reports = pull.Reports(origin)

    def publish(self, *limit: str, extra: tuple[str, ...] = ()) -> str:
        res = tf("pull", "publish", INVENTORY, "deploys/triton.py", "--origin", str(self.origin.root),
                 "--sign-key", str(self.key), *[a for h in limit for a in ("--limit", h)], *DATA, *extra)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout.strip().splitlines()[-1]

    def report(self, host: str) -> dict:
        return self.reports.read(host) or {}

    def wait(self, host: str, release: str, after_generation: int = 0, timeout: float = 600) -> dict:
        """The host's report once it ran ``release`` (a generation above ``after_generation``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rep = self.report(host)
            if rep.get("release") == release and int(rep.get("generation") or 0) > after_generation and \
                    rep.get("result") in pull.RESULTS:
                return rep
            time.sleep(1)
        log = ssh(self.hosts[host], "tail -n 40 /var/lib/tritonfleet/pull/logs/*.log 2>/dev/null; "
                  "journalctl -u tritonfleet-converge -n 30 --no-pager 2>/dev/null", check=False)
        raise AssertionError(f"{host}: no report of {release[:12]} within {timeout:.0f} s; last {self.report(host)}\n{log}")


@pytest.fixture(scope="module")
def pull_fleet(deployed, tmp_path_factory):
    from tritonfleet_testbed import hosts
    from tritonfleet_testbed.cli import bring_up
    from tritonfleet_testbed.origin_server import OriginServer, agent_wheelhouse, build_wheel

    tmp = tmp_path_factory.mktemp("pull")
    (tmp / "origin").mkdir()
    key = tmp / "release-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "releases", "-f", str(key)], check=True)
    wheels = agent_wheelhouse()
    wheel = build_wheel(tmp / "dist")
    state = bring_up(4)  # tb1..tb3 as the session left them, tb4 bare
    srv = OriginServer(tmp / "origin", tmp / "nginx", addr=hosts.GATEWAY)
    by_name = {h.name: h for h in state.hosts}
    try:
        origin = pull.Origin(tmp / "origin", srv.url)
        fleet = PullFleet(origin, srv.url, key, by_name, tmp / "boot")
        res = tf("bootstrap", INVENTORY, "--origin", str(origin.root), "--url", srv.url, "--out", str(fleet.boot),
                 "--wheel", str(wheel), "--wheelhouse", str(wheels), "--sign-key", str(key), "--limit", BARE, "--limit", OTHER, *DATA)
        assert res.returncode == 0, res.stderr[-3000:]
        yield fleet
    finally:
        srv.stop()
        ssh(by_name[OTHER], LEAVE_PULL_MODE, check=False)
        hosts.destroy_host(BARE)


def test_a_bare_host_reaches_serving_from_its_bootstrap_script_alone(pull_fleet):
    """The hosts are given their script (as cloud-init's runcmd would run it) and nothing else:
    tb4 goes from bare to serving by itself, tb1 (converged already) joins with a no-op run."""
    release = pull_fleet.publish(BARE, OTHER)
    out: dict[str, subprocess.CompletedProcess] = {}

    def give(name: str) -> None:
        script = (pull_fleet.boot / name / "bootstrap.sh").read_text()
        out[name] = ssh_input(pull_fleet.hosts[name], "sh -s", script)

    threads = [threading.Thread(target=give, args=(n,)) for n in (BARE, OTHER)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for name, res in out.items():
        assert res.returncode == 0, f"{name}: {res.stdout[-2000:]}{res.stderr[-3000:]}"
    bare = pull_fleet.wait(BARE, release, timeout=900)
    assert bare["result"] == "ok", bare
    other = pull_fleet.wait(OTHER, release)
    assert other["result"] == "ok" and other["changed"] == 0, other  # converged already: nothing to do
    h = pull_fleet.hosts[BARE]
    # serving: every model ready, as the inventory asks (status over SSH, read-only)
    res = tf("status", INVENTORY, "--json", "--limit", BARE)
    (row,) = json.loads(res.stdout)
    assert row["reachable"] and row["drift"] == [] and row["unit_state"] == "active", row
    assert sorted(row["models_ready"]) == ["resnet50_onnx", "text_classifier_onnx"]
    assert requests.get(f"http://{h.address}:8000/v2/health/ready", timeout=10).status_code == 200
    # the state where Prometheus and the host's own command read it
    assert ssh(h, "systemctl is-active tritonfleet-converge.timer").strip() == "active"
    prom = ssh(h, "cat /var/lib/prometheus/node-exporter/tritonfleet_pull.prom")
    assert "tritonfleet_pull_last_run_success 1" in prom and f'release="{release[:12]}"' in prom
    state = json.loads(ssh(h, "/opt/tritonfleet/agent/bin/tritonfleet converge --state"))
    assert (state["release"], state["result"]) == (release, "ok")


def test_a_release_published_for_a_wave_reaches_exactly_that_wave(pull_fleet):
    before = {n: pull_fleet.report(n) for n in (BARE, OTHER)}
    assert all(r.get("result") == "ok" for r in before.values()), before
    new = pull_fleet.publish(BARE, extra=("--data", "pull_report_timeout=901"))  # another release, same serving
    assert new != before[BARE]["release"]
    rep = pull_fleet.wait(BARE, new, after_generation=int(before[BARE]["generation"]), timeout=300)
    assert rep["result"] == "ok", rep
    time.sleep(3 * POLL)  # tb1 looked at its pointer meanwhile
    assert pull_fleet.report(OTHER) == before[OTHER]
    state = json.loads(ssh(pull_fleet.hosts[OTHER], "/opt/tritonfleet/agent/bin/tritonfleet converge --state"))
    assert state["release"] == before[OTHER]["release"] and state["checked_ts"] > state["finished_ts"]
    res = tf("status", INVENTORY, "--pull", str(pull_fleet.origin.root), "--json", "--limit", BARE, "--limit", OTHER)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {r["host"]: r for r in json.loads(res.stdout)}
    assert rows[BARE]["release"] == new and rows[OTHER]["release"] == before[OTHER]["release"]


def test_a_failing_host_is_reported_and_its_wave_halts(pull_fleet):
    """The canary's run fails (pre-flight refuses the release's driver branch): the rollout says
    why, points the canary back at what it ran, and never publishes the next wave."""
    was = {n: pull_fleet.report(n) for n in (BARE, OTHER)}
    bare_pointer = pull.read_pointer(pull_fleet.origin.pointer(BARE))
    res = tf("pull", "rollout", INVENTORY, "deploys/triton.py", "--origin", str(pull_fleet.origin.root),
             "--sign-key", str(pull_fleet.key), "--limit", OTHER, "--limit", BARE, "--canary", "1", "--batch", "1",
             "--timeout", "300", "--json", *DATA, "--data", "nvidia_driver_branch=999")
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(res.stdout)
    rows = {r["host"]: r for r in report["hosts"]}
    assert report["batches"] == [[OTHER], [BARE]]
    assert "more than --max-fail 0" in report["halted"] and "1 host(s) not touched" in report["halted"]
    assert rows[OTHER]["result"] == "rolled back", rows[OTHER]
    assert "999" in rows[OTHER]["detail"], rows[OTHER]  # the host's own words: the branch it refused
    assert rows[BARE]["result"] == "not touched"
    # the canary ran the failing release, reported it, and ran what it ran before again
    after = pull_fleet.report(OTHER)
    assert after["release"] == was[OTHER]["release"] and after["result"] == "ok"
    assert int(after["generation"]) > int(was[OTHER]["generation"])
    # the next wave was never published: tb4's pointer and report are as they were
    assert pull.read_pointer(pull_fleet.origin.pointer(BARE)) == bare_pointer
    assert pull_fleet.report(BARE) == was[BARE]


def ssh_input(h, command: str, stdin: str) -> subprocess.CompletedProcess:
    """``command`` on the host with ``stdin`` (the testbed's own key, as tests.support.testbed.ssh)."""
    from tritonfleet_testbed.hosts import ssh_key

    return subprocess.run(["ssh", "-i", str(ssh_key()), "-o", "StrictHostKeyChecking=no", "-o",
                           "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                           f"root@{h.address}", command], input=stdin, capture_output=True, text=True, timeout=600)


