"""Pull mode end to end on two test hosts: hosts given only their bootstrap scripts converge
themselves from the origin with no command from the control machine, a release published for a
wave reaches exactly that wave, and a host whose run fails is reported, rolled back, and its wave
halts the rollout before the next one.

The hosts are tb1-t4 and tb2-l4, converged by the session: each one's bootstrap installs the agent
(pinned wheels from the origin), trusts the release key, starts its timer, and its first run of the
session's deploy changes nothing; they leave pull mode at the end (timer, agent, configuration and
state removed), serving what the session deployed. The origin is a directory served by a real
nginx on the testbed bridge's address (the hosts' gateway), PUT allowed for reports/.

A bare host from its bootstrap script alone to serving is `bench/run.py bare-pull`'s measurement
(docs/scale.md: one deploy from bare, minutes, which the session's own deploy from bare already
proves for push mode). What needs no real host stays on fast transports
(tests/integration/fleet/test_pull.py): the deploy under the host's own name through the local connector
against a real nginx origin, refused pointers and releases, the textfile read by the real node
exporter, the bootstrap script and user-data, and the pull rollout's waves (canary, batches, a
failed canary halting the next wave, silent hosts, the failure budget) against agents answering
from the origin directory.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.testbed import TRITONFLEET, env, pyinfra, ssh
from tritonfleet import ROOT
from tritonfleet.fleet.pull.origin import RESULTS, PullSite
from tritonfleet.fleet.pull.reports import Reports
from tritonfleet.fleet.pull.signing import read_pointer

HOST, OTHER = "tb1-t4", "tb2-l4"  # the canary and the second wave
POLL = 3  # seconds between a host's looks at its pointer (pull_poll_interval)
DATA = ("--data", f"pull_poll_interval={POLL}")
INVENTORY = "inventories/testbed.py"
LEAVE_PULL_MODE = (
    "systemctl disable --now tritonfleet-converge.timer >/dev/null 2>&1; systemctl stop tritonfleet-converge.service; "
    "rm -f /etc/systemd/system/tritonfleet-converge.service /etc/systemd/system/tritonfleet-converge.timer; "
    "systemctl daemon-reload; rm -rf /opt/tritonfleet /etc/tritonfleet/pull.json /etc/tritonfleet/release-signers "
    "/etc/tritonfleet/pull "
    "/var/lib/tritonfleet/pull /var/lib/tritonfleet/bootstrap.sh /var/lib/prometheus/node-exporter/tritonfleet_pull.prom; "
    "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q python3-venv 'python3.*-venv' python3-pip-whl "
    "python3-setuptools-whl >/dev/null 2>&1; true")


def tf(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([TRITONFLEET, *args], cwd=ROOT, capture_output=True, text=True, env=env(), timeout=timeout)


class PullFleet:
    def __init__(self, origin: PullSite, key: Path, hosts: dict, boot: Path):
        self.origin, self.key, self.hosts, self.boot = origin, key, hosts, boot
        self.reports = Reports(origin)

    def publish(self, *limit: str, extra: tuple[str, ...] = ()) -> str:
        res = tf("pull", "publish", INVENTORY, "deploys/triton.py", "--origin", str(self.origin.root),
                 "--sign-key", str(self.key), *[a for h in limit for a in ("--limit", h)], *DATA, *extra)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout.strip().splitlines()[-1]

    def report(self, host: str) -> dict:
        """The host's report when it is signed with its own report key (enrolled by the bootstrap)."""
        return self.reports.read(host) or {}

    def wait(self, host: str, release: str, after_generation: int = 0, timeout: float = 300) -> dict:
        """The host's report once it ran ``release`` (a generation above ``after_generation``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rep = self.report(host)
            if rep.get("release") == release and int(rep.get("generation") or 0) > after_generation and \
                    rep.get("result") in RESULTS:
                return rep
            time.sleep(1)
        log = ssh(self.hosts[host], "tail -n 40 /var/lib/tritonfleet/pull/logs/*.log 2>/dev/null; "
                  "journalctl -u tritonfleet-converge -n 30 --no-pager 2>/dev/null", check=False)
        raise AssertionError(f"{host}: no report of {release[:12]} within {timeout:.0f} s; last {self.report(host)}\n{log}")

    def state(self, host: str) -> dict:
        return json.loads(ssh(self.hosts[host], "/opt/tritonfleet/agent/bin/tritonfleet converge --state"))


@pytest.fixture(scope="module")
def pull_fleet(deployed, tmp_path_factory):
    from tritonfleet_testbed import hosts
    from tritonfleet_testbed.origin_server import OriginServer, agent_wheelhouse, build_wheel

    testbed, _, _ = deployed
    by_name = {h.name: h for h in testbed.hosts if h.name in (HOST, OTHER)}
    assert sorted(by_name) == sorted((HOST, OTHER)), [h.name for h in testbed.hosts]
    # the two hosts as the session's deploy made them: the part's earlier tests (GPU resets, drains,
    # canaries) may have left something a deploy puts back, and the first test asserts a no-op
    res, _ = pyinfra("deploys/triton.py", "--limit", HOST, "--limit", OTHER)
    assert res.returncode == 0, res.stderr[-3000:]
    tmp = tmp_path_factory.mktemp("pull")
    (tmp / "origin").mkdir()
    key = tmp / "release-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "releases", "-f", str(key)], check=True)
    wheels = agent_wheelhouse()
    wheel = build_wheel(tmp / "dist")
    srv = OriginServer(tmp / "origin", tmp / "nginx", addr=hosts.GATEWAY)
    try:
        origin = PullSite(tmp / "origin", srv.url)
        res = tf("bootstrap", INVENTORY, "--origin", str(origin.root), "--url", srv.url, "--out", str(tmp / "boot"),
                 "--wheel", str(wheel), "--wheelhouse", str(wheels), "--sign-key", str(key), "--limit", HOST,
                 "--limit", OTHER, *DATA)
        assert res.returncode == 0, res.stderr[-3000:]
        yield PullFleet(origin, key, by_name, tmp / "boot")
    finally:
        srv.stop()
        for h in by_name.values():
            ssh(h, LEAVE_PULL_MODE, check=False)


def test_hosts_converge_themselves_from_their_bootstrap_scripts(pull_fleet):
    """Each host is given its script (as cloud-init's runcmd would run it) and nothing else: it
    installs its agent, runs the release published for it, and reports where it is read."""
    release = pull_fleet.publish(HOST, OTHER)
    out: dict[str, subprocess.CompletedProcess] = {}

    def give(name: str) -> None:
        out[name] = ssh_input(pull_fleet.hosts[name], "sh -s", (pull_fleet.boot / name / "bootstrap.sh").read_text())

    threads = [threading.Thread(target=give, args=(n,)) for n in (HOST, OTHER)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for name in (HOST, OTHER):
        res = out[name]
        assert res.returncode == 0, f"{name}: {res.stdout[-2000:]}{res.stderr[-3000:]}"
    for name in (HOST, OTHER):
        rep = pull_fleet.wait(name, release)
        assert rep["result"] == "ok" and rep["changed"] == 0, rep  # converged by the session: nothing to do
    # still serving what the session deployed: status over SSH, read-only
    res = tf("status", INVENTORY, "--json", "--limit", HOST, "--limit", OTHER)
    rows = json.loads(res.stdout)
    assert len(rows) == 2 and all(r["reachable"] and r["drift"] == [] and r["unit_state"] == "active" for r in rows), rows
    # the state where Prometheus, the host's own command and the timer read it
    h = pull_fleet.hosts[HOST]
    assert ssh(h, "systemctl is-active tritonfleet-converge.timer").strip() == "active"
    prom = ssh(h, "cat /var/lib/prometheus/node-exporter/tritonfleet_pull.prom")
    assert "tritonfleet_pull_last_run_success 1" in prom and f'release="{release[:12]}"' in prom
    state = pull_fleet.state(HOST)
    assert (state["release"], state["result"]) == (release, "ok")


def test_a_release_published_for_a_wave_reaches_exactly_that_wave(pull_fleet):
    before = {n: pull_fleet.report(n) for n in (HOST, OTHER)}
    assert all(r.get("result") == "ok" for r in before.values()), before
    other_pointer = read_pointer(pull_fleet.origin.pointer(OTHER))
    # other data, the same serving: the same release (it holds no host data), a new pointer for the wave
    new = pull_fleet.publish(HOST, extra=("--data", "pull_report_timeout=901"))
    ptr = read_pointer(pull_fleet.origin.pointer(HOST))
    assert ptr["host_data"]["data"]["pull_report_timeout"] == 901 and ptr["generation"] > before[HOST]["generation"]
    assert read_pointer(pull_fleet.origin.pointer(OTHER)) == other_pointer
    rep = pull_fleet.wait(HOST, new, after_generation=int(before[HOST]["generation"]))
    assert rep["result"] == "ok", rep
    time.sleep(3 * POLL)  # the other host looked at its own pointer meanwhile, and found it unchanged
    assert pull_fleet.report(OTHER) == before[OTHER]
    state = pull_fleet.state(OTHER)
    assert state["release"] == before[OTHER]["release"] and state["checked_ts"] > state["finished_ts"]
    res = tf("status", INVENTORY, "--pull", str(pull_fleet.origin.root), "--json", "--limit", HOST, "--limit", OTHER)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {r["host"]: r for r in json.loads(res.stdout)}
    assert rows[HOST]["release"] == new and rows[OTHER]["release"] == before[OTHER]["release"], rows


def test_a_failing_host_is_reported_and_its_wave_halts(pull_fleet):
    """The canary's run fails (pre-flight refuses the release's driver branch): the rollout says
    why in the host's own words, points it back at what it ran (which it runs again), and never
    publishes the next wave."""
    was = {n: pull_fleet.report(n) for n in (HOST, OTHER)}
    other_pointer = read_pointer(pull_fleet.origin.pointer(OTHER))
    res = tf("pull", "rollout", INVENTORY, "deploys/triton.py", "--origin", str(pull_fleet.origin.root),
             "--sign-key", str(pull_fleet.key), "--limit", HOST, "--limit", OTHER, "--canary", "1", "--batch", "1",
             "--timeout", "300", "--json", *DATA, "--data", "nvidia_driver_branch=999")
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(res.stdout)
    rows = {r["host"]: r for r in report["hosts"]}
    assert report["batches"] == [[HOST], [OTHER]], report
    assert "more than --max-fail 0" in report["halted"] and "1 host(s) not touched" in report["halted"], report
    assert rows[HOST]["result"] == "rolled back" and "999" in rows[HOST]["detail"], rows[HOST]  # the branch it refused
    assert rows[OTHER]["result"] == "not touched", rows[OTHER]
    after = pull_fleet.report(HOST)
    assert after["release"] == was[HOST]["release"] and after["result"] == "ok", after
    assert int(after["generation"]) > int(was[HOST]["generation"])
    state = pull_fleet.state(HOST)
    assert (state["release"], state["result"]) == (was[HOST]["release"], "ok")
    # the next wave was never published: the other host's pointer and report are as they were
    assert read_pointer(pull_fleet.origin.pointer(OTHER)) == other_pointer
    assert pull_fleet.report(OTHER) == was[OTHER]


def ssh_input(h, command: str, stdin: str) -> subprocess.CompletedProcess:
    """``command`` on the host with ``stdin`` (the testbed's own key, as tests.support.testbed.ssh)."""
    from tritonfleet_testbed.hosts import ssh_key

    return subprocess.run(["ssh", "-i", str(ssh_key()), "-o", "StrictHostKeyChecking=no", "-o",
                           "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                           f"root@{h.address}", command], input=stdin, capture_output=True, text=True, timeout=600)
