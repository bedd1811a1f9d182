"""Pull mode end to end on one test host: a host given only its bootstrap script converges itself
from the origin with no command from the control machine, picks up a release published for it,
and a run of a release that fails is reported, rolled back, and the rollout says why.

The host is tb1-t4, converged by the session: its bootstrap installs the agent (pinned wheels
from the origin), trusts the release key, starts its timer, and its first run of the session's
deploy changes nothing; it leaves pull mode at the end (timer, agent, configuration and state
removed), serving what the session deployed. The origin is a directory served by a real nginx
on the testbed bridge's address (the hosts' gateway), PUT allowed for reports/.

What needs no real host stays on fast transports (tests/unit/fleet/test_pull.py): the deploy
under the host's own name through the local connector against a real nginx origin, refused
pointers and releases, the textfile read by the real node exporter, the bootstrap script and
user-data, and the pull rollout's waves (canary, batches, a failed canary halting the next wave,
silent hosts, the failure budget) against agents answering from the origin directory. The
deploy a self-converging host runs is the one the session's deploy from bare proves.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.testbed import TRITONFLEET, env, ssh
from tritonfleet import ROOT
from tritonfleet.fleet import pull

HOST = "tb1-t4"
POLL = 3  # seconds between the host's looks at its pointer (pull_poll_interval)
DATA = ("--data", f"pull_poll_interval={POLL}")
INVENTORY = "inventories/testbed.py"
LEAVE_PULL_MODE = (
    "systemctl disable --now tritonfleet-converge.timer >/dev/null 2>&1; systemctl stop tritonfleet-converge.service; "
    "rm -f /etc/systemd/system/tritonfleet-converge.service /etc/systemd/system/tritonfleet-converge.timer; "
    "systemctl daemon-reload; rm -rf /opt/tritonfleet /etc/tritonfleet/pull.json /etc/tritonfleet/release-signers "
    "/var/lib/tritonfleet/pull /var/lib/tritonfleet/bootstrap.sh /var/lib/prometheus/node-exporter/tritonfleet_pull.prom; "
    "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q python3-venv 'python3.*-venv' python3-pip-whl "
    "python3-setuptools-whl >/dev/null 2>&1; true")


def tf(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([TRITONFLEET, *args], cwd=ROOT, capture_output=True, text=True, env=env(), timeout=timeout)


class PullHost:
    def __init__(self, origin: pull.Origin, key: Path, host, boot: Path):
        self.origin, self.key, self.host, self.boot = origin, key, host, boot
        self.reports = pull.Reports(origin)

    def publish(self, *extra: str) -> str:
        res = tf("pull", "publish", INVENTORY, "deploys/triton.py", "--origin", str(self.origin.root),
                 "--sign-key", str(self.key), "--limit", HOST, *DATA, *extra)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout.strip().splitlines()[-1]

    def report(self) -> dict:
        return self.reports.read(HOST) or {}

    def wait(self, release: str, after_generation: int = 0, timeout: float = 300) -> dict:
        """The host's report once it ran ``release`` (a generation above ``after_generation``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rep = self.report()
            if rep.get("release") == release and int(rep.get("generation") or 0) > after_generation and \
                    rep.get("result") in pull.RESULTS:
                return rep
            time.sleep(1)
        log = ssh(self.host, "tail -n 40 /var/lib/tritonfleet/pull/logs/*.log 2>/dev/null; "
                  "journalctl -u tritonfleet-converge -n 30 --no-pager 2>/dev/null", check=False)
        raise AssertionError(f"{HOST}: no report of {release[:12]} within {timeout:.0f} s; last {self.report()}\n{log}")

    def state(self) -> dict:
        return json.loads(ssh(self.host, "/opt/tritonfleet/agent/bin/tritonfleet converge --state"))


@pytest.fixture(scope="module")
def pull_host(deployed, tmp_path_factory):
    from tritonfleet_testbed import hosts
    from tritonfleet_testbed.origin_server import OriginServer, agent_wheelhouse, build_wheel

    testbed, _, _ = deployed
    host = {h.name: h for h in testbed.hosts}[HOST]
    tmp = tmp_path_factory.mktemp("pull")
    (tmp / "origin").mkdir()
    key = tmp / "release-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "releases", "-f", str(key)], check=True)
    wheels = agent_wheelhouse()
    wheel = build_wheel(tmp / "dist")
    srv = OriginServer(tmp / "origin", tmp / "nginx", addr=hosts.GATEWAY)
    try:
        origin = pull.Origin(tmp / "origin", srv.url)
        res = tf("bootstrap", INVENTORY, "--origin", str(origin.root), "--url", srv.url, "--out", str(tmp / "boot"),
                 "--wheel", str(wheel), "--wheelhouse", str(wheels), "--sign-key", str(key), "--limit", HOST, *DATA)
        assert res.returncode == 0, res.stderr[-3000:]
        yield PullHost(origin, key, host, tmp / "boot")
    finally:
        srv.stop()
        ssh(host, LEAVE_PULL_MODE, check=False)


def test_a_host_converges_itself_from_its_bootstrap_script(pull_host):
    """The host is given its script (as cloud-init's runcmd would run it) and nothing else: it
    installs its agent, runs the release published for it, and reports where it is read."""
    release = pull_host.publish()
    script = (pull_host.boot / HOST / "bootstrap.sh").read_text()
    res = ssh_input(pull_host.host, "sh -s", script)
    assert res.returncode == 0, f"{res.stdout[-2000:]}{res.stderr[-3000:]}"
    rep = pull_host.wait(release)
    assert rep["result"] == "ok" and rep["changed"] == 0, rep  # converged by the session: nothing to do
    # still serving what the session deployed: status over SSH, read-only
    res = tf("status", INVENTORY, "--json", "--limit", HOST)
    (row,) = json.loads(res.stdout)
    assert row["reachable"] and row["drift"] == [] and row["unit_state"] == "active", row
    # the state where Prometheus, the host's own command and the timer read it
    assert ssh(pull_host.host, "systemctl is-active tritonfleet-converge.timer").strip() == "active"
    prom = ssh(pull_host.host, "cat /var/lib/prometheus/node-exporter/tritonfleet_pull.prom")
    assert "tritonfleet_pull_last_run_success 1" in prom and f'release="{release[:12]}"' in prom
    state = pull_host.state()
    assert (state["release"], state["result"]) == (release, "ok")


def test_a_release_published_for_the_host_is_picked_up(pull_host):
    before = pull_host.report()
    assert before.get("result") == "ok", before
    new = pull_host.publish("--data", "pull_report_timeout=901")  # another release, the same serving
    assert new != before["release"]
    rep = pull_host.wait(new, after_generation=int(before["generation"]))
    assert rep["result"] == "ok", rep
    # published for this host alone: no other host has a pointer
    assert sorted(pull_host.origin.pointer(HOST).parent.glob("*.json")) == [pull_host.origin.pointer(HOST)]
    res = tf("status", INVENTORY, "--pull", str(pull_host.origin.root), "--json", "--limit", HOST)
    assert res.returncode == 0, res.stdout + res.stderr
    (row,) = json.loads(res.stdout)
    assert row["release"] == new and row["drift"] == [], row


def test_a_failing_run_is_reported_and_rolled_back(pull_host):
    """The canary's run fails (pre-flight refuses the release's driver branch): the rollout says
    why in the host's own words and points it back at what it ran, which it runs again."""
    was = pull_host.report()
    res = tf("pull", "rollout", INVENTORY, "deploys/triton.py", "--origin", str(pull_host.origin.root),
             "--sign-key", str(pull_host.key), "--limit", HOST, "--canary", "1", "--timeout", "300", "--json",
             *DATA, "--data", "nvidia_driver_branch=999")
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(res.stdout)
    (row,) = report["hosts"]
    assert "more than --max-fail 0" in report["halted"], report
    assert row["result"] == "rolled back" and "999" in row["detail"], row  # the branch the host refused
    after = pull_host.report()
    assert after["release"] == was["release"] and after["result"] == "ok", after
    assert int(after["generation"]) > int(was["generation"])
    state = pull_host.state()
    assert (state["release"], state["result"]) == (was["release"], "ok")


def ssh_input(h, command: str, stdin: str) -> subprocess.CompletedProcess:
    """``command`` on the host with ``stdin`` (the testbed's own key, as tests.support.testbed.ssh)."""
    from tritonfleet_testbed.hosts import ssh_key

    return subprocess.run(["ssh", "-i", str(ssh_key()), "-o", "StrictHostKeyChecking=no", "-o",
                           "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                           f"root@{h.address}", command], input=stdin, capture_output=True, text=True, timeout=600)
