"""The quarantine receiver (tritonfleet.fleet.quarantine) without test hosts: the budget and the round's
plan (generated fleets and alerts, hypothesis), and the receiver itself against real components:
Debian's HAProxy in front of four inventory hosts served by one real tritonserver, Debian's
Alertmanager sending its webhook, the warm inference gate against that tritonserver (its model
switched to fail and back), the operator's commands and `status`'s column; the API as an attacker
meets it (generated requests without the token, of the wrong type or length or shape, the
review's four-hold attack, a text/plain cross-site POST, slow requests, a full queue) and
Alertmanager answers the receiver cannot read."""

from __future__ import annotations

import io
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

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
from tritonfleet.inventory.roster import FleetHost, load_inventory
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
    alerts = {f"fp{i}": quarantine.FiringAlert(f"fp{i}", "A", h, f"2026-01-01T00:00:{i:02d}Z")
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
    alerts = {"a": quarantine.FiringAlert("a", "X", "g0-3", "2026-01-01T00:00:05Z"),
              "b": quarantine.FiringAlert("b", "X", "g0-1", "2026-01-01T00:00:01Z"),
              "c": quarantine.FiringAlert("c", "X", "g0-2", "2026-01-01T00:00:03Z")}
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

    def __init__(self, tmp: Path, srv, repo: Path, budget="25%", push_secret: str = ""):
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
            self.rec, self.listen, [quarantine.Caller("operator", self.token)], False, push_secret))
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
        """The hosts the receiver took out: it holds them in maintenance (a deploy never readies those)."""
        return [h for h in HOSTS if self.state(h).maintenance]

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
        # the balancer is drained inside the round, the state published at its end: both are waited for
        until(lambda: rig.drained() == ["h4"] and "h4" in rig.fetch()["hosts"], "h4 drained through Alertmanager")
        state = rig.fetch()
        assert state["hosts"]["h4"]["reasons"] == ["GpuXidCritical: Xid 79 on h4"]
        assert state["firing"][0]["alert"] == "GpuXidCritical"
        time.sleep(1)  # rounds read Alertmanager's API back: its answer is one the receiver can read
        assert not rig.events("error") and rig.rec.noted.get("alertmanager") is None
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


# ---- the API as an attacker meets it -------------------------------------------------------

def raw(listen: str, path: str, body: bytes = b"", headers: dict | None = None, method: str = "POST",
        length: str | None = "auto") -> int:
    """One request as bytes on a socket (any header, any Content-Length, or none): the status
    the receiver answers, 0 when it closed the connection without one."""
    host, port = listen.rsplit(":", 1)
    head = [f"{method} {path} HTTP/1.1", f"Host: {listen}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if length is not None:
        head.append(f"Content-Length: {len(body) if length == 'auto' else length}")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        try:
            s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            s.shutdown(socket.SHUT_WR)  # all sent: a reader that reads to the end finds it
        except OSError:
            pass
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
    m = re.match(rb"HTTP/1\.[01] ([0-9]{3})", got)
    return int(m.group(1)) if m else 0


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=12)
PATHS = ["/alerts", "/v1/hosts/h1/hold", "/v1/hosts/h2/release"]


@st.composite
def bad_requests(draw):
    """A request with at least one thing wrong: its token, its Content-Type, its Content-Length,
    or its body for its path."""
    path = draw(st.sampled_from(PATHS))
    wrong = draw(st.sets(st.sampled_from(["token", "type", "length", "body"]), min_size=1))
    headers = {"Content-Type": "application/json"}
    if "token" in wrong:
        headers.update(draw(st.sampled_from([{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic eDp5"},
                                             {"Authorization": "Bearer"}, {"Authorization": "bearer  "}])))
    else:
        headers["Authorization"] = "Bearer TOKEN"
    if "type" in wrong:
        kind = draw(st.sampled_from([None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                     "application/jsonx"]))
        if kind is None:
            del headers["Content-Type"]
        else:
            headers["Content-Type"] = kind
    if "body" in wrong:
        body = draw(st.one_of(
            st.binary(max_size=200).filter(lambda b: not _is_object(b)),
            JSON.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
            st.builds(lambda v: json.dumps({"alerts": v}).encode(), JSON.filter(lambda v: not isinstance(v, list)))
            if path == "/alerts" else
            st.builds(lambda k, v: json.dumps({k: v}).encode(), st.sampled_from(["reason", "by", "force"]),
                      JSON.filter(lambda v: not isinstance(v, (str, bool))))))
    else:
        body = json.dumps({"alerts": []} if path == "/alerts" else {"reason": "x"}).encode()
    length: str | None = "auto"
    if "length" in wrong:
        length = draw(st.sampled_from([None, "-1", "-5242880", "abc", "1e3", str(quarantine.server.MAX_BODY + 1),
                                       "99999999999999999999"]))
    return path, headers, body, length


def _is_object(b: bytes) -> bool:
    try:
        return isinstance(json.loads(b), dict)
    except ValueError:
        return False


@pytest.fixture
def quiet_rig(tmp_path, triton):
    """The rig without the module's Triton faults (the attacks never reach a gate)."""
    srv, repo, _ = triton
    r = Rig(tmp_path, srv, repo)
    try:
        yield r
    finally:
        r.close()


def test_generated_bad_requests_get_a_4xx_and_drain_nothing(quiet_rig):
    """Random and hostile requests (wrong or missing token, wrong Content-Type, missing, negative,
    huge or unreadable Content-Length, bodies of the wrong shape or no JSON at all): every one is
    answered 4xx, nothing is queued or drained, and the receiver keeps serving."""
    rig = quiet_rig
    seen: set[int] = set()

    @settings(max_examples=150, deadline=None)
    @given(bad_requests())
    def attack(req):
        path, headers, body, length = req
        headers = {k: v.replace("TOKEN", rig.token) for k, v in headers.items()}
        status = raw(rig.listen, path, body, headers, length=length)
        seen.add(status)
        assert 400 <= status < 500, (status, req)

    attack()
    assert rig._healthy() and rig.rec.worker.is_alive()
    assert rig.drained() == [] and rig.fetch()["hosts"] == {}
    assert not rig.events("alert") and not rig.events("held")
    assert {401, 415} <= seen and seen & {400, 411, 413}


def test_the_four_hold_attack_is_refused_without_a_token_and_held_within_the_budget_with_one(quiet_rig):
    """The review's attack: one hold per host, a browser's text/plain POST, no credential. Without
    the token all four are refused; the text/plain POST is refused with it too (a cross-site
    form cannot send JSON); with it, holds stop at the budget (25% of 4: one host) and the audit
    trail names the token's caller, not the body's claim."""
    rig = quiet_rig
    forged = json.dumps({"by": "nobody\n2026-01-01T00:00:00Z h4 returned: forged", "reason": "x"}).encode()
    for h in HOSTS:
        assert raw(rig.listen, f"/v1/hosts/{h}/hold", forged, {"Content-Type": "text/plain"}) == 401
    assert raw(rig.listen, "/v1/hosts/h1/hold", forged, {"Content-Type": "text/plain",
                                                          "Authorization": f"Bearer {rig.token}"}) == 415
    assert rig.drained() == []
    answers = [raw(rig.listen, f"/v1/hosts/{h}/hold", forged, bearer(rig.token)) for h in HOSTS]
    assert answers == [200, 409, 409, 409]
    assert rig.drained() == ["h1"]
    held = rig.events("held")[0]
    assert held["caller"] == "operator" and "\n" not in held["text"]
    assert all("\n" not in line.strip() or line.startswith("Traceback") for line in rig.lines)
    forged_path = "/v1/hosts/x%0A2026-01-01T00:00:00Z%20h4%20returned:%20forged/release"
    assert raw(rig.listen, forged_path, b"{}", bearer(rig.token)) == 404
    rig.notify("firing", "h9\n2026-01-01T00:00:00Z h4 returned: forged")
    until(lambda: rig.events("unknown-host"), "the unknown host said")
    assert not [line for line in rig.lines if "\n" in line and not line.startswith("Traceback")]
    refused = rig.events("over-budget")
    assert len(refused) == 3 and "hold by operator (says nobody\\n2026" in refused[0]["text"]
    # beyond the budget only with --force and a reason, recorded
    res = rig.cli("hold", str(rig.inventory), "h2", "--force")
    assert res.returncode == 2 and "--force needs --reason" in res.stderr
    assert raw(rig.listen, "/v1/hosts/h2/hold", b'{"force": true}', bearer(rig.token)) == 400
    res = rig.cli("hold", str(rig.inventory), "h2", "--force", "--reason", "replacing its fan")
    assert res.returncode == 0 and "h2: held:" in res.stdout, res.stdout + res.stderr
    assert rig.drained() == ["h1", "h2"]
    assert "forced beyond the budget of group fleet" in rig.fetch()["hosts"]["h2"]["held_reason"]
    # and without any token the state itself is not given away
    assert raw(rig.listen, "/v1/quarantine", method="GET", length=None) == 401
    assert raw(rig.listen, "/-/healthy", method="GET", length=None) == 200


def test_the_reviews_negative_length_body_is_refused_unread(quiet_rig):
    """finding 2: 5 MB with "Content-Length: -1" had been read to the end, held a host and put the
    5 MB "by" into events.jsonl and state.json."""
    rig = quiet_rig
    body = json.dumps({"by": "x" * (5 << 20)}).encode()
    status = raw(rig.listen, "/v1/hosts/h1/hold", body, bearer(rig.token), length="-1")
    assert status in (400, 0)  # 400, or the connection reset under the unread body
    assert rig._healthy() and rig.drained() == [] and rig.fetch()["hosts"] == {}
    events = rig.tmp / "state" / "events.jsonl"
    assert not events.exists() or events.stat().st_size < 100_000


def test_a_malformed_webhook_gets_400_and_the_receiver_keeps_serving(quiet_rig):
    """newcomer-2 #52: {"alerts": "x"} had been a 200, then the worker's death and the process's.
    Now: 400, nothing queued; an alert of the wrong shape inside a good payload is skipped (and
    said); a good notification afterwards still quarantines."""
    rig = quiet_rig
    assert raw(rig.listen, "/alerts", b'{"alerts": "x"}', bearer(rig.token)) == 400
    assert raw(rig.listen, "/alerts", b"garbage", bearer(rig.token)) == 400
    req = urllib.request.Request(rig.url + "/alerts", method="POST", headers=bearer(rig.token), data=json.dumps(
        {"alerts": [{"labels": ["quarantine"]}, 7, {"labels": {"host": "h1", "quarantine": "true"},
                                                     "annotations": "x"}]}).encode())
    with urllib.request.urlopen(req, timeout=5) as r:
        answer = json.loads(r.read())
    assert answer["alerts"] == 0 and len(answer["skipped"]) == 3 and "labels is list" in answer["skipped"][0]
    until(lambda: len(rig.events("malformed")) == 3, "the skipped alerts said")
    assert rig.rec.worker.is_alive() and rig._healthy()
    rig.notify("firing", "h3")
    until(lambda: rig.drained() == ["h3"], "a good notification still quarantines")


def test_a_bug_in_the_worker_is_an_error_event_and_the_worker_goes_on(quiet_rig, monkeypatch):
    rig = quiet_rig

    def broken(*a, **kw):
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(rig.rec, "apply_notification", broken)
    rig.notify("firing", "h2")
    until(lambda: rig.events("error"), "the error event")
    assert "a bug: AttributeError" in rig.events("error")[0]["text"]
    assert rig.rec.worker.is_alive() and rig.rec.crashed is None
    monkeypatch.undo()
    rig.notify("firing", "h2")
    until(lambda: rig.drained() == ["h2"], "the worker still works")


def test_slow_or_partial_requests_are_cut_off_by_the_socket_timeout(tmp_path, triton, monkeypatch):
    srv, repo, _ = triton
    monkeypatch.setattr(quarantine.server, "SOCKET_TIMEOUT", 1.0)
    rig = Rig(tmp_path, srv, repo)
    try:
        host, port = rig.listen.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(f"POST /alerts HTTP/1.1\r\nAuthorization: Bearer {rig.token}\r\nContent-Type: "
                      "application/json\r\nContent-Length: 100\r\n\r\n{\"al".encode())
            t0 = time.monotonic()
            try:
                closed = s.recv(100) == b""
            except ConnectionResetError:
                closed = True
            assert closed and time.monotonic() - t0 < 5  # the receiver hung up on it
        assert rig._healthy() and rig.drained() == []
    finally:
        rig.close()


def test_a_full_queue_answers_503_and_holds_no_more(tmp_path):
    """Without a worker to take them, notifications fill the queue: the next is answered 503
    (memory stays bounded), not queued."""
    hosts = [FleetHost("a", ["g"], {"quarantine_budget": 1, "lb": None, "quarantine_check_interval": 1,
                                     "quarantine_gate_timeout": 5, "quarantine_resolve_grace": 0})]
    rec = quarantine.Receiver(hosts, tmp_path, echo=lambda _: None, balancer_of=lambda fh: None)
    server = quarantine.server.BoundedServer(
        ("127.0.0.1", 0), quarantine.handler_for(rec, 5, [quarantine.Caller("operator", "t")]))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        listen = f"127.0.0.1:{server.server_address[1]}"
        answers = [raw(listen, "/alerts", b'{"alerts": []}', bearer("t"))
                   for _ in range(quarantine.receiver.QUEUE_MAX + 1)]
        assert answers == [200] * quarantine.receiver.QUEUE_MAX + [503]
        assert rec.queue.qsize() == quarantine.receiver.QUEUE_MAX
    finally:
        server.shutdown()
        server.server_close()


def test_a_second_token_for_the_webhook_only(tmp_path):
    """With --alertmanager-token-file, Alertmanager's token may post alerts (the audit trail says
    "alertmanager") but neither hold, release nor read the fleet."""
    hosts = [FleetHost("a", ["g"], {"quarantine_budget": 1, "lb": None, "quarantine_check_interval": 0.2,
                                     "quarantine_gate_timeout": 5, "quarantine_resolve_grace": 0})]
    rec = quarantine.Receiver(hosts, tmp_path, echo=lambda _: None, balancer_of=lambda fh: None)
    listen = f"127.0.0.1:{free_port()}"
    callers = [quarantine.Caller("operator", "op"), quarantine.Caller("alertmanager", "am", webhook_only=True)]
    t = threading.Thread(target=quarantine.serve, args=(rec, listen, callers), daemon=True)
    t.start()
    try:
        until(lambda: _get(f"http://{listen}/-/healthy"), "up")
        bad = {"alerts": [{"labels": ["x"]}]}
        assert raw(listen, "/alerts", json.dumps(bad).encode(), bearer("am")) == 200
        assert raw(listen, "/v1/hosts/a/hold", b"{}", bearer("am")) == 401
        assert raw(listen, "/v1/quarantine", headers={"Authorization": "Bearer am"}, method="GET", length=None) == 401
        until(lambda: [e for e in rec.snapshot()["events"] if e["action"] == "malformed"], "the event")
        ev = [e for e in rec.snapshot()["events"] if e["action"] == "malformed"][0]
        assert ev["caller"] == "alertmanager"
        assert raw(listen, "/v1/hosts/zz/release", b"{}", bearer("op")) == 404
    finally:
        rec.stop.set()
        t.join(10)


class FakeAlertmanager:
    """Alertmanager's API on loopback answering whatever ``answer`` holds (bytes)."""

    def __init__(self):
        self.answer = b"[]"
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(outer.answer)

            def log_message(self, *a):
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_an_alertmanager_answer_it_cannot_read_changes_nothing_and_an_empty_list_waits_for_the_grace(quiet_rig):
    """finding 6: a 200 whose JSON is not a list of alerts ({"status":"error"}, a list with a
    malformed alert) had been read as "nothing firing" and returned every host. Now it changes
    nothing and is an error event; an honest empty list (Alertmanager restarted) returns the host
    only after quarantine_resolve_grace."""
    rig = quiet_rig
    am = FakeAlertmanager()
    try:
        am.answer = b'{"status":"error","error":"upstream timeout"}'
        rig.rec.resolve_grace = 3
        rig.rec.alertmanager = am.url
        rig.notify("firing", "h1")
        until(lambda: rig.drained() == ["h1"], "h1 drained")
        until(lambda: rig.events("error"), "the error event")
        assert "not a list of alerts" in rig.events("error")[0]["text"]
        am.answer = b'[{"labels": "x", "status": {"state": "active"}}]'
        time.sleep(1.5)  # several rounds
        assert rig.drained() == ["h1"] and not rig.events("resolved") and not rig.events("gate")
        assert any("not one" in e["text"] for e in rig.events("error"))
        t0 = time.monotonic()
        am.answer = b"[]"
        until(lambda: rig.events("resolved"), "resolved after the grace", timeout=20)
        assert time.monotonic() - t0 >= 2.5
        until(lambda: rig.drained() == [], "h1 back")
    finally:
        rig.rec.alertmanager = ""
        am.close()


def test_each_event_s_times_are_histograms_on_metrics_and_in_quarantine_list(quiet_rig):
    """The alert's fault_seen (the collector's timestamp) starts the event's clock: the drain's
    time since the fault is a histogram on GET /metrics (the token needed) and in `quarantine list`."""
    rig = quiet_rig
    fault = time.time() - 0.5
    body = {"version": "4", "status": "firing", "alerts": [{
        "status": "firing", "labels": {"alertname": "GpuXidCritical", "host": "h1", "quarantine": "true", "xid": "79"},
        "annotations": {"summary": "Xid 79 on h1", "fault_seen": f"{fault:.3f}"},
        "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "fp-h1"}]}
    req = urllib.request.Request(rig.url + "/alerts", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {rig.token}"})
    urllib.request.urlopen(req, timeout=5).close()
    until(lambda: rig.drained() == ["h1"], "h1 drained")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rig.url + "/metrics", timeout=5)
    assert refused.value.code == 401
    req = urllib.request.Request(rig.url + "/metrics", headers={"Authorization": f"Bearer {rig.token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read().decode()
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'tritonfleet_quarantine_event_seconds_count{stage="drained"} 1.0' in text
    assert 'tritonfleet_quarantine_event_seconds_count{stage="alert"} 1.0' in text
    entry = rig.fetch()["hosts"]["h1"]
    assert entry["fault_at"] == pytest.approx(fault, abs=0.001) and entry["drained_at"] - fault >= 0.5
    res = rig.cli("list", str(rig.inventory))
    assert res.returncode == 0 and re.search(r"h1 +quarantined since .*\(fault -> alert [0-9.]+ s, out [0-9.]+ s\)",
                                             res.stdout), res.stdout


def test_the_budget_counts_servers_haproxy_already_has_out(quiet_rig):
    """An operator's hold of h4 (MAINT, not the receiver's) spends the group's budget of one: an
    alert for h1 only alerts."""
    rig = quiet_rig
    rig.hap.command("set server triton/h4 state maint")
    rig.notify("firing", "h1")
    until(lambda: rig.events("over-budget"), "over budget")
    assert rig.drained() == ["h4"] and rig.fetch()["hosts"] == {}
    assert raw(rig.listen, "/v1/hosts/h2/hold", b"{}", bearer(rig.token)) == 409
    # holding the server that is out already takes nothing more out: within the budget
    assert raw(rig.listen, "/v1/hosts/h4/hold", b'{"reason": "operator drain"}', bearer(rig.token)) == 200
    assert list(rig.fetch()["hosts"]) == ["h4"] and rig.drained() == ["h4"]
    res = rig.cli("release", str(rig.inventory), "h4")
    assert res.returncode == 0 and "h4: returned:" in res.stdout, res.stdout + res.stderr
    until(lambda: rig.drained() == ["h1"], "h1 drained once h4 is back")


def test_an_unreadable_balancer_spends_the_budget():
    hosts = fleet([2], [1])
    alerts = {"a": quarantine.FiringAlert("a", "X", "g0-0", "2026-01-01T00:00:01Z")}
    limits = quarantine.limits(list(hosts.values()))
    p = quarantine.plan(alerts, {}, {}, hosts, limits, lambda fh: True, lambda g: None)
    assert p.quarantine == [] and [n for n, _ in p.over_budget] == ["g0-0"]
    p = quarantine.plan(alerts, {}, {}, hosts, limits, lambda fh: True, lambda g: 0)
    assert [n for n, _ in p.quarantine] == ["g0-0"]


def test_a_triton_that_refuses_connections_stays_out_at_once():
    """newcomer-2 #55: the gate had waited its whole timeout (60 s) on a refused connection."""
    from tritonfleet.fleet.quarantine.actions import warm_gate

    fh = FleetHost("h", ["g"], {"health_host": "127.0.0.1", "triton_http_port": free_port()})
    t0 = time.monotonic()
    ok, why = warm_gate(fh, 60)
    assert not ok and "refuses connections" in why and time.monotonic() - t0 < 10


def test_the_token_file_is_required_private_and_not_empty(tmp_path):
    path = tmp_path / "q.token"
    res = tritonfleet("quarantine", "serve", "inventories/prod.py", "--token-file", str(path))
    assert res.returncode == 2 and f"tritonfleet quarantine token --out {path}" in res.stderr, res.stderr
    res = tritonfleet("quarantine", "token", "--out", str(path))
    assert res.returncode == 0 and path.stat().st_mode & 0o777 == 0o600
    token = path.read_text().strip()
    assert len(token) >= 32 and quarantine.read_token(path) == token
    path.chmod(0o640)
    res = tritonfleet("quarantine", "serve", "inventories/prod.py", "--token-file", str(path))
    assert res.returncode == 2 and "readable by others (mode 0640)" in res.stderr
    path.write_text("\n")
    path.chmod(0o600)
    res = tritonfleet("quarantine", "serve", "inventories/prod.py", "--token-file", str(path))
    assert res.returncode == 2 and "empty" in res.stderr
    # newcomer-2 #49: an --alertmanager serve cannot read is refused, not logged every round
    res = tritonfleet("quarantine", "serve", "inventories/prod.py", "--alertmanager", "am/api")
    assert res.returncode == 2 and "expected HOST:PORT or http(s)://HOST:PORT" in res.stderr


def test_status_fails_when_the_receiver_cannot_be_read(quiet_rig, tmp_path):
    """`tritonfleet status` exits 1 (not a warning and 0) when quarantine_url cannot be reached
    or refuses the token."""
    from tritonfleet.cli.fleet import add_quarantine
    from tritonfleet.fleet import probe

    rig = quiet_rig
    wrong = quarantine.write_token(tmp_path / "wrong")
    for url, token in ((f"http://127.0.0.1:{free_port()}", rig.token_file), (rig.url, wrong)):
        hosts = load_hosts(rig.inventory, data={"quarantine_url": url, "quarantine_token_file": str(token)})
        rows = [probe.HostStatus(h, "127.0.0.1", None, reachable=True, unit_state="active") for h in HOSTS]
        assert add_quarantine(hosts, rows) is False


def test_release_of_a_host_not_in_the_inventory_is_a_usage_error(quiet_rig):
    res = quiet_rig.cli("release", str(quiet_rig.inventory), "triton-t4-09")
    assert res.returncode == 2 and "triton-t4-09 is not a host of" in res.stderr


def test_the_unit_carries_the_token_file_and_alertmanager_as_serve_takes_them():
    res = tritonfleet("quarantine", "unit", "inventories/prod.py", "--alertmanager", "127.0.0.1:9093",
                      "--token-file", "/etc/tritonfleet/quarantine.token")
    assert res.returncode == 0, res.stderr
    start = [ln for ln in res.stdout.splitlines() if ln.startswith("ExecStart=")][0]
    assert "--alertmanager=http://127.0.0.1:9093" in start
    assert "--token-file=/etc/tritonfleet/quarantine.token" in start


# ---- any JSON, read by the receiver ----------------------------------------------------------

ALERTISH = st.fixed_dictionaries({"labels": st.one_of(JSON, st.dictionaries(
    st.sampled_from(["alertname", "host", "quarantine"]), st.one_of(st.sampled_from(["a", "true"]), JSON))),
    "status": st.one_of(JSON, st.fixed_dictionaries({"state": st.one_of(st.sampled_from(["active", "x"]), JSON)}))},
    optional={"annotations": JSON, "fingerprint": JSON, "startsAt": JSON})


def _receiver(tmp: Path) -> quarantine.Receiver:
    hosts = [FleetHost("a", ["g"], {"quarantine_budget": 1, "lb": None, "quarantine_check_interval": 1,
                                     "quarantine_gate_timeout": 5, "quarantine_resolve_grace": 60})]
    rec = quarantine.Receiver(hosts, tmp, echo=lambda _: None, balancer_of=lambda fh: None)
    rec.apply_notification({"alerts": [{"status": "firing", "labels": {"alertname": "X", "host": "a",
                                                                        "quarantine": "true"}, "fingerprint": "f"}]})
    return rec


@settings(max_examples=300, deadline=None)
@given(payload=st.one_of(JSON, st.fixed_dictionaries({"alerts": st.one_of(JSON, st.lists(
    st.one_of(JSON, ALERTISH), max_size=4))})))
def test_any_webhook_payload_is_taken_or_refused_never_a_crash(tmp_path_factory, payload):
    rec = _receiver(tmp_path_factory.mktemp("any"))
    try:
        good, skipped = quarantine.webhook_alerts(payload)
    except ValueError:
        return
    rec.apply_notification(payload)  # nothing else than ValueError, ever
    assert len(good) + len(skipped) == len(payload["alerts"])


@settings(max_examples=300, deadline=None)
@given(answer=st.one_of(JSON, st.lists(st.one_of(JSON, ALERTISH), max_size=4)))
def test_no_alertmanager_answer_drops_an_alert_within_the_grace(tmp_path_factory, answer):
    """Whatever Alertmanager answers (any JSON, alerts of any shape), the receiver's alert stays
    within quarantine_resolve_grace, and the answer either counts or is an error event."""
    rec = _receiver(tmp_path_factory.mktemp("am"))
    rec.alertmanager = "http://127.0.0.1:9"
    body = json.dumps(answer).encode()
    with mock.patch("urllib.request.urlopen", side_effect=lambda *a, **kw: io.BytesIO(body)):
        rec.sync_alertmanager()
        rec.sync_alertmanager()
    assert "f" in rec.alerts
    readable = isinstance(answer, list) and all(
        quarantine.planning.alert_shape_error(a, api=True) is None for a in answer)
    assert readable == (rec.noted.get("alertmanager") is None)
