"""The model origin, control side (tritonfleet.model_repo.origin) against real servers on this
machine: its settings, what is uploaded, and the whole model step from nginx and from rclone's S3
gateway through pyinfra's @local connector (this machine plays the host). Bytes are counted at each
server from its own records. (The host-side fetch alone: test_fetch.py; on the test hosts, through
a rollout: tests/testbed/test_model_origin.py.)"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.integration.model_repo.test_release_sync import assert_serves, live, write
from tritonfleet.core.errors import UsageError
from tritonfleet.gpu.rules import GPU_CLASSES
from tritonfleet.model_repo import fetch
from tritonfleet.model_repo import origin as origins
from tritonfleet.model_repo import release as release_plan
from tritonfleet.model_repo import render as models
from tritonfleet.settings import check
from tritonfleet_testbed.origin_servers import Nginx, RcloneS3


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- settings

SETTINGS = {"model_origin": None, "model_origin_auth": "presigned", "model_origin_url_expiry": 1800,
            "model_origin_endpoint": None, "model_origin_upload_url": None, "model_origin_region": None,
            "model_origin_upload_user": None, "model_origin_upload_password_env": "X",
            "model_origin_credentials_file": "/etc/tritonfleet/origin-credentials"}


def settings(**kw):
    values = {**SETTINGS, **kw}
    return values


@pytest.mark.parametrize("kw,words", [
    ({"model_origin": "ftp://x/y"}, "neither s3://bucket/prefix nor http"),
    ({"model_origin": "s3:///prefix"}, "neither s3://"),
    ({"model_origin": "https://x/a b"}, "white space"),
    ({"model_origin": "s3://b/p", "model_origin_auth": "token"}, "model_origin_auth must be one of"),
    ({"model_origin": "s3://b/p", "model_origin_url_expiry": 10}, "between 60 and 604800"),
    ({"model_origin": "s3://b/p", "model_origin_endpoint": "minio:9000"}, "must be an http(s):// URL"),
    ({"model_origin": "http://m/p", "model_origin_upload_user": "up"}, "in clear to http://m/p"),
    ({"model_origin": "https://m/p", "model_origin_upload_url": "http://m:81/p", "model_origin_upload_user": "up"},
     "in clear to http://m:81/p"),
])
def test_origin_settings_that_cannot_work_are_refused_naming_the_tunable(kw, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        origins.from_settings(settings(**kw))


@given(st.sampled_from(["http://m/p", "https://m/p", "s3://bkt/p"]), st.sampled_from([None, "http://u/p", "https://u/p"]),
       st.sampled_from([None, "uploader"]))
def test_an_upload_login_over_plain_http_is_refused_at_load_and_by_the_origin(url, upload, user):
    """Basic auth over http:// would send the upload password in clear: the settings check and the
    origin refuse exactly the same combinations."""
    kw = {"model_origin": url, "model_origin_upload_url": upload, "model_origin_upload_user": user}
    at_load = [p for p in check.problems("h1", {k: v for k, v in kw.items() if v}, lambda k: "here", GPU_CLASSES)]
    try:
        origins.from_settings(settings(**kw))
        refused = False
    except UsageError:
        refused = True
    clear = bool(user) and not url.startswith("s3") and (upload or url).startswith("http://")
    assert refused == clear == bool(at_load), (kw, at_load)


def test_origin_settings():
    assert origins.from_settings(settings()) is None  # the push over SSH
    o = origins.from_settings(settings(model_origin="s3://bucket/a/b/"))
    assert (o.kind, o.bucket, o.prefix, o.object_key("ab")) == ("s3", "bucket", "a/b/", "a/b/objects/sha256/ab")
    h = origins.from_settings(settings(model_origin="https://m.example/t/"))
    assert (h.kind, h.auth, h.base) == ("http", "host", "https://m.example/t")  # no signed URLs over plain HTTP


@given(st.sampled_from(["s3://", "http://", "https://", "ftp://", "s3:", ""]),
       st.text("ab/ :.\"'\\%-", max_size=8), st.sampled_from(["presigned", "host", "token"]),
       st.integers(0, 10**6))
def test_the_settings_check_at_load_refuses_exactly_what_the_origin_cannot_use(scheme, rest, auth, expiry):
    """The inventory's check (tritonfleet.settings.check, at load, before any host is read)
    and the origin itself agree on every model_origin, auth and expiry (with no origin, the
    push over SSH, the origin reads none of them; the check still refuses a bad one)."""
    assume(scheme + rest)
    kw = {"model_origin": scheme + rest, "model_origin_auth": auth, "model_origin_url_expiry": expiry}
    refused_at_load = bool(check.problems("h1", kw, lambda k: "here", GPU_CLASSES))
    try:
        origins.from_settings(settings(**kw))
    except UsageError:
        refused = True
    else:
        refused = False
    assert refused_at_load == refused, (kw, check.problems("h1", kw, lambda k: "here", GPU_CLASSES))


@given(st.dictionaries(st.text("abc/ .-", min_size=1, max_size=8).map(lambda s: s.strip("/") or "f"),
                       st.tuples(st.integers(0, 5), st.sampled_from(["s1", "s2", "s3"])), max_size=8),
       st.dictionaries(st.sampled_from(["s1", "s2", "s3"]), st.integers(0, 5)))
def test_only_objects_the_origin_lacks_or_holds_at_another_size_are_uploaded(manifest, have):
    man = {p: [size, s] for p, (size, s) in manifest.items()}
    wanted = origins.objects_of(man)
    todo = origins.missing(wanted, have)
    assert set(wanted) == {v[1] for v in man.values()}
    for s in wanted:
        assert (s in todo) == (have.get(s) != wanted[s][0])


# --------------------------------------------------------------------------- the model step, @local

def sync_from(base: Path, repo: Path, **data):
    """One run of the model step (stage, then switch) on this machine (pyinfra's @local
    connector) with the given origin tunables: (state, names of the operations that changed)."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operations import run_ops

    from tests.support.fakehost import defaults
    from tritonfleet.model_repo.render import _rendered
    from tritonfleet.steps.triton import model_repository

    _rendered.cache_clear()
    values = {**defaults("t4"), "triton_base_dir": str(base), "model_repository": str(repo),
              "model_overrides": {}, **data}
    inventory = Inventory(([("@local", values)], {}), t4=(["@local"], {}))
    state = State(inventory, Config(), check_for_changes=False)
    connect_all(state)
    add_deploy(state, model_repository)
    try:
        run_ops(state)
    except PyinfraError:
        pass
    host = inventory.get_host("@local")
    changed = []
    for d in state.ops[host].values():
        try:
            if d.operation_meta.did_change():
                changed.append(d)
        except RuntimeError:  # never executed: the host failed before it
            pass
    return state, changed


@pytest.fixture
def origin_repo(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TRITONFLEET_LOCAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    origins._published.clear()
    origins._checked.clear()
    origins._stores.clear()
    r = tmp_path / "repo"
    write(r, "a/config.pbtxt", b'name: "a"\n')
    write(r, "a/1/model.onnx", os.urandom(300_000))
    write(r, "b/config.pbtxt", b'name: "b"\n')
    write(r, "b/1/model.onnx", os.urandom(200_000))
    write(r, "b/1/copy.onnx", (r / "b/1/model.onnx").read_bytes())
    (r / "e/1").mkdir(parents=True)  # an empty version directory (an ensemble's)
    write(r, "e/config.pbtxt", b'name: "e"\n')
    return r


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_releases_from_an_origin_arrive_exactly_and_only_changed_objects_travel(kind, tmp_path, origin_repo,
                                                                                monkeypatch):
    base = tmp_path / "opt-triton"
    server = Nginx(tmp_path / "nginx") if kind == "http" else RcloneS3(tmp_path / "rclone")
    with server:
        if kind == "http":
            data = {"model_origin": server.url}
            served = server.served
            mark = server.mark
        else:
            for k, v in server.env().items():
                monkeypatch.setenv(k, v)
            data = {"model_origin": f"s3://{server.bucket}/fleet", "model_origin_endpoint": server.endpoint}
            served = lambda since=0: server.served()  # noqa: E731
            mark = server.reset
        start = mark()
        state, changed = sync_from(base, origin_repo, **data)
        assert not state.failed_hosts and changed, changed
        assert_serves(base, origin_repo)
        man = models.manifest(origin_repo)
        objects = origins.objects_of(man)
        assert served(start) == {s: size for s, (size, _) in objects.items()}  # each object once
        assert len(objects) == 5 and len(man) == 7  # b/1/copy.onnx is b/1/model.onnx: one object
        first = live(base)

        # one changed file: the origin gets it and serves it, and nothing else
        write(origin_repo, "a/config.pbtxt", b'name: "a"\nmax_batch_size: 4\n')
        origins._published.clear()
        start = mark()
        state, changed = sync_from(base, origin_repo, **data)
        assert not state.failed_hosts and changed
        assert_serves(base, origin_repo)
        new = sha((origin_repo / "a/config.pbtxt").read_bytes())
        assert served(start) == {new: len(b'name: "a"\nmax_batch_size: 4\n')}
        assert first.is_dir() and live(base) != first  # the earlier release is kept for rollback
        assert not (base / "releases" / fetch.OBJECTS_DIR).exists() or \
            not any((base / "releases" / fetch.OBJECTS_DIR).iterdir())

        # a no-op: nothing is asked of the origin
        start = mark()
        state, changed = sync_from(base, origin_repo, **data)
        assert not state.failed_hosts and changed == [] and served(start) == {}


def test_a_corrupt_object_is_refused_and_the_live_release_untouched(tmp_path, origin_repo):
    base = tmp_path / "opt-triton"
    with Nginx(tmp_path / "nginx") as web:
        state, _ = sync_from(base, origin_repo, model_origin=web.url)
        assert not state.failed_hosts
        before = live(base)
        write(origin_repo, "b/labels.txt", b"cat\ndog\n")
        man = models.manifest(origin_repo)
        origins.publish(origins.from_settings(settings(model_origin=web.url)), origin_repo, man,
                        models.release_id(man))
        obj = web.object_path(sha(b"cat\ndog\n"))
        obj.write_bytes(b"cat\ndoh\n")  # damaged at the origin after the upload, same size
        state, _ = sync_from(base, origin_repo, model_origin=web.url)
        assert state.failed_hosts
        assert live(base) == before  # the live release is untouched
        assert not (base / "releases" / models.release_id(man)).exists()


def test_hosts_sign_with_their_own_credentials_when_the_origin_is_theirs(tmp_path, monkeypatch):
    """model_origin_auth = "host": plain URLs, curl signs each request (SigV4) with the host's
    own credentials file; wrong credentials are refused by the server."""
    from tritonfleet_testbed.origin_servers import KEY, SECRET

    with RcloneS3(tmp_path / "rclone") as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        origins._stores.clear()
        creds = tmp_path / "creds"
        o = origins.from_settings(settings(model_origin=f"s3://{s3.bucket}/p", model_origin_endpoint=s3.endpoint,
                                           model_origin_auth="host", model_origin_credentials_file=str(creds)))
        data = os.urandom(50_000)
        src = tmp_path / "f"
        src.write_bytes(data)
        origins.store_for(o).put_file(src, sha(data))
        url = origins.urls(o, [sha(data)])[sha(data)]
        assert "X-Amz-Signature" not in url  # nothing signed here
        for secret, ok in ((SECRET, True), ("not-the-secret-0123456789", False)):
            creds.write_text(f"AWS_ACCESS_KEY_ID={KEY}\nAWS_SECRET_ACCESS_KEY='{secret}'\n")
            base = tmp_path / f"opt-{ok}"
            (base / "releases" / release_plan.incoming_dir("r", "run1")).mkdir(parents=True)
            script = fetch.fetch_script(str(base), "r", "run1", retries=0, credentials=(str(creds), "us-east-1"))
            res = subprocess.run(["sh", "-c", script], input=fetch.fetch_list({sha(data): (len(data), url)},
                                                                             {"x": sha(data)}),
                                 capture_output=True, text=True, timeout=60)
            got = fetch.parse_fetch(res.stdout.splitlines())
            assert got.ok == ok and (res.returncode == 0) == ok, res.stdout + res.stderr
            if not ok:
                assert got.failed_transfer(sha(data))[1] == 403


def test_a_staged_release_is_on_disk_before_it_is_called_complete(tmp_path, origin_repo, monkeypatch):
    """Staging syncs every file of the release it completes before the release takes its name
    (a later batch does not pay the writeback; a power loss leaves no "complete" release of lost
    pages); the run that switches to a release it assembled itself does not wait for the disk.
    A ``sync`` shim on PATH records what it was given and whether the release had its name yet."""
    shim = tmp_path / "bin"
    shim.mkdir()
    log = tmp_path / "sync.log"
    real = shutil.which("sync")
    (shim / "sync").write_text(f"#!/bin/sh\nfor f in \"$@\"; do [ \"$f\" = -- ] || echo \"$PWD $f\" >> {log}; done\n"
                               f"exec {real} \"$@\"\n")
    (shim / "sync").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    base = tmp_path / "opt-triton"
    man = models.manifest(origin_repo)
    rid = models.release_id(man)
    with Nginx(tmp_path / "nginx") as web:
        state, _ = sync_from(base, origin_repo, model_origin=web.url)
    assert not state.failed_hosts
    assert_serves(base, origin_repo)
    lines = log.read_text().splitlines()
    cwd = {line.split(" ", 1)[0] for line in lines}
    synced = sorted(line.split(" ", 1)[1].removeprefix("./") for line in lines)
    files = sorted(p for p, v in man.items() if not release_plan.is_dir_entry(p))
    # each file of the release once, and the release's own record of itself (its stat listing)
    assert [p for p in synced if not p.startswith(".tritonfleet")] == files, synced
    assert len(synced) == len(set(synced))
    (where,) = cwd  # in the incoming directory, before it became releases/<rid>
    assert Path(where).parent == base / "releases" and Path(where).name != rid


# --------------------------------------------------------------------------- the pre-flight check

class _Answers:
    """An HTTP origin on loopback that answers PUT and HEAD with the statuses a test sets."""

    def __init__(self, put: int, head: int):
        import http.server
        import threading

        outer = self
        self.put, self.head, self.seen = put, head, []

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_PUT(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append(("PUT", self.path))
                self.send_response(outer.put)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self):
                outer.seen.append(("HEAD", self.path))
                self.send_response(outer.head)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/models"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


STATUSES = [200, 201, 204, 301, 401, 403, 404, 405, 409, 500, 501, 502, 503]


@given(st.sampled_from(STATUSES), st.sampled_from(STATUSES), st.booleans())
def test_the_check_passes_only_an_origin_that_reads_and_takes_uploads(put, head, pull_host):
    """Pre-flight's one question: every status but a successful PUT (where this run publishes) and
    a 200 on reading it back fails, naming the status; a pull-mode host only reads (no PUT)."""
    server = _Answers(put, head)
    try:
        origin = origins.Origin("http", server.url)
        origins._checked.clear()
        origins._stores.clear()
        env = {origins.PULL_HOST_ENV: "/run/host.json"} if pull_host else {}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            if not pull_host:
                mp.delenv(origins.PULL_HOST_ENV, raising=False)
            try:
                origins.check(origin)
                error = None
            except origins.OriginError as e:
                error = str(e)
        put_ok = pull_host or put in (200, 201, 204)
        if put_ok and head == 200:
            assert error is None
        else:
            failing = put if not put_ok else head
            assert error and f"HTTP {failing}:" in error, error
        empty = f"/models/objects/sha256/{origins.EMPTY}"
        assert server.seen[:1] == [("HEAD" if pull_host else "PUT", empty)]
        assert all(path == empty for _, path in server.seen)  # nothing else is written or read
    finally:
        origins._checked.clear()
        origins._stores.clear()
        server.close()


def test_the_check_names_a_typo_in_the_origin_path(tmp_path, monkeypatch):
    """newcomer-2 40: a typo'd path (nginx's 404) stops pre-flight; the right path and nginx's
    PUT pass; what the check wrote is the empty object, which is what the origin holds anyway."""
    monkeypatch.delenv(origins.PULL_HOST_ENV, raising=False)
    with Nginx(tmp_path / "nginx") as web:
        origins._checked.clear()
        origins.check(origins.Origin("http", web.url))
        assert web.object_path(origins.EMPTY).read_bytes() == b""
        typo = web.url.replace("/models", "/tritn-typo")
        with pytest.raises(origins.OriginError, match=r"HTTP (404|409): .*(does not accept PUT|nothing at)"):
            origins._checked.clear()
            origins.check(origins.Origin("http", typo, upload_url=web.url))
    origins._checked.clear()
    origins._stores.clear()


# --------------------------------------------------------------------------- pull mode: the host only reads

def _methods(web: Nginx, since: int) -> list[str]:
    with open(web.access, "rb") as f:
        f.seek(since)
        return [line.split(" ")[0] for line in f.read().decode().splitlines()]


def test_in_pull_mode_the_control_machine_publishes_and_the_host_only_reads(tmp_path, origin_repo, monkeypatch,
                                                                           caplog):
    """security-review-2 finding 13: a self-converging host needed write access to the origin
    (it uploaded and PUT the manifest). Now `pull publish` (publish_release) publishes the
    model release from the control machine; the host's deploy finds the manifest there, fetches,
    and sends no PUT; an unpublished release stops the host's run naming the fix, still without
    a PUT. No test host: this machine plays the control machine, then the host (@local)."""
    from tritonfleet.fleet.pull.origin import PullSite
    from tritonfleet.fleet.pull.release import publish_release
    from tritonfleet.inventory.roster import FleetHost

    base = tmp_path / "opt-triton"
    with Nginx(tmp_path / "nginx") as web:
        monkeypatch.delenv(origins.PULL_HOST_ENV, raising=False)
        fleet_host = FleetHost("gpu1", ["t4"], {"model_origin": web.url, "model_repository": str(origin_repo)})
        start = web.mark()
        (tmp_path / "deploys").mkdir()
        (tmp_path / "deploys" / "triton.py").write_text("# the deploy\n")
        (tmp_path / "pull-origin").mkdir()
        pull_origin = PullSite(tmp_path / "pull-origin")
        publish_release(pull_origin, [fleet_host], "deploys/triton.py", tmp_path, ("deploys", "repo"))
        man = models.manifest(origin_repo)
        rid = models.release_id(man)
        assert (web.root / "models" / "releases" / f"{rid}.json").is_file()  # the one a 1-GPU host renders
        assert "PUT" in _methods(web, start)

        # the host: pull mode (the converge's environment), no upload credential anywhere
        monkeypatch.setenv(origins.PULL_HOST_ENV, str(tmp_path / "host.json"))
        origins._published.clear()
        origins._checked.clear()
        origins._stores.clear()
        start = web.mark()
        origins.check(origins.Origin("http", web.url))  # the host's pre-flight: reads what publishing put there
        state, changed = sync_from(base, origin_repo, model_origin=web.url)
        assert not state.failed_hosts and changed
        assert_serves(base, origin_repo)
        assert "PUT" not in _methods(web, start) and "GET" in _methods(web, start)

        # a release the control machine did not publish: the host stops, names the fix, writes nothing
        write(origin_repo, "a/config.pbtxt", b'name: "a"\nmax_batch_size: 8\n')
        origins._checked.clear()
        start = web.mark()
        before = live(base)
        state, _ = sync_from(base, origin_repo, model_origin=web.url)
        assert state.failed_hosts and live(base) == before
        assert "PUT" not in _methods(web, start)
        assert "is not there" in caplog.text and "tritonfleet pull publish" in caplog.text, caplog.text[-3000:]


def test_pull_mode_refuses_an_origin_only_the_control_machine_could_sign(tmp_path):
    from types import SimpleNamespace

    from tritonfleet.model_repo.pull_publish import gpu_counts, publish_models

    h = SimpleNamespace(name="gpu1", groups=[], data={"model_origin": "s3://bucket/fleet"})
    with pytest.raises(UsageError, match="gpu1: pull mode: .*model_origin_auth = 'host'"):
        publish_models([h], tmp_path)
    assert gpu_counts({"gpu_count": 4}) == [4] and gpu_counts({"triton_per_gpu": True, "gpu_count": 4}) == [1]
    assert gpu_counts({}) == list(range(1, 9))
