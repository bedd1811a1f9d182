"""Pull mode on this machine: releases, signed pointers, a host's converge run (through a real
nginx origin and pyinfra's local connector), its Prometheus textfile read by the real node
exporter, the bootstrap script and user-data, and the pull-mode rollout's decisions against
agents that answer from the origin directory (tritonfleet.fleet.pull: the control side, .host_fetch and
.host_run, .bootstrap)."""

from __future__ import annotations

import gzip
import hashlib
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet.core.errors import UsageError
from tritonfleet.fleet.pull import bootstrap, host_fetch, host_run
from tritonfleet.fleet.pull.origin import (
    HOST_SIGNERS,
    MANIFEST,
    MAX_SMALL,
    SIGNERS_DOC,
    SIGNERS_NAMESPACE,
    PullError,
    PullSite,
    sha256_file,
    write_atomic,
)
from tritonfleet.fleet.pull.release import build_release, host_entries, publish_release
from tritonfleet.fleet.pull.reports import Reports
from tritonfleet.fleet.pull.rollout import _PullRun, rollout
from tritonfleet.fleet.pull.signing import (
    allowed_signers,
    enrol,
    host_signers,
    make_key,
    publish_desired,
    read_pointer,
    refresh,
    rotate_key,
    sign,
    verify,
)
from tritonfleet.fleet.pull.status import status
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
    return {h: (d / h, make_key(d / h, f"report {h}"))[0] for h in HOST_NAMES}


def _enrol(origin: PullSite, host_keys: dict) -> None:
    enrol(origin, {h: Path(f"{k}.pub").read_text().strip() for h, k in host_keys.items()})


def _put_report(origin: PullSite, host: str, report: dict, key: Path | None) -> None:
    """A report on the origin as a host writes it: signed with ``key`` (None: unsigned)."""
    write_atomic(origin.report(host), host_run.signed_report({"report_key": str(key or "/nonexistent")}, report))


def _report_of(origin: PullSite, host: str) -> dict:
    """The payload of a host's report (its signature checked by the tests of Reports)."""
    return json.loads(json.loads(origin.report(host).read_text())["payload"])


def _hosts(repo, **data):
    from tritonfleet.inventory import roster

    # by its absolute path: pyinfra keeps an inventory's code by file name for the process
    return roster.load_inventory(str(repo / "inventories" / "inv.py"), data=data or None)


def _manifest(data: bytes) -> dict:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
        return {"manifest": json.load(t.extractfile(MANIFEST)), "names": sorted(t.getnames())}


def test_a_release_is_its_content_and_holds_no_hosts_data(repo):
    """The same files make the same bytes (one release, published twice); the archive holds no
    host's data (every host may fetch it); each host's entry is what differs from the defaults,
    without how the control machine connects."""
    hosts = _hosts(repo)
    a, sha_a, _ = build_release(hosts, "deploys/mark.py", repo)
    time.sleep(0.01)
    (repo / "deploys" / "mark.py").touch()
    b, sha_b, _ = build_release(hosts, "deploys/mark.py", repo)
    assert a == b and sha_a == sha_b
    got = _manifest(a)
    assert "hosts" not in got["manifest"] and b"blue" not in a and b"red" not in a
    entries, _ = host_entries(hosts, repo)
    entry = entries["pull-1"]
    assert entry["groups"] == ["pulled"]
    assert entry["data"]["colour"] == "blue"
    assert not [k for k in entry["data"] if k.startswith(("ssh_", "_"))]
    assert "triton_http_port" not in entries["pull-2"]["data"]  # the default value
    assert "repo/deploys/mark.py" in got["names"] and "repo/files/model_repository/m/config.pbtxt" in got["names"]
    assert not [n for n in got["names"] if n.startswith("repo/inventories")]
    # another value is the same release: the data travels in each host's pointer
    _, sha_c, _ = build_release(_hosts(repo, colour="green"), "deploys/mark.py", repo)
    assert sha_c == sha_a


def test_image_archives_travel_as_blobs_and_outside_models_are_refused(repo, tmp_path):
    archive = tmp_path / "img.tar.gz"
    archive.write_bytes(b"image bytes")
    hosts = _hosts(repo, image_archives={"nvcr.io/x:1": str(archive)})
    (tmp_path / "origin").mkdir()
    origin = PullSite(tmp_path / "origin")
    publish_release(origin, hosts, "deploys/mark.py", repo)
    ref = host_entries(hosts, repo)[0]["pull-1"]["data"]["image_archives"]
    blob = sha256_file(archive)
    assert ref == {"nvcr.io/x:1": {"blob": blob, "name": "img.tar.gz", "size": 11}}
    assert origin.blob(blob).read_bytes() == b"image bytes"
    with pytest.raises(UsageError, match="outside the repository"):
        build_release(_hosts(repo, model_repository=str(tmp_path)), "deploys/mark.py", repo)
    with pytest.raises(UsageError, match="--include"):
        build_release(_hosts(repo, model_repository="elsewhere/models"), "deploys/mark.py", repo)


def test_signatures_verify_only_for_the_payload_and_the_key(key, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    signers = tmp_path / "signers"
    signers.write_text(allowed_signers(key))
    sigs = sign(key, {"a": b'{"release": "1"}', "b": b'{"release": "2"}'}, batch=1)
    assert verify(signers, b'{"release": "1"}', sigs["a"]) == ""
    assert verify(signers, b'{"release": "2"}', sigs["a"]) != ""  # another payload
    wrong = sign(other, {"a": b'{"release": "1"}'})
    assert verify(signers, b'{"release": "1"}', wrong["a"]) != ""  # another key


# --- a host's run, through a real nginx origin ---------------------------------------------------

@pytest.fixture
def served(repo, tmp_path, key, host_keys, monkeypatch):
    origin_dir = tmp_path / "origin"
    origin_dir.mkdir()
    srv = OriginServer(origin_dir, tmp_path / "nginx")
    origin = PullSite(origin_dir, srv.url)
    _enrol(origin, host_keys)
    signers = tmp_path / "signers"
    signers.write_text(allowed_signers(key))
    state = tmp_path / "state"
    cfg = {"format": 1, "host": "pull-1", "origin": srv.url, "reports": f"{srv.url}/reports", "signers": str(signers),
           "release": None, "min_generation": 0, "report_key": str(host_keys["pull-1"]), "poll_interval": 5,
           "converge_interval": 600, "textfile": str(tmp_path / "tf" / "t.prom")}
    (tmp_path / "pull.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(host_fetch, "STATE_DIR", state)
    yield origin, tmp_path / "pull.json", tmp_path
    srv.stop()


def _data(repo, **data) -> dict:
    return host_entries(_hosts(repo, **data), repo)[0]


def _converge(cfg: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITONFLEET_PULL_STATE=str(tmp / "state"), PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run([str(BIN / "tritonfleet"), "converge", "--config", str(cfg), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_host_converges_to_its_pointer_and_reports_it(served, repo, key):
    origin, cfg, tmp = served
    sha = publish_release(origin, _hosts(repo), "deploys/mark.py", repo)
    gen = publish_desired(origin, key, {"pull-1": sha}, "t", _data(repo))
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
    gen2 = publish_desired(origin, key, {"pull-1": sha}, "t", _data(repo))
    assert _converge(cfg, tmp).returncode == 0
    assert (tmp / "marks" / "1").exists() and _report_of(origin, "pull-1")["generation"] == gen2


def test_a_host_refuses_what_was_not_signed_for_it(served, repo, key, tmp_path):
    origin, cfg, tmp = served
    sha = publish_release(origin, _hosts(repo), "deploys/mark.py", repo)
    gen = publish_desired(origin, key, {"pull-1": sha, "pull-2": sha}, "t", _data(repo))
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
    publish_desired(origin, key, {"pull-1": sha}, "t", _data(repo))
    assert _converge(cfg, tmp).returncode == 0
    origin.pointer("pull-1").write_bytes(good)
    assert _converge(cfg, tmp).returncode == 1
    assert f"generation {gen}, older" in _report_of(origin, "pull-1")["error"]
    assert json.loads((tmp / "state" / "state.json").read_text())["release"] == sha  # it stays on what it ran


def test_a_release_whose_bytes_differ_is_refused_and_a_failing_deploy_reported(served, repo, key):
    origin, cfg, tmp = served
    sha = publish_release(origin, _hosts(repo), "deploys/mark.py", repo)
    data = origin.release(sha).read_bytes()
    origin.release(sha).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    publish_desired(origin, key, {"pull-1": sha}, "t", _data(repo))
    assert _converge(cfg, tmp).returncode == 1
    rep = _report_of(origin, "pull-1")
    assert rep["result"] == "refused" and "not the release" in rep["error"]
    assert not (tmp / "marks" / "1").exists()
    origin.release(sha).write_bytes(data)
    bad = publish_release(origin, _hosts(repo, fail_here=True), "deploys/mark.py", repo)
    assert bad == sha  # the same release: the data that fails travels in the host's own pointer
    publish_desired(origin, key, {"pull-1": bad}, "t", _data(repo, fail_here=True))
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
    (d / "tritonfleet_pull.prom").write_text(host_run.textfile(state))
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
    signers = allowed_signers(key)
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
    origin = PullSite(tmp_path / "o")
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
    assert hashlib.sha256(reqs).hexdigest() == sha
    lines = [ln for ln in reqs.decode().splitlines() if not ln.startswith("#")]
    assert lines == [f"six=={closure['six']} --hash=sha256:{sha256_file(six)}",
                     f"tritonfleet==0.1.0 --hash=sha256:{sha256_file(fake_wheel)}"]
    index = (tmp_path / "o" / "dist" / "wheels" / "index.html").read_text()
    assert six.name in index and fake_wheel.name in index


# --- the pull-mode rollout ------------------------------------------------------------------------

class Agents:
    """Hosts that follow their pointers on the origin directory and report, as tritonfleet
    converge does: ``behaviour(host, release)`` -> "ok", "failed" or "silent"."""

    def __init__(self, origin: PullSite, hosts: list[str], behaviour, initial: str | None, keys: dict):
        self.origin, self.hosts, self.behaviour, self.keys = origin, hosts, behaviour, keys
        self.ran: dict[str, list[str]] = {h: [] for h in hosts}
        self.stop = threading.Event()
        # what they ran before the rollout: the pointers already there
        self.gen = {h: (read_pointer(origin.pointer(h)) or {}).get("generation", 0) for h in hosts}
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
                ptr = read_pointer(self.origin.pointer(h))
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
    origin = PullSite(tmp_path / "origin")
    _enrol(origin, host_keys)
    names = [f"h{i}" for i in range(1, n + 1)]
    if initial:
        publish_desired(origin, key, dict.fromkeys(names, initial), "before",
                             {h: {"groups": ["pulled"], "data": {"was": h}} for h in names})
    agents = Agents(origin, names, behaviour, initial, host_keys)
    lines = []
    try:
        report = rollout(str(repo / "inventories" / "many.py"), "deploys/mark.py", origin, key, echo=lines.append, poll=0.05,
                                 **kw)
    finally:
        agents.stop.set()
    return report, agents, {r.host: r for r in report.hosts}, lines


def test_rollout_canary_then_batches_all_on_the_new_release(repo, key, host_keys, tmp_path):
    report, agents, res, _ = _run(repo, key, host_keys, tmp_path, lambda h, r: "ok", batch="2", timeout=20)
    assert report.ok and report.batches == [["h1"], ["h2", "h3"], ["h4", "h5"]]
    new = read_pointer(agents.origin.pointer("h1"))["release"]
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
    assert all(read_pointer(agents.origin.pointer(h))["release"] == OLD for h in agents.hosts)


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
    origin = PullSite(tmp_path)
    with origin.lock("first"), pytest.raises(PullError, match="first, pid"), origin.lock("second"):
        pass


def test_status_reads_the_reports(repo, key, host_keys, tmp_path):
    (tmp_path / "origin").mkdir()
    origin = PullSite(tmp_path / "origin")
    _enrol(origin, host_keys)
    hosts = _hosts(repo)
    publish_desired(origin, key, {"pull-1": "a" * 64, "pull-2": "b" * 64}, "t")
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60))
    _put_report(origin, "pull-1", {"host": "pull-1", "release": "a" * 64, "result": "ok", "finished": stamp},
                host_keys["pull-1"])
    rows = {r["host"]: r for r in status(hosts, origin, now)}
    assert rows["pull-1"]["drift"] == [] and 55 <= rows["pull-1"]["age_seconds"] <= 65
    assert rows["pull-2"]["drift"] == ["no report (not converging itself: bootstrap it)"]
    rows = {r["host"]: r for r in status(hosts, origin, now + 10_000)}
    assert "no run for" in rows["pull-1"]["drift"][0]


# --- authenticated both ways (security review 2: findings 1, 3, 4, 12, 16) ------------------------

NEW = "fedcba9876543210" * 4  # the release a rollout moves to
GOOD = {"release": NEW, "generation": 0, "result": "ok", "error": "", "changed": 1, "finished": "2030-01-01T00:00:00Z"}


def _pull_run(origin: PullSite, key: Path, hosts: list[str], wait: float = 0.3):
    from tritonfleet.fleet.rollout.journal import Journal
    from tritonfleet.fleet.rollout.report import HostResult, Report

    report = Report("inv", "deploys/mark.py", [hosts], [HostResult(h) for h in hosts])
    return _PullRun(origin, key, NEW, "t", report, Journal(origin.root / "journal.jsonl"), Reports(origin),
                         lambda _: None, wait, 0.01, 10, 1)


@pytest.fixture
def bare_origin(tmp_path, host_keys):
    (tmp_path / "origin").mkdir()
    origin = PullSite(tmp_path / "origin")
    _enrol(origin, host_keys)
    return origin


def test_finding_1_a_reported_release_is_never_signed_and_never_a_path(bare_origin, key, host_keys, tmp_path,
                                                                        monkeypatch):
    """The traversal of finding 1: h1 has no pointer, its report (forged unsigned, or even signed by
    h1 itself) names "../../x" and failed. The rollback signs nothing for it; and a pointer that
    names a non-hex release is refused by the host before any path is built."""
    origin = bare_origin
    forged = {**GOOD, "host": "h1", "release": "../../home-mallory/rel", "result": "failed"}
    for signed_by in (None, host_keys["h1"]):
        _put_report(origin, "h1", forged, signed_by)
        run = _pull_run(origin, key, ["h1"])
        run.before()
        assert run.was["h1"] is None
        run.roll_back(["h1"], 1)
        assert not origin.pointer("h1").exists()
        assert "nothing to roll back to" in run.results["h1"].detail
    # a well-formed signed report of another release is not where a host goes back either
    _put_report(origin, "h1", {**GOOD, "host": "h1", "release": "b" * 64}, host_keys["h1"])
    run = _pull_run(origin, key, ["h1"])
    run.before()
    assert run.was["h1"] is None and run.results["h1"].before == "b" * 12
    run.roll_back(["h1"], 1)
    assert not origin.pointer("h1").exists()
    with pytest.raises(PullError, match="not signed"):
        publish_desired(origin, key, {"h1": "../../x"}, "t")
    # the host: a pointer signed with the real key but naming a path is refused, no path built
    payload = json.dumps({"host": "h1", "release": "../../x", "generation": 5, "expires": "2099-01-01T00:00:00Z"})
    body = json.dumps({"payload": payload, "signature": sign(key, {"p": payload.encode()})["p"]}).encode()
    signers = tmp_path / "signers"
    signers.write_text(allowed_signers(key))
    monkeypatch.setattr(host_fetch, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(host_fetch, "fetch", lambda url, headers=None, limit=0: (200, body, {}))
    cfg = {"host": "h1", "origin": "http://127.0.0.1:1", "signers": str(signers)}
    with pytest.raises(host_fetch.Refused, match="not a release id"):
        host_fetch.desired(cfg, {})
    with pytest.raises(host_fetch.Refused, match="not a release id"):
        host_fetch.unpack(cfg, "../../x")
    assert not (tmp_path / "state" / "releases").exists()


def test_a_rollback_of_new_data_alone_restores_the_hosts_earlier_data(bare_origin, key):
    """The same release with other inventory data (the release holds none): a failed host goes
    back to its own earlier pointer's data."""
    origin = bare_origin
    publish_desired(origin, key, {"h1": NEW}, "t", {"h1": {"groups": [], "data": {"branch": 550}}})
    run = _pull_run(origin, key, ["h1"])
    run.entries = {"h1": {"groups": [], "data": {"branch": 999}}}
    run.before()
    publish_desired(origin, key, {"h1": NEW}, "t", run.entries)
    run.roll_back(["h1"], 1)
    assert read_pointer(origin.pointer("h1"))["host_data"] == {"groups": [], "data": {"branch": 550}}


def test_forged_unsigned_and_other_host_signed_reports_fail_that_host(bare_origin, key, host_keys):
    """Finding 3: a report counts only when its own host's key signed it and it is well formed;
    anything else is that host's failure with the reason, never a pass, never a crash."""
    origin = bare_origin
    hosts = ["h1", "h2", "h3", "h4", "h5"]
    run = _pull_run(origin, key, hosts)
    gen = publish_desired(origin, key, dict.fromkeys(hosts, NEW), "t")
    late = {**GOOD, "generation": 10 ** 18}
    _put_report(origin, "h1", {**late, "host": "h1"}, None)  # unsigned
    _put_report(origin, "h2", {**late, "host": "h2"}, host_keys["h3"])  # another host's key
    _put_report(origin, "h3", {**late, "host": "h3", "generation": "soon"}, host_keys["h3"])  # malformed
    origin.report("h4").write_text('{"host": "h4", "release": "a98c')  # truncated (newcomer item 28)
    _put_report(origin, "h5", {**late, "host": "h5"}, host_keys["h5"])
    out = run.await_reports(hosts, gen, NEW)
    assert [h for h in hosts if out[h][0]] == ["h5"]
    assert "report not signed" in out["h1"][1]
    assert "report signature refused" in out["h2"][1]
    assert "report malformed: generation is not a whole number" in out["h3"][1]
    assert "report unreadable" in out["h4"][1]
    rows = {r["host"]: r for r in status(_hosts_named(hosts), origin)}
    assert "report not signed" in rows["h1"]["drift"][0] and rows["h5"]["drift"] == []
    assert "report unreadable" in rows["h4"]["drift"][0] and "bootstrap it" not in rows["h4"]["drift"][0]


def _hosts_named(names: list[str]) -> list:
    class Host:
        def __init__(self, name):
            self.name = name

        def get(self, key, default=None):
            return default

    return [Host(n) for n in names]


_value = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=30),
                   st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                   st.sampled_from(["ok", "failed", "running", NEW, "2030-01-01T00:00:00Z", "2026-12-06 02:51:11",
                                    "\x1b[2J", 10 ** 18]))
_KEYS = ("host", "release", "generation", "result", "started", "finished", "error", "stale", "changed", "failure")
_payload = st.one_of(
    st.dictionaries(st.sampled_from(_KEYS), _value, max_size=4).map(
        lambda over: {**GOOD, "host": "h1", "generation": 5, **over}),
    st.fixed_dictionaries({}, optional=dict.fromkeys(_KEYS, _value)),
    _value)


def _well_formed(rep: object) -> bool:
    """The test's own reading of a report the rollout may count as ok."""
    def time_ok(v):
        return v is None or (isinstance(v, str) and len(v) == 20 and v[4] == "-" and v[10] == "T" and v.endswith("Z"))

    return (isinstance(rep, dict) and rep.get("host") == "h1" and rep.get("release") == NEW
            and type(rep.get("generation")) is int and rep["generation"] >= 1 and rep.get("result") == "ok"
            and time_ok(rep.get("started")) and time_ok(rep.get("finished")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=_payload, signed=st.sampled_from([True, True, True, False]),
       raw=st.one_of(st.none(), st.none(), st.none(), st.binary(max_size=40)))
def test_generated_malformed_reports_never_crash_and_never_pass(bare_origin, key, host_keys, payload, signed, raw):
    """Whatever a host's report holds (signed by it or not, or no JSON at all), status() and the
    rollout's wait do not raise, print no control character, and pass it only when it is a
    well-formed ok report of the release signed by its host."""
    origin = bare_origin
    if raw is not None:
        origin.report("h1").write_bytes(raw)
    else:
        write_atomic(origin.report("h1"), host_run.signed_report(
            {"report_key": str(host_keys["h1"] if signed else "/nonexistent")}, payload))
    (row,) = status(_hosts_named(["h1"]), origin)
    assert not any(c in "".join(row["drift"]) + row["error"] for c in "\x1b\n\r")
    run = _pull_run(origin, key, ["h1"], wait=0)
    ok, why, _ = run.await_reports(["h1"], 1, NEW)["h1"]
    if ok:
        assert raw is None and signed and _well_formed(payload)
    else:
        assert why and "\x1b" not in why


def test_a_garbage_pointer_shows_in_status(bare_origin, key, host_keys):
    """Newcomer item 27: an unreadable pointer is drift, named; item 29: a report whose finished
    is not the ISO form is malformed, not a traceback."""
    origin = bare_origin
    publish_desired(origin, key, {"h1": NEW, "h2": NEW}, "t")
    origin.pointer("h1").write_text("garbage{")
    _put_report(origin, "h2", {**GOOD, "host": "h2", "finished": "2026-12-06 02:51:11"}, host_keys["h2"])
    rows = {r["host"]: r for r in status(_hosts_named(["h1", "h2"]), origin)}
    assert any("pointer desired/h1.json unreadable" in d for d in rows["h1"]["drift"])
    assert rows["h2"]["drift"] == ["report malformed: finished is not a time like 2026-01-02T03:04:05Z"]


# --- the host side: freshness, fail-closed state, per-host data, caps -------------------------------

@pytest.fixture
def host_side(tmp_path, key, host_keys, monkeypatch):
    """converge run in this process against pointers in a directory (no HTTP), reports captured."""
    (tmp_path / "origin").mkdir()
    origin = PullSite(tmp_path / "origin")
    signers = tmp_path / "signers"
    signers.write_text(allowed_signers(key))
    monkeypatch.setattr(host_fetch, "STATE_DIR", tmp_path / "state")

    def fetch(url, headers=None, limit=0):
        path = origin.root / url.split("127.0.0.1:1/", 1)[1]
        if not path.is_file():
            raise host_fetch.NotFound(f"{url}: HTTP 404")
        return 200, path.read_bytes(), {}

    monkeypatch.setattr(host_fetch, "fetch", fetch)
    sent: list[dict] = []
    monkeypatch.setattr(host_run, "send_report", lambda cfg, rep: sent.append(rep))
    cfg = {"format": 1, "host": "h1", "origin": "http://127.0.0.1:1", "signers": str(signers), "release": None,
           "min_generation": 0, "report_key": str(host_keys["h1"]), "converge_interval": 600}
    path = tmp_path / "pull.json"
    path.write_text(json.dumps(cfg))
    return origin, cfg, path, sent


def test_a_rebuilt_host_refuses_a_pointer_below_its_floor(host_side, key):
    """Finding 4: a host with no state (rebuilt, or state.json wiped) refuses an older pointer:
    the bootstrap's min_generation, and the highest generation it accepted (its own file)."""
    origin, cfg, _, _ = host_side
    publish_desired(origin, key, {"h1": "a" * 64}, "t")
    old = origin.pointer("h1").read_bytes()
    g2 = publish_desired(origin, key, {"h1": "b" * 64}, "t")
    assert host_fetch.desired(cfg, {})["release"] == "b" * 64
    origin.pointer("h1").write_bytes(old)
    with pytest.raises(host_fetch.Refused, match="older than"):
        host_fetch.desired(cfg, {})  # no state: the generation file holds
    host_fetch._generation_path().unlink()
    with pytest.raises(host_fetch.Refused, match="older than"):
        host_fetch.desired({**cfg, "min_generation": g2}, {})  # a new bootstrap: its floor holds


def test_unreadable_state_or_generation_fails_closed(host_side, key):
    origin, cfg, path, sent = host_side
    publish_desired(origin, key, {"h1": "a" * 64}, "t", {"h1": {"groups": [], "data": {}}})
    host_fetch.STATE_DIR.mkdir(parents=True)
    (host_fetch.STATE_DIR / "state.json").write_text("{not json")
    assert host_run.converge(path, echo=lambda _: None) == 1
    assert sent[-1]["result"] == "refused" and "unreadable" in sent[-1]["error"]
    assert (host_fetch.STATE_DIR / "state.json").read_text() == "{not json"  # left for the operator
    (host_fetch.STATE_DIR / "state.json").unlink()
    host_fetch._generation_path().write_text("x\n")
    assert host_run.converge(path, echo=lambda _: None) == 1
    assert sent[-1]["result"] == "refused" and "generation file" in sent[-1]["error"]


def test_an_expired_pointer_is_a_stale_origin(host_side, key):
    """A frozen origin serving an old pointer: the host keeps its release and reports a stale
    origin; `pull refresh` re-signs the same release, data, a new generation and expiry."""
    origin, cfg, path, sent = host_side
    data = {"h1": {"groups": ["g"], "data": {"colour": "blue"}}}
    publish_desired(origin, key, {"h1": "a" * 64}, "t", data, ttl=-1)
    with pytest.raises(host_fetch.Stale, match="stale origin: desired/h1.json expired at"):
        host_fetch.desired(cfg, {})
    state = {"release": "a" * 64, "generation": 1, "result": "ok", "finished_ts": time.time()}
    host_fetch.save_state(state)
    assert host_run.converge(path, echo=lambda _: None) == 1
    assert sent[-1]["stale"].startswith("stale origin") and sent[-1]["release"] == "a" * 64
    assert json.loads((host_fetch.STATE_DIR / "state.json").read_text())["release"] == "a" * 64
    before = read_pointer(origin.pointer("h1"))
    gen, hosts = refresh(origin, key)
    after = read_pointer(origin.pointer("h1"))
    assert hosts == ["h1"] and gen > before["generation"]
    assert (after["release"], after["host_data"]) == ("a" * 64, data["h1"])
    assert host_fetch.desired(cfg, {})["generation"] == gen


def test_each_host_receives_only_its_own_data(repo, key, tmp_path):
    """Finding 12: the release holds no host's data; each pointer holds its own host's entry."""
    (tmp_path / "origin").mkdir()
    origin = PullSite(tmp_path / "origin")
    hosts = _hosts(repo, lb_drain_command="curl -H 'Authorization: Bearer s3cr3t-lb'")
    sha = publish_release(origin, hosts, "deploys/mark.py", repo)
    entries, _ = host_entries(hosts, repo)
    publish_desired(origin, key, {"pull-1": sha, "pull-2": sha}, "t", entries)
    # the pointer's signed payload, not its signature: base64 may spell "/2" or "red" by chance
    payload = json.loads(origin.pointer("pull-1").read_bytes())["payload"].encode()
    served_to_1 = payload + gzip.decompress(origin.release(sha).read_bytes())
    assert b"red" not in served_to_1 and b"/2" not in served_to_1  # pull-2's colour and mark file
    assert read_pointer(origin.pointer("pull-1"))["host_data"] == entries["pull-1"]
    unpacked = _manifest(origin.release(sha).read_bytes())
    assert "hosts" not in unpacked["manifest"] and "s3cr3t-lb" not in json.dumps(unpacked["manifest"])


def test_downloads_are_capped(served, key):
    """A hostile origin cannot fill a host's memory or disk: a pointer over 1 MiB is refused, an
    archive is cut off at its declared size and deleted."""
    origin, cfg_path, tmp = served
    cfg = json.loads(cfg_path.read_text())
    origin.pointer("pull-1").parent.mkdir(parents=True, exist_ok=True)
    origin.pointer("pull-1").write_bytes(b" " * (MAX_SMALL + 10))
    with pytest.raises(host_fetch.Refused, match="more than"):
        host_fetch.desired(cfg, {})
    (origin.root / "blobs").mkdir()
    (origin.root / "blobs" / ("c" * 64)).write_bytes(b"x" * 5000)
    dest = tmp / "dl" / "blob"
    with pytest.raises(host_fetch.Refused, match="more than the 100 bytes"):
        host_fetch.fetch_to(f"{origin.url}/blobs/{'c' * 64}", dest, "c" * 64, 100)
    assert not dest.exists() and not list(dest.parent.iterdir())


def test_bootstrap_makes_keeps_and_enrols_each_hosts_report_key(tmp_path, key):
    """One report key per host, private half 0600 in a 0700 directory (never on the origin),
    public half enrolled for that host only; a second bootstrap keeps it, --rekey replaces it; a
    host enrolled with a key that is not in --out is refused."""
    (tmp_path / "origin").mkdir()
    origin = PullSite(tmp_path / "origin")
    out = tmp_path / "boot"
    first = bootstrap.report_keys(["a", "b"], origin, out)
    assert (out / "a" / "report-key").stat().st_mode & 0o777 == 0o600
    assert (out / "a").stat().st_mode & 0o777 == 0o700
    assert not [p for p in origin.root.rglob("*") if "PRIVATE" in p.read_text()]
    lines = (origin.root / HOST_SIGNERS).read_text().splitlines()
    assert [ln.split(" ")[:2] for ln in lines] == [["a", 'namespaces="tritonfleet-report"'],
                                                   ["b", 'namespaces="tritonfleet-report"']]
    assert bootstrap.report_keys(["a", "b"], origin, out) == first
    again = bootstrap.report_keys(["a"], origin, out, rekey=True)
    assert again["a"] != first["a"] and host_signers(origin)["a"] in (out / "a" / "report-key.pub").read_text()
    with pytest.raises(UsageError, match="give the --out it was bootstrapped with, or --rekey"):
        bootstrap.report_keys(["b"], origin, tmp_path / "elsewhere")
    with pytest.raises(UsageError, match="cannot hold a report key"):
        bootstrap.report_keys(["*"], origin, out)
    # the script writes the key root-only, and the config with the floor
    cfg = {"host": "a", "origin": "http://10.0.0.1:8090", "min_generation": 7, "report_key": bootstrap.REPORT_KEY}
    text = bootstrap.script(cfg, "f" * 64, allowed_signers(key), again["a"])
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert text.index("umask 077") < text.index(f"cat > {bootstrap.REPORT_KEY}.tmp") and again["a"].strip() in text
    assert f"chmod 600 {bootstrap.CONFIG}.tmp" in text


def test_release_signers_rotate_with_an_overlap(host_side, key, tmp_path):
    """A host moves from OLD to NEW through the signers document with no window where neither
    verifies; a document signed by a key it does not trust, or an older one, is refused."""
    origin, cfg, _, _ = host_side
    new, rogue = tmp_path / "new", tmp_path / "rogue"
    for k in (new, rogue):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)

    def follows(signer: Path) -> bool:
        publish_desired(origin, signer, {"h1": "a" * 64}, "t")
        try:
            host_fetch.desired(cfg, {})
            return True
        except host_fetch.Refused:
            return False

    state: dict = {}
    assert host_fetch.update_signers(cfg, state) == ""  # no document: nothing to do
    assert follows(key) and not follows(new)
    rotate_key(origin, key, new=new)  # overlap: [OLD, NEW], signed by OLD
    assert "generation 1 installed (2 key(s))" in host_fetch.update_signers(cfg, state)
    assert follows(key) and follows(new)
    overlap = (origin.root / SIGNERS_DOC).read_bytes()
    rotate_key(origin, new, retire=key)  # [NEW], signed by NEW
    assert "generation 2 installed (1 key(s))" in host_fetch.update_signers(cfg, state)
    assert follows(new) and not follows(key)
    (origin.root / SIGNERS_DOC).write_bytes(overlap)  # the old document served again: OLD is retired
    with pytest.raises(host_fetch.Refused, match="signature does not verify"):
        host_fetch.update_signers(cfg, {})
    doc = json.loads(overlap)
    older = sign(new, {"d": doc["payload"].encode()}, namespace=SIGNERS_NAMESPACE)["d"]
    (origin.root / SIGNERS_DOC).write_text(json.dumps({"payload": doc["payload"], "signature": older}))
    with pytest.raises(host_fetch.Refused, match="older than the 2 installed"):  # signed by NEW, generation 1
        host_fetch.update_signers(cfg, {})
    payload = doc["payload"].replace('"generation": 1', '"generation": 9')
    sig = sign(rogue, {"d": payload.encode()}, namespace=SIGNERS_NAMESPACE)["d"]
    (origin.root / SIGNERS_DOC).write_text(json.dumps({"payload": payload, "signature": sig}))
    with pytest.raises(host_fetch.Refused, match="signature does not verify"):
        host_fetch.update_signers(cfg, {})
    assert follows(new) and not follows(key)  # the installed list is unchanged
    with pytest.raises(UsageError, match="not a signer the hosts trust now"):
        rotate_key(origin, rogue, new=rogue)
