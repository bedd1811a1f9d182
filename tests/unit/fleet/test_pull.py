"""Pull mode on this machine: releases, signed pointers, a host's converge run (through a real
nginx origin and pyinfra's local connector), its Prometheus textfile read by the real node
exporter, the bootstrap script and user-data, and the pull-mode rollout's decisions against
agents that answer from the origin directory (tritonfleet.fleet.pull, .converge, .bootstrap)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tritonfleet.core.errors import UsageError
from tritonfleet.fleet import bootstrap, converge, pull
from tritonfleet_testbed.origin_server import OriginServer, free_port

BIN = Path(sys.executable).parent
DEPLOY = """\
from pyinfra import host
from pyinfra.operations import server
mark = host.data.get("mark_file")
if host.data.get("fail_here"):
    server.shell(name="fail", commands=["echo the deploy fails here >&2; exit 3"])
server.shell(name="mark", commands=[f"echo {host.name} {host.data.get('colour')} > {mark}"])
"""


#: the test deploy's own host data, which the settings check leaves alone (extra_host_data)
EXTRA = ["colour", "mark_file", "fail_here"]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """An operator's repository (one deploy, a model directory, an inventory) as the cwd."""
    r = tmp_path / "repo"
    (r / "deploys").mkdir(parents=True)
    (r / "files" / "model_repository" / "m" / "1").mkdir(parents=True)
    (r / "files" / "model_repository" / "m" / "config.pbtxt").write_text('name: "m"\n')
    (r / "deploys" / "mark.py").write_text(DEPLOY)
    (r / "inventories").mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    (r / "inventories" / "inv.py").write_text(
        "pulled = [\n"
        f"  ('pull-1', {{'ssh_hostname': '10.9.9.1', 'ssh_user': 'ops', 'colour': 'blue', 'mark_file': '{marks}/1', 'extra_host_data': {EXTRA!r}}}),\n"
        f"  ('pull-2', {{'colour': 'red', 'mark_file': '{marks}/2', 'triton_http_port': 8000, 'extra_host_data': {EXTRA!r}}}),\n"
        "]\n")
    monkeypatch.chdir(r)
    return r


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    d = tmp_path_factory.mktemp("key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "release", "-f", str(d / "key")], check=True)
    return d / "key"


HOST_NAMES = ["pull-1", "pull-2", "h1", "h2", "h3", "h4", "h5"]


@pytest.fixture(scope="module")
def host_keys(tmp_path_factory):
    """Each test host's report key, as tritonfleet bootstrap makes them: {host: private key path}."""
    d = tmp_path_factory.mktemp("host-keys")
    return {h: (d / h, pull.make_key(d / h, f"report {h}"))[0] for h in HOST_NAMES}


def _enrol(origin: pull.Origin, host_keys: dict) -> None:
    pull.enrol(origin, {h: Path(f"{k}.pub").read_text().strip() for h, k in host_keys.items()})


def _put_report(origin: pull.Origin, host: str, report: dict, key: Path | None) -> None:
    """A report on the origin as a host writes it: signed with ``key`` (None: unsigned)."""
    pull.write_atomic(origin.report(host), converge.signed_report({"report_key": str(key or "/nonexistent")}, report))


def _report_of(origin: pull.Origin, host: str) -> dict:
    """The payload of a host's report (its signature checked by the tests of Reports)."""
    return json.loads(json.loads(origin.report(host).read_text())["payload"])


def _hosts(repo, **data):
    from tritonfleet.fleet import inventory as fleet

    # by its absolute path: pyinfra keeps an inventory's code by file name for the process
    return fleet.load_inventory(str(repo / "inventories" / "inv.py"), data=data or None)


def _manifest(data: bytes) -> dict:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
        return {"manifest": json.load(t.extractfile(pull.MANIFEST)), "names": sorted(t.getnames())}


def test_a_release_is_its_content_and_holds_no_hosts_data(repo):
    """The same files make the same bytes (one release, published twice); the archive holds no
    host's data (every host may fetch it); each host's entry is what differs from the defaults,
    without how the control machine connects."""
    hosts = _hosts(repo)
    a, sha_a, _ = pull.build_release(hosts, "deploys/mark.py", repo)
    time.sleep(0.01)
    (repo / "deploys" / "mark.py").touch()
    b, sha_b, _ = pull.build_release(hosts, "deploys/mark.py", repo)
    assert a == b and sha_a == sha_b
    got = _manifest(a)
    assert "hosts" not in got["manifest"] and b"blue" not in a and b"red" not in a
    entries, _ = pull.host_entries(hosts, repo)
    entry = entries["pull-1"]
    assert entry["groups"] == ["pulled"]
    assert entry["data"]["colour"] == "blue"
    assert not [k for k in entry["data"] if k.startswith(("ssh_", "_"))]
    assert "triton_http_port" not in entries["pull-2"]["data"]  # the default value
    assert "repo/deploys/mark.py" in got["names"] and "repo/files/model_repository/m/config.pbtxt" in got["names"]
    assert not [n for n in got["names"] if n.startswith("repo/inventories")]
    # another value is the same release: the data travels in each host's pointer
    _, sha_c, _ = pull.build_release(_hosts(repo, colour="green"), "deploys/mark.py", repo)
    assert sha_c == sha_a


def test_image_archives_travel_as_blobs_and_outside_models_are_refused(repo, tmp_path):
    archive = tmp_path / "img.tar.gz"
    archive.write_bytes(b"image bytes")
    hosts = _hosts(repo, image_archives={"nvcr.io/x:1": str(archive)})
    (tmp_path / "origin").mkdir()
    origin = pull.Origin(tmp_path / "origin")
    sha = pull.publish_release(origin, hosts, "deploys/mark.py", repo)
    ref = pull.host_entries(hosts, repo)[0]["pull-1"]["data"]["image_archives"]
    blob = pull.sha256_file(archive)
    assert ref == {"nvcr.io/x:1": {"blob": blob, "name": "img.tar.gz", "size": 11}}
    assert origin.blob(blob).read_bytes() == b"image bytes"
    with pytest.raises(UsageError, match="outside the repository"):
        pull.build_release(_hosts(repo, model_repository=str(tmp_path)), "deploys/mark.py", repo)
    with pytest.raises(UsageError, match="--include"):
        pull.build_release(_hosts(repo, model_repository="elsewhere/models"), "deploys/mark.py", repo)


def test_signatures_verify_only_for_the_payload_and_the_key(key, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    signers = tmp_path / "signers"
    signers.write_text(pull.allowed_signers(key))
    sigs = pull.sign(key, {"a": b'{"release": "1"}', "b": b'{"release": "2"}'}, batch=1)
    assert pull.verify(signers, b'{"release": "1"}', sigs["a"]) == ""
    assert pull.verify(signers, b'{"release": "2"}', sigs["a"]) != ""  # another payload
    wrong = pull.sign(other, {"a": b'{"release": "1"}'})
    assert pull.verify(signers, b'{"release": "1"}', wrong["a"]) != ""  # another key


# --- a host's run, through a real nginx origin ---------------------------------------------------

@pytest.fixture
def served(repo, tmp_path, key, host_keys, monkeypatch):
    origin_dir = tmp_path / "origin"
    origin_dir.mkdir()
    srv = OriginServer(origin_dir, tmp_path / "nginx")
    origin = pull.Origin(origin_dir, srv.url)
    _enrol(origin, host_keys)
    signers = tmp_path / "signers"
    signers.write_text(pull.allowed_signers(key))
    state = tmp_path / "state"
    cfg = {"format": 1, "host": "pull-1", "origin": srv.url, "reports": f"{srv.url}/reports", "signers": str(signers),
           "release": None, "min_generation": 0, "report_key": str(host_keys["pull-1"]), "poll_interval": 5,
           "converge_interval": 600, "textfile": str(tmp_path / "tf" / "t.prom")}
    (tmp_path / "pull.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(converge, "STATE_DIR", state)
    yield origin, tmp_path / "pull.json", tmp_path
    srv.stop()


def _data(repo, **data) -> dict:
    return pull.host_entries(_hosts(repo, **data), repo)[0]


def _converge(cfg: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITONFLEET_PULL_STATE=str(tmp / "state"), PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run([str(BIN / "tritonfleet"), "converge", "--config", str(cfg), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_host_converges_to_its_pointer_and_reports_it(served, repo, key):
    origin, cfg, tmp = served
    sha = pull.publish_release(origin, _hosts(repo), "deploys/mark.py", repo)
    gen = pull.publish_desired(origin, key, {"pull-1": sha}, "t", _data(repo))
    res = _converge(cfg, tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    # the deploy ran under the host's own name with its own data
    assert (tmp / "marks" / "1").read_text() == "pull-1 blue\n"
    rep = _report_of(origin, "pull-1")
    assert (rep["host"], rep["release"], rep["generation"], rep["result"], rep["error"]) == \
        ("pull-1", sha, gen, "ok", "")
    assert rep["changed"] == 1
    state = json.loads((tmp / "state" / "state.json").read_text())
    assert state["release"] == sha and state["result"] == "ok"
    assert f'tritonfleet_pull_release_info{{release="{sha[:12]}",result="ok"' in (tmp / "tf" / "t.prom").read_text()
    # nothing due: no run, no report
    (tmp / "marks" / "1").unlink()
    before = origin.report("pull-1").stat().st_mtime_ns
    assert _converge(cfg, tmp).returncode == 0
    assert not (tmp / "marks" / "1").exists() and origin.report("pull-1").stat().st_mtime_ns == before
    # a new generation of the same release is a run (a rollback re-published it)
    gen2 = pull.publish_desired(origin, key, {"pull-1": sha}, "t", _data(repo))
    assert _converge(cfg, tmp).returncode == 0
    assert (tmp / "marks" / "1").exists() and _report_of(origin, "pull-1")["generation"] == gen2


def test_a_host_refuses_what_was_not_signed_for_it(served, repo, key, tmp_path):
    origin, cfg, tmp = served
    sha = pull.publish_release(origin, _hosts(repo), "deploys/mark.py", repo)
    gen = pull.publish_desired(origin, key, {"pull-1": sha, "pull-2": sha}, "t", _data(repo))
    assert _converge(cfg, tmp).returncode == 0
    good = origin.pointer("pull-1").read_bytes()
    # another host's pointer served as this host's
    shutil.copy(origin.pointer("pull-2"), origin.pointer("pull-1"))
    res = _converge(cfg, tmp)
    assert res.returncode == 1
    rep = _report_of(origin, "pull-1")
    assert rep["result"] == "refused" and "names host 'pull-2'" in rep["error"]
    # a payload changed after signing
    outer = json.loads(good)
    outer["payload"] = outer["payload"].replace(sha, "0" * 64)
    origin.pointer("pull-1").write_text(json.dumps(outer))
    assert _converge(cfg, tmp).returncode == 1
    assert "signature does not verify" in _report_of(origin, "pull-1")["error"]
    # an older pointer served again
    pull.publish_desired(origin, key, {"pull-1": sha}, "t", _data(repo))
    assert _converge(cfg, tmp).returncode == 0
    origin.pointer("pull-1").write_bytes(good)
    assert _converge(cfg, tmp).returncode == 1
    assert f"generation {gen}, older" in _report_of(origin, "pull-1")["error"]
    assert json.loads((tmp / "state" / "state.json").read_text())["release"] == sha  # it stays on what it ran


def test_a_release_whose_bytes_differ_is_refused_and_a_failing_deploy_reported(served, repo, key):
    origin, cfg, tmp = served
    sha = pull.publish_release(origin, _hosts(repo), "deploys/mark.py", repo)
    data = origin.release(sha).read_bytes()
    origin.release(sha).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    pull.publish_desired(origin, key, {"pull-1": sha}, "t", _data(repo))
    assert _converge(cfg, tmp).returncode == 1
    rep = _report_of(origin, "pull-1")
    assert rep["result"] == "refused" and "not the release" in rep["error"]
    assert not (tmp / "marks" / "1").exists()
    origin.release(sha).write_bytes(data)
    bad = pull.publish_release(origin, _hosts(repo, fail_here=True), "deploys/mark.py", repo)
    assert bad == sha  # the same release: the data that fails travels in the host's own pointer
    pull.publish_desired(origin, key, {"pull-1": bad}, "t", _data(repo, fail_here=True))
    assert _converge(cfg, tmp).returncode == 1
    rep = _report_of(origin, "pull-1")
    assert rep["result"] == "failed" and rep["release"] == bad and rep["error"]
    assert "tritonfleet_pull_last_run_success 0" in (tmp / "tf" / "t.prom").read_text()


def test_the_textfile_is_what_the_node_exporter_reads(tmp_path):
    """The real prometheus-node-exporter's textfile collector reads the file without an error and
    serves each metric with its value."""
    exe = shutil.which("prometheus-node-exporter")
    assert exe, "prometheus-node-exporter is not installed (bash scripts/setup installs it)"
    d = tmp_path / "tf"
    d.mkdir()
    state = {"release": "ab" * 32, "generation": 7, "result": "failed", "finished_ts": 1800000000.5,
             "checked_ts": 1800000100.0, "seconds": 12.5}
    (d / "tritonfleet_pull.prom").write_text(converge.textfile(state))
    port = free_port()
    p = subprocess.Popen([exe, "--collector.disable-defaults", "--collector.textfile",
                          f"--collector.textfile.directory={d}", f"--web.listen-address=127.0.0.1:{port}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("node exporter did not answer")
    finally:
        p.terminate()
        p.wait(10)
    assert "node_textfile_scrape_error 0" in text
    assert "tritonfleet_pull_last_run_success 0" in text
    assert "tritonfleet_pull_last_run_timestamp_seconds 1.8000000005e+09" in text
    assert f'tritonfleet_pull_release_info{{generation="7",release="{"ab" * 6}",result="failed"}} 1' in text


# --- the bootstrap --------------------------------------------------------------------------------

def test_the_bootstrap_script_and_its_user_data(key, tmp_path):
    cfg = {"format": 1, "host": "h-1", "origin": "http://10.0.0.1:8090", "reports": "http://10.0.0.1:8090/reports",
           "signers": bootstrap.SIGNERS, "release": None, "poll_interval": 60, "converge_interval": 1800,
           "textfile": ""}
    signers = pull.allowed_signers(key)
    text = bootstrap.script(cfg, "f" * 64, signers)
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert f'echo "{"f" * 64}  $tmp/requirements.txt" | sha256sum -c --quiet -' in text
    assert "--require-hashes --no-deps" in text and signers.strip() in text
    assert "--trusted-host 10.0.0.1:8090 " in text  # plain HTTP: integrity from the hashes alone
    # the config the script writes is the host's, byte for byte JSON
    body = text.split(f"cat > {bootstrap.CONFIG}.tmp <<'TRITONFLEET_EOF'\n", 1)[1].split("\nTRITONFLEET_EOF", 1)[0]
    assert json.loads(body) == cfg
    ud = bootstrap.user_data("h-1", text)
    assert ud.startswith("#cloud-config\n")
    doc = yaml.safe_load(ud)
    (f,) = doc["write_files"]
    assert f["content"] == text and f["permissions"] == "0700"
    assert doc["runcmd"] == [["sh", f["path"]]]


def test_the_agent_is_pinned_file_by_file(tmp_path, monkeypatch):
    """dist/requirements.txt names every distribution tritonfleet needs at the version installed
    here, with the sha256 of the file on the origin; a wheelhouse that lacks one is refused,
    naming the pip download that fills it."""
    closure = bootstrap.runtime_closure()
    assert {"pyinfra", "paramiko", "gevent", "jinja2", "tritonclient", "tritonfleet"} <= set(closure)
    assert "pytest" not in closure and "hypothesis" not in closure  # the test extra is not followed
    small = {"tritonfleet": "0.1.0", "six": closure["six"]}
    monkeypatch.setattr(bootstrap, "runtime_closure", lambda: small)
    wh = tmp_path / "wh"
    wh.mkdir()
    fake_wheel = tmp_path / "tritonfleet-0.1.0-py3-none-any.whl"
    fake_wheel.write_bytes(b"wheel")
    (tmp_path / "o").mkdir()
    origin = pull.Origin(tmp_path / "o")
    with pytest.raises(UsageError, match=f"pip download .*six=={closure['six']}"):
        bootstrap.publish_agent(origin, wh, fake_wheel)
    other = tmp_path / "tritonfleet-0.0.9-py3-none-any.whl"
    other.write_bytes(b"old")
    with pytest.raises(UsageError, match="not tritonfleet 0.1.0's wheel"):
        bootstrap.publish_agent(origin, wh, other)
    six = wh / f"six-{closure['six']}-py2.py3-none-any.whl"
    six.write_bytes(b"six wheel")
    sha = bootstrap.publish_agent(origin, wh, fake_wheel)
    reqs = (tmp_path / "o" / "dist" / "requirements.txt").read_bytes()
    assert pull.hashlib.sha256(reqs).hexdigest() == sha
    lines = [ln for ln in reqs.decode().splitlines() if not ln.startswith("#")]
    assert lines == [f"six=={closure['six']} --hash=sha256:{pull.sha256_file(six)}",
                     f"tritonfleet==0.1.0 --hash=sha256:{pull.sha256_file(fake_wheel)}"]
    index = (tmp_path / "o" / "dist" / "wheels" / "index.html").read_text()
    assert six.name in index and fake_wheel.name in index


# --- the pull-mode rollout ------------------------------------------------------------------------

class Agents:
    """Hosts that follow their pointers on the origin directory and report, as tritonfleet
    converge does: ``behaviour(host, release)`` -> "ok", "failed" or "silent"."""

    def __init__(self, origin: pull.Origin, hosts: list[str], behaviour, initial: str | None, keys: dict):
        self.origin, self.hosts, self.behaviour, self.keys = origin, hosts, behaviour, keys
        self.ran: dict[str, list[str]] = {h: [] for h in hosts}
        self.stop = threading.Event()
        # what they ran before the rollout: the pointers already there
        self.gen = {h: (pull.read_pointer(origin.pointer(h)) or {}).get("generation", 0) for h in hosts}
        if initial:
            for h in hosts:
                self._report(h, initial, 0, "ok")
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def _report(self, host, release, gen, result):
        _put_report(self.origin, host, {"host": host, "release": release, "generation": gen, "result": result,
                                        "changed": 1, "error": "" if result == "ok" else "pre-flight failed",
                                        "finished": "2030-01-01T00:00:00Z"}, self.keys[host])

    def loop(self):
        while not self.stop.is_set():
            for h in self.hosts:
                ptr = pull.read_pointer(self.origin.pointer(h))
                if ptr and ptr["generation"] > self.gen[h]:
                    self.gen[h] = ptr["generation"]
                    how = self.behaviour(h, ptr["release"])
                    self.ran[h].append(ptr["release"])
                    if how != "silent":
                        self._report(h, ptr["release"], ptr["generation"], how)
            time.sleep(0.02)


def _rollout_repo(repo, n):
    hosts = ", ".join(f"('h{i}', {{'mark_file': '/dev/null', 'extra_host_data': {EXTRA!r}}})" for i in range(1, n + 1))
    (repo / "inventories" / "many.py").write_text(f"pulled = [{hosts}]\n")


OLD = "0123456789abcdef" * 4  # the release the hosts ran before the rollout


def _run(repo, key, host_keys, tmp_path, behaviour, n=5, initial=OLD, **kw):
    _rollout_repo(repo, n)
    (tmp_path / "origin").mkdir(exist_ok=True)
    origin = pull.Origin(tmp_path / "origin")
    _enrol(origin, host_keys)
    names = [f"h{i}" for i in range(1, n + 1)]
    if initial:
        pull.publish_desired(origin, key, dict.fromkeys(names, initial), "before",
                             {h: {"groups": ["pulled"], "data": {"was": h}} for h in names})
    agents = Agents(origin, names, behaviour, initial, host_keys)
    lines = []
    try:
        report = pull.rollout(str(repo / "inventories" / "many.py"), "deploys/mark.py", origin, key, echo=lines.append, poll=0.05,
                                 **kw)
    finally:
        agents.stop.set()
    return report, agents, {r.host: r for r in report.hosts}, lines


def test_rollout_canary_then_batches_all_on_the_new_release(repo, key, host_keys, tmp_path):
    report, agents, res, _ = _run(repo, key, host_keys, tmp_path, lambda h, r: "ok", batch="2", timeout=20)
    assert report.ok and report.batches == [["h1"], ["h2", "h3"], ["h4", "h5"]]
    new = pull.read_pointer(agents.origin.pointer("h1"))["release"]
    assert all(agents.ran[h] == [new] for h in agents.hosts)
    assert [res[h].batch for h in agents.hosts] == [1, 2, 2, 3, 3]
    assert all(res[h].result == "updated" and res[h].before == OLD[:12] and res[h].after == new[:12] for h in res)
    events = [json.loads(x)["event"] for x in (Path(report.log_dir) / "journal.jsonl").read_text().splitlines()]
    assert events == ["start", "before", "batch", "batch-done", "batch", "batch-done", "batch", "batch-done", "end"]


def test_rollout_halts_on_a_failed_canary_and_rolls_it_back(repo, key, host_keys, tmp_path):
    report, agents, res, lines = _run(repo, key, host_keys, tmp_path, lambda h, r: "ok" if r == OLD else "failed",
                                      batch="2", timeout=20)
    assert not report.ok and "more than --max-fail 0" in report.halted and "4 host(s) not touched" in report.halted
    new = agents.ran["h1"][0]
    assert agents.ran["h1"] == [new, OLD]  # failed, then pointed back
    assert res["h1"].result == "rolled back" and "pre-flight failed" in res["h1"].detail
    assert all(agents.ran[h] == [] and res[h].result == "not touched" for h in ("h2", "h3", "h4", "h5"))
    assert all(pull.read_pointer(agents.origin.pointer(h))["release"] == OLD for h in agents.hosts)


def test_rollout_failure_budget_silent_hosts_and_hosts_that_never_reported(repo, key, host_keys, tmp_path):
    def behaviour(h, r):
        return "silent" if h == "h3" and r != OLD else "ok"

    report, agents, res, _ = _run(repo, key, host_keys, tmp_path, behaviour, batch="2", timeout=1, max_fail=1)
    assert res["h3"].result == "rolled back" and "no report of release" in res["h3"].detail
    assert report.halted == "" and not report.ok  # within the budget: every batch ran, h3 is not on it
    assert all(res[h].result == "updated" for h in ("h1", "h2", "h4", "h5"))
    # a host that never reported is not touched, and counts against the budget before the start
    (tmp_path / "b").mkdir()
    report, agents, res, _ = _run(repo, key, host_keys, tmp_path / "b", lambda h, r: "ok", initial=None, batch="2", timeout=1)
    assert res["h1"].result == "unreachable" and "never reported" in report.halted
    assert all(a == [] for a in agents.ran.values())


def test_one_publisher_at_a_time(tmp_path):
    origin = pull.Origin(tmp_path)
    with origin.lock("first"), pytest.raises(pull.PullError, match="first, pid"), origin.lock("second"):
        pass


def test_status_reads_the_reports(repo, key, host_keys, tmp_path):
    (tmp_path / "origin").mkdir()
    origin = pull.Origin(tmp_path / "origin")
    _enrol(origin, host_keys)
    hosts = _hosts(repo)
    pull.publish_desired(origin, key, {"pull-1": "a" * 64, "pull-2": "b" * 64}, "t")
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60))
    _put_report(origin, "pull-1", {"host": "pull-1", "release": "a" * 64, "result": "ok", "finished": stamp},
                host_keys["pull-1"])
    rows = {r["host"]: r for r in pull.status(hosts, origin, now)}
    assert rows["pull-1"]["drift"] == [] and 55 <= rows["pull-1"]["age_seconds"] <= 65
    assert rows["pull-2"]["drift"] == ["no report (not converging itself: bootstrap it)"]
    rows = {r["host"]: r for r in pull.status(hosts, origin, now + 10_000)}
    assert "no run for" in rows["pull-1"]["drift"][0]
