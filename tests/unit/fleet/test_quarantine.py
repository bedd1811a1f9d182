"""The quarantine receiver (tritonfleet.fleet.quarantine) without test hosts: the budget and the round's
plan (generated fleets and alerts, hypothesis), and the receiver itself against real components:
Debian's HAProxy in front of four inventory hosts served by one real tritonserver, Debian's
Alertmanager sending its webhook, the warm inference gate against that tritonserver (its model
switched to fail and back), the operator's commands and `status`'s column."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.forked import forked
from tests.support.haproxy import HAProxy
from tests.support.tritonproc import copy_repository, local_server
from tritonfleet.cli import main
from tritonfleet.core.errors import UsageError
from tritonfleet.fleet import quarantine
from tritonfleet.fleet.inventory import FleetHost, load_inventory
from tritonfleet.serving import drain
from tritonfleet_testbed.ports import free_port

ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
HOSTS = ["h1", "h2", "h3", "h4"]


# ---- the budget and the plan --------------------------------------------------------------

@pytest.mark.parametrize(("value", "size", "limit"), [
    (1, 4, 1), (0, 4, 0), ("2", 10, 2), ("25%", 4, 1), ("25%", 3, 0), ("50%", 5, 2), ("100%", 7, 7), (" 10 % ", 20, 2)])
def test_budget(value, size, limit):
    assert quarantine.budget_limit(value, size) == limit


@pytest.mark.parametrize("value", [True, -1, "x", "25.5%", "120%", None, "%"])
def test_bad_budget(value):
    with pytest.raises(ValueError):
        quarantine.budget_limit(value, 4)


def test_bad_budget_names_the_host():
    hosts = [FleetHost("a", ["g"], {"quarantine_budget": "lots"})]
    with pytest.raises(UsageError, match="a: quarantine_budget 'lots' is neither a number of hosts nor 'P%'"):
        quarantine.limits(hosts)


def fleet(groups: list[int], budgets: list) -> dict[str, FleetHost]:
    out = {}
    for g, (n, budget) in enumerate(zip(groups, budgets, strict=True)):
        for i in range(n):
            name = f"g{g}-{i}"
            out[name] = FleetHost(name, [f"g{g}"], {"quarantine_budget": budget})
    return out


@settings(max_examples=300, deadline=None)
@given(data=st.data(), groups=st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_a_round_never_takes_a_group_beyond_its_budget(data, groups):
    budgets = data.draw(st.lists(st.one_of(st.integers(0, 3), st.sampled_from(["25%", "50%", "0%", "100%"])),
                                 min_size=len(groups), max_size=len(groups)))
    hosts = fleet(groups, budgets)
    names = sorted(hosts)
    limits = quarantine.limits(list(hosts.values()))
    out_now = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    records = {n: quarantine.Record(n, "t", held=data.draw(st.booleans())) for n in out_now}
    alerting = data.draw(st.lists(st.sampled_from(names), max_size=10))
    alerts = {f"fp{i}": quarantine.Alert(f"fp{i}", "A", h, f"2026-01-01T00:00:{i:02d}Z")
              for i, h in enumerate(alerting)}
    acked = {fp: a.starts_at for fp, a in alerts.items() if data.draw(st.booleans())}
    p = quarantine.plan(alerts, acked, records, hosts, limits, lambda fh: True)
    live = {a.host for fp, a in alerts.items() if acked.get(fp) != a.starts_at}
    taken = [n for n, _ in p.quarantine]
    for g, limit in limits.items():
        before = sum(1 for n in records if hosts[n].group == g)
        new = sum(1 for n in taken if hosts[n].group == g)
        assert new == 0 or before + new <= limit
        # as many as the budget allows are taken: an over-budget host means the group is full
        if any(hosts[n].group == g for n, _ in p.over_budget):
            assert before + new >= limit
    assert set(taken) | {n for n, _ in p.over_budget} == live - set(records)
    assert set(p.returns) == {n for n, r in records.items() if not r.held and n not in live}


def test_the_earliest_alert_goes_first():
    hosts = fleet([4], ["25%"])
    alerts = {"a": quarantine.Alert("a", "X", "g0-3", "2026-01-01T00:00:05Z"),
              "b": quarantine.Alert("b", "X", "g0-1", "2026-01-01T00:00:01Z"),
              "c": quarantine.Alert("c", "X", "g0-2", "2026-01-01T00:00:03Z")}
    p = quarantine.plan(alerts, {}, {}, hosts, quarantine.limits(list(hosts.values())), lambda fh: True)
    assert [n for n, _ in p.quarantine] == ["g0-1"] and [n for n, _ in p.over_budget] == ["g0-2", "g0-3"]


# ---- the receiver against real components ---------------------------------------------------

@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    work = tmp_path_factory.mktemp("q-triton")
    repo = copy_repository(work / "repo", kind_cpu=True)
    served = work / "served"
    shutil.copytree(repo, served)
    faults = work / "faults"
    faults.mkdir()
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITONFLEET_TESTBED_FAULT_DIR", str(faults))
    try:
        with local_server(served, work) as srv:
            yield srv, repo, faults
    finally:
        mp.undo()


class Rig:
    """Four inventory hosts (one group, budget 25%) served by one tritonserver behind a real
    HAProxy; a receiver on loopback with its state in a temporary directory."""

    def __init__(self, tmp: Path, srv, repo: Path, budget="25%"):
        self.hap = HAProxy(tmp, [(h, f"127.0.0.1:{srv.http_port}") for h in HOSTS], inter="200ms")
        self.tmp = tmp
        data = {"health_host": "127.0.0.1", "ssh_hostname": "127.0.0.1", "triton_http_port": srv.http_port,
                "triton_metrics_port": srv.metrics_port, "lb": "haproxy", "lb_haproxy_sockets": [self.hap.socket],
                "lb_drain_timeout": 20, "quarantine_budget": budget, "model_repository": str(repo),
                "model_overrides": {}, "ssh_strict_host_key_checking": "off"}
        inv = tmp / "inv" / "rig.py"
        inv.parent.mkdir()
        inv.write_text("fleet = [" + ", ".join(f"({h!r}, {data!r})" for h in HOSTS) + "]\n")
        self.inventory = inv
        self.hosts = load_hosts(inv)
        self.lines: list[str] = []
        self.rec = quarantine.Receiver(self.hosts, tmp / "state", interval=0.2, gate_timeout=30,
                                       resolve_grace=0, echo=self.lines.append)
        self.token_file = quarantine.write_token(tmp / "token")
        self.token = quarantine.read_token(self.token_file)
        self.listen = f"127.0.0.1:{free_port()}"
        self.url = f"http://{self.listen}"
        self.thread = threading.Thread(target=quarantine.serve, daemon=True, args=(
            self.rec, self.listen, [quarantine.Caller("operator", self.token)]))
        self.thread.start()
        until(lambda: self._healthy(), "receiver up")
        for h in HOSTS:
            drain.HAProxy([self.hap.socket], "triton", h).wait_serving(30)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/healthy", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def state(self, host: str) -> drain.ServerState:
        return drain.HAProxy([self.hap.socket], "triton", host).state()

    def drained(self) -> list[str]:
        return [h for h in HOSTS if self.state(h).drained]

    def notify(self, status: str, *hosts: str, alert: str = "GpuXidCritical") -> None:
        body = {"version": "4", "status": status, "alerts": [
            {"status": status, "labels": {"alertname": alert, "host": h, "quarantine": "true", "severity": "critical"},
             "annotations": {"summary": f"{alert} on {h}"}, "startsAt": f"2026-01-01T00:00:0{i}Z",
             "fingerprint": f"{alert}-{h}"} for i, h in enumerate(hosts)]}
        req = urllib.request.Request(self.url + "/alerts", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200

    def fetch(self) -> dict:
        return quarantine.fetch_state(self.url, token=self.token)

    def cli(self, *args: str):
        """``tritonfleet quarantine ARGS --url <receiver> --token-file <its token>``."""
        return tritonfleet("quarantine", *args, "--url", self.url, "--token-file", str(self.token_file))

    def events(self, action: str) -> list[dict]:
        return [e for e in self.fetch()["events"] if e["action"] == action]

    def close(self) -> None:
        self.rec.stop.set()
        self.thread.join(30)
        self.hap.stop()


def _loaded(inv: Path, data: dict | None) -> list[tuple[str, list[str], dict]]:
    return [(h.name, h.groups, h.data) for h in load_inventory(inv, data=data)]


def load_hosts(inv: Path, data: dict | None = None) -> list[FleetHost]:
    """The inventory's hosts, loaded in a forked child: loading an inventory patches the process
    for gevent, which later tests must not inherit (tests/support/forked.py)."""
    return [FleetHost(name, groups, d) for name, groups, d in forked(_loaded, inv, data)]


def tritonfleet(*args: str):
    """The command line in a forked child of this process (it loads the inventory:
    tests/support/forked.py); the receiver's thread in this process answers it."""
    return forked(_cli, *args)


def _cli(*args: str):
    """The command line, in this process (click's runner): exit status, stdout, stderr. An error
    of exit status 1 ends the command with its message in the SystemExit (tritonfleet.core.exits),
    which Python prints on stderr as the process ends; click's runner writes it to stdout: here it
    goes where the real process puts it."""
    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    stdout, stderr = res.stdout, res.stderr
    if isinstance(res.exception, SystemExit) and isinstance(res.exception.code, str):
        said = f"{res.exception.code}\n"
        stdout, stderr = stdout.removesuffix(said), stderr + said
    return Ran(res.exit_code, stdout, stderr)


class Ran:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def until(fn, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            assert v, f"{what}: not so after {timeout}s"
            return v
        time.sleep(0.1)


@pytest.fixture
def rig(tmp_path, triton):
    srv, repo, faults = triton
    r = Rig(tmp_path, srv, repo)
    r.faults = faults
    try:
        yield r
    finally:
        r.close()


def test_three_of_four_faulty_with_a_25_percent_budget_drains_exactly_one(rig):
    rig.notify("firing", "h2", "h3", "h1")  # h2's alert is the earliest
    until(lambda: rig.drained() == ["h2"], "h2 drained")
    time.sleep(1)  # more rounds change nothing
    assert rig.drained() == ["h2"]
    over = {e["host"] for e in rig.events("over-budget")}
    assert over == {"h3", "h1"} and len(rig.events("over-budget")) == 2  # said once each
    state = rig.fetch()
    assert list(state["hosts"]) == ["h2"] and state["budget"] == {"fleet": {"limit": 1, "out": 1}}
    assert state["hosts"]["h2"]["reasons"] == ["GpuXidCritical: GpuXidCritical on h2"]
    # h2's alert resolves: its warm gate passes, it serves again, and the budget goes to the next
    rig.notify("resolved", "h2")
    until(lambda: "h2" not in rig.drained() and rig.state("h2").serving, "h2 back")
    until(lambda: rig.drained() == ["h3"], "h3 (the next earliest) drained")
    returned = rig.events("returned")
    assert [e["host"] for e in returned] == ["h2"] and "warm gate passed (first inference:" in returned[0]["text"]
    gates = [e["host"] for e in rig.events("gate")]
    assert gates == ["h2"]
    rig.notify("resolved", "h3")
    until(lambda: rig.drained() == ["h1"], "then h1")
    rig.notify("resolved", "h1")
    until(lambda: rig.drained() == [] and all(rig.state(h).serving for h in HOSTS), "every host back")
    lines = (rig.tmp / "state" / "events.jsonl").read_text().splitlines()
    assert [json.loads(x)["host"] for x in lines if json.loads(x)["action"] == "quarantined"] == ["h2", "h3", "h1"]


def test_a_host_returns_only_after_its_warm_gate_passes(rig):
    switch = rig.faults / "text_classifier_onnx"
    rig.notify("firing", "h4", alert="TritonInferenceProbeFailing")
    until(lambda: rig.drained() == ["h4"], "h4 drained")
    switch.touch()  # ready but broken: the gate's inference fails
    try:
        rig.notify("resolved", "h4", alert="TritonInferenceProbeFailing")
        until(lambda: rig.events("stays-out"), "the gate fails")
        assert "text_classifier_onnx is ready but its first inference failed" in rig.events("stays-out")[0]["text"]
        assert rig.drained() == ["h4"]
        res = rig.cli("release", str(rig.inventory), "h4")
        assert res.returncode == 1 and "h4: stays out: warm inference gate failed:" in res.stdout, res.stderr
        assert rig.drained() == ["h4"]
    finally:
        switch.unlink()
    until(lambda: rig.drained() == [] and rig.state("h4").serving, "h4 back once the gate passes")


def test_hold_and_release(rig):
    res = rig.cli("hold", str(rig.inventory), "h3", "--reason", "fan noise")
    assert res.returncode == 0 and "h3: held:" in res.stdout, res.stdout + res.stderr
    assert rig.drained() == ["h3"]
    time.sleep(1)  # no alert fires for it, but held: it stays out
    assert rig.drained() == ["h3"]
    listing = rig.cli("list", str(rig.inventory))
    assert "h3" in listing.stdout and "held since" in listing.stdout and "fan noise" in listing.stdout
    # a held host's firing alert is acknowledged by the release: it does not take it out again
    rig.notify("firing", "h3")
    until(lambda: rig.fetch()["firing"], "the receiver has the alert")
    res = rig.cli("release", str(rig.inventory), "h3")
    assert res.returncode == 0 and "h3: returned:" in res.stdout, res.stdout + res.stderr
    until(lambda: rig.drained() == [] and rig.state("h3").serving, "h3 back in service after its release")
    state = rig.fetch()
    assert state["firing"] == [{"host": "h3", "alert": "GpuXidCritical", "summary": "GpuXidCritical on h3",
                                "since": "2026-01-01T00:00:00Z", "acknowledged": True}]
    unknown = rig.cli("hold", str(rig.inventory), "nope")
    assert unknown.returncode == 2 and "nope is not a host of" in unknown.stderr


def test_a_host_put_back_by_someone_else_is_drained_again(rig):
    rig.notify("firing", "h1")
    until(lambda: rig.drained() == ["h1"], "h1 drained")
    rig.hap.command("set server triton/h1 state ready")  # as a deploy's health gate would
    until(lambda: rig.events("drained-again"), "drained again")
    assert rig.drained() == ["h1"]


def test_the_state_survives_a_restart_and_status_shows_it(rig, tmp_path):
    rig.notify("firing", "h2")
    until(lambda: "h2" in rig.fetch()["hosts"], "h2 quarantined (and its state saved)")
    again = quarantine.Receiver(rig.hosts, rig.tmp / "state", interval=0.2, gate_timeout=30, echo=lambda _: None)
    snap = again.snapshot()
    assert list(snap["hosts"]) == ["h2"] and snap["hosts"]["h2"]["state"] == "quarantined"
    from tritonfleet.cli.fleet import add_quarantine, status_table
    from tritonfleet.fleet import probe

    hosts = load_hosts(rig.inventory, data={"quarantine_url": rig.url, "quarantine_token_file": str(rig.token_file)})
    rows = [probe.HostStatus(h, "127.0.0.1", None, reachable=True, unit_state="active") for h in HOSTS]
    assert add_quarantine(hosts, rows)
    assert rows[1].quarantine["reasons"] == ["GpuXidCritical: GpuXidCritical on h2"]
    assert rows[1].drift[-1].startswith("quarantined since 2026-") and not rows[0].drift
    table = status_table(rows)
    assert table.splitlines()[0].split()[-2:] == ["QUARANTINE", "DRIFT"]
    assert "quarantined since" in table.splitlines()[2]
    assert "QUARANTINE" not in status_table([rows[0]])  # no column when nothing is out


def test_alerts_for_unknown_hosts_or_without_a_balancer_only_alert(tmp_path):
    hosts = [FleetHost("a", ["g"], {"quarantine_budget": 1, "lb": None, "quarantine_check_interval": 1,
                                     "quarantine_gate_timeout": 5, "quarantine_resolve_grace": 0})]
    lines: list[str] = []
    rec = quarantine.Receiver(hosts, tmp_path, echo=lines.append, balancer_of=lambda fh: None)
    rec.apply_notification({"alerts": [
        {"status": "firing", "labels": {"alertname": "X", "host": "a", "quarantine": "true"}, "fingerprint": "1"},
        {"status": "firing", "labels": {"alertname": "X", "host": "zz", "quarantine": "true"}, "fingerprint": "2"},
        {"status": "firing", "labels": {"alertname": "Y", "host": "a"}, "fingerprint": "3"}]})
    rec.round()
    rec.round()
    assert [ln.split(" ", 1)[1] for ln in lines if "alert-only" in ln or "unknown-host" in ln] == [
        "zz unknown-host: X: not a host of the inventory",
        "a alert-only: X: no load balancer (lb) to take it out of"]
    assert rec.records == {}


def test_alertmanager_sends_its_webhook_to_the_receiver(rig, tmp_path):
    """Debian's Alertmanager, configured by `tritonfleet prometheus --quarantine-url`, routes a
    quarantine alert posted to its API to the receiver, which drains the host; its API is read
    back every round (--alertmanager)."""
    import yaml

    from tritonfleet.observability.gpu_health_rules import alertmanager_config

    port = free_port()
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(alertmanager_config(rig.url, str(rig.token_file), group_interval="1s")))
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={cfg}", f"--storage.path={tmp_path / 'am'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    am = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _get(am + "/-/ready"), "alertmanager ready")
        rig.rec.alertmanager = am
        alert = [{"labels": {"alertname": "GpuXidCritical", "host": "h4", "quarantine": "true", "xid": "79",
                             "severity": "critical"}, "annotations": {"summary": "Xid 79 on h4"}}]
        req = urllib.request.Request(am + "/api/v2/alerts", data=json.dumps(alert).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=5).close()
        until(lambda: rig.drained() == ["h4"], "h4 drained through Alertmanager")
        state = rig.fetch()
        assert state["hosts"]["h4"]["reasons"] == ["GpuXidCritical: Xid 79 on h4"]
        assert state["firing"][0]["alert"] == "GpuXidCritical"
    finally:
        rig.rec.alertmanager = ""
        proc.terminate()
        proc.wait(10)


def _get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_the_unit_runs_serve_from_here():
    res = tritonfleet("quarantine", "unit", "inventories/prod.py", "--listen", "127.0.0.1:9095",
                      "--alertmanager", "http://127.0.0.1:9093")
    assert res.returncode == 0, res.stderr
    start = [ln for ln in res.stdout.splitlines() if ln.startswith("ExecStart=")][0]
    assert start.split()[1:4] == ["quarantine", "serve", str(Path("inventories/prod.py").resolve())]
    assert "--alertmanager=http://127.0.0.1:9093" in start and "Restart=always" in res.stdout


def test_no_receiver_is_a_clear_error(tmp_path):
    token = str(quarantine.write_token(tmp_path / "token"))
    res = tritonfleet("quarantine", "list", "inventories/prod.py", "--url", f"http://127.0.0.1:{free_port()}",
                      "--token-file", token)
    assert res.returncode == 1 and "does not answer" in res.stderr and "Traceback" not in res.stderr
    res = tritonfleet("quarantine", "list", "inventories/prod.py")
    assert res.returncode == 2 and "no quarantine_url" in res.stderr
