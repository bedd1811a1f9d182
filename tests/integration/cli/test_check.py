"""`tritonfleet check` (tritonfleet.fleet.wiring) against real local servers: each wiring mistake of
the new operator's report seen, named and given its fix. Debian's HAProxy, Alertmanager's amtool
and Prometheus's promtool, the quarantine receiver itself, Python's HTTP server as a model origin,
ssh-keygen's keys. The command runs in a forked child (it loads an inventory:
tests/support/forked.py); the servers run in this process."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.fleet.test_quarantine import tritonfleet
from tests.support.haproxy import HAProxy, ok_server
from tritonfleet.fleet import quarantine
from tritonfleet.fleet.pull import bootstrap
from tritonfleet.fleet.pull.origin import PullSite
from tritonfleet.fleet.pull.signing import allowed_signers, publish_desired, read_pointer
from tritonfleet.inventory.roster import FleetHost
from tritonfleet_testbed.ports import free_port

HOSTS = ("h1", "h2")


def inventory(tmp: Path, name: str = "inv", **data) -> Path:
    """An inventory of HOSTS (distinct loopback addresses) with ``data`` for all of them."""
    inv = tmp / name / "fleet.py"
    inv.parent.mkdir(parents=True, exist_ok=True)
    base = {"ssh_strict_host_key_checking": "off", **data}
    inv.write_text("fleet = [" + ", ".join(
        f"({h!r}, {({'ssh_hostname': f'127.0.0.{i + 2}', **base})!r})" for i, h in enumerate(HOSTS)) + "]\n")
    return inv


def check(*args: str):
    return tritonfleet("check", *args, "--timeout", "2")


def rows(res) -> list[dict]:
    return json.loads(res.stdout)


def failed(res, check_name: str) -> list[dict]:
    return [r for r in rows(res) if r["check"] == check_name and r["status"] == "fail"]


# ---- the command ------------------------------------------------------------------------------

def test_an_inventory_without_extras_is_all_ok_and_the_json_is_a_row_list(tmp_path):
    res = check(str(inventory(tmp_path)), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    out = rows(res)
    assert isinstance(out, list) and out
    assert all(set(r) == {"status", "check", "what", "fix"} and r["status"] in ("ok", "warn", "fail") for r in out)
    assert [r["check"] for r in out] == ["inventory", "model origin", "image mirror", "quarantine", "load balancer"]
    text = check(str(inventory(tmp_path)))
    assert text.returncode == 0 and text.stdout.startswith("OK    inventory")


def test_refused_settings_are_one_row_each_and_bad_input(tmp_path):
    res = check(str(inventory(tmp_path, triton_http_port="8000", health_timeout=-5)), "--json")
    assert res.returncode == 2 and "did not load (4 refusal(s) above)" in res.stderr
    bad = failed(res, "inventory")
    # one row a refusal: each setting of each host (host data)
    assert len(bad) == 4 and sum("triton_http_port = '8000'" in r["what"] for r in bad) == 2
    assert all(r["fix"] for r in bad)


def test_bad_input_is_exit_status_2(tmp_path):
    res = check(str(tmp_path / "nope.py"))
    assert res.returncode == 2 and "nope.py not found" in res.stdout and "did not load" in res.stderr
    assert check(str(inventory(tmp_path)), "--sign-key", str(inventory(tmp_path))).returncode == 2


# ---- the model origin -------------------------------------------------------------------------

class _Origin(SimpleHTTPRequestHandler):
    """A directory served over HTTP that takes PUT (as nginx's dav_methods PUT does)."""

    def do_PUT(self):  # noqa: N802 - http.server's name
        path = Path(self.translate_path(self.path))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def http_origin(root: Path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Origin, directory=str(root)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_404_origin_path_fails_with_the_fix(tmp_path):
    (tmp_path / "www" / "triton").mkdir(parents=True)
    with http_origin(tmp_path / "www") as url:
        res = check(str(inventory(tmp_path, model_origin=f"{url}/tritn-typo")), "--json")
    assert res.returncode == 1
    [bad] = failed(res, "model origin")
    assert "HTTP 404" in bad["what"] and "no such path" in bad["what"] and "model_origin's path" in bad["fix"]


def test_the_origin_holds_the_local_release_or_says_what_it_lacks(tmp_path):
    from tritonfleet.model_repo import origin as origins
    from tritonfleet.model_repo import render

    (tmp_path / "www" / "triton").mkdir(parents=True)
    with http_origin(tmp_path / "www") as url:
        inv = inventory(tmp_path, model_origin=f"{url}/triton")
        res = check(str(inv), "--json")
        assert res.returncode == 0, res.stdout
        mo = [r for r in rows(res) if r["check"] == "model origin"]
        assert "takes uploads" in mo[0]["what"] and mo[1]["status"] == "warn" and "not on" in mo[1]["what"]
        o = origins.Origin("http", f"{url}/triton", "host")
        root, man, rid = render.host_repository(FleetHost("h1", [], {"model_repository": "files/model_repository",
                                                                     "model_overrides": {}}))
        origins.publish(o, root, man, rid)  # as a deploy does: the objects, then the manifest
        assert (tmp_path / "www" / "triton" / "releases" / f"{rid}.json").is_file()
        res = check(str(inv), "--json")
        assert res.returncode == 0 and f"release {rid[:12]}: its manifest and all" in res.stdout
        victim = sorted(origins.objects_of(man))[0]
        (tmp_path / "www" / "triton" / "objects" / "sha256" / victim).unlink()
        res = check(str(inv), "--json")
    assert res.returncode == 1
    [bad] = failed(res, "model origin")
    assert f"{victim[:12]}: missing" in bad["what"] and "run the deploy again" in bad["fix"]


def test_an_origin_that_refuses_uploads_fails(tmp_path):
    (tmp_path / "www" / "triton").mkdir(parents=True)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(SimpleHTTPRequestHandler,
                                                                  directory=str(tmp_path / "www")))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        res = check(str(inventory(tmp_path, model_origin=f"http://127.0.0.1:{srv.server_address[1]}/triton")),
                    "--json")
    finally:
        srv.shutdown()
        srv.server_close()
    [bad] = failed(res, "model origin")
    assert "HTTP 501" in bad["what"] and "does not accept PUT" in bad["what"] and "dav_methods PUT" in bad["fix"]


# ---- the image mirror -------------------------------------------------------------------------

def test_an_unpinned_image_through_the_mirror_fails(tmp_path):
    res = check(str(inventory(tmp_path, image_mirror="127.0.0.1:5000")), "--json")
    assert res.returncode == 1
    [bad] = failed(res, "image mirror")
    assert "triton_image" in bad["what"] and "@sha256:<digest>" in bad["fix"] and "skopeo inspect" in bad["fix"]


# ---- pull mode --------------------------------------------------------------------------------

def keypair(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_a_pull_origin_whose_key_halves_do_not_match(tmp_path):
    key, other = keypair(tmp_path / "release"), keypair(tmp_path / "other")
    origin_dir = tmp_path / "origin"
    for d in ("releases", "desired", "reports", "dist"):
        (origin_dir / d).mkdir(parents=True)
    sha = "a" * 64
    (origin_dir / "releases" / f"{sha}.tar.gz").write_bytes(b"x")
    publish_desired(PullSite(origin_dir), key, dict.fromkeys(HOSTS, sha), "r1")
    inv = str(inventory(tmp_path))
    res = check(inv, "--pull-origin", str(origin_dir), "--sign-key", str(key), "--json")
    assert not failed(res, "pull origin"), res.stdout
    Path(f"{key}.pub").write_text(Path(f"{other}.pub").read_text())  # the wrong public half
    res = check(inv, "--pull-origin", str(origin_dir), "--sign-key", str(key), "--json")
    assert res.returncode == 1
    [bad] = failed(res, "pull origin")
    assert "is not the public half of" in bad["what"] and "ssh-keygen -y -f" in bad["fix"]
    res = check(inv, "--pull-origin", str(origin_dir), "--sign-key", str(other), "--json")  # signed by another key
    [bad] = failed(res, "pull origin")
    assert "does not verify against" in bad["what"] and "pull publish --sign-key" in bad["fix"]
    (origin_dir / "reports" / "h1.json").write_text('{"host": "h1", "release": "a98c')  # cut short
    (origin_dir / "desired" / "h2.json").write_text("garbage{")
    res = check(inv, "--pull-origin", str(origin_dir), "--json")
    whats = " | ".join(r["what"] for r in failed(res, "pull origin"))
    assert "reports/h1.json is unreadable" in whats and "desired/h2.json is not a release pointer" in whats
    boot = tmp_path / "bootstrap"  # the hosts' signers, as `tritonfleet bootstrap --out` writes them
    Path(f"{key}.pub").write_text(subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True,
                                                 text=True, check=True).stdout)
    for host, trusted in (("h1", key), ("h2", other)):
        (boot / host).mkdir(parents=True)
        (boot / host / "bootstrap.sh").write_text(bootstrap.script(
            {"host": host, "origin": "http://127.0.0.1:1"}, "0" * 64, allowed_signers(trusted)))
    Path(f"{key}.pub").write_text(Path(f"{other}.pub").read_text())
    res = check(inv, "--pull-origin", str(origin_dir), "--sign-key", str(key), "--bootstrap-dir", str(boot), "--json")
    [bad] = [r for r in failed(res, "pull origin") if "bootstrap script" in r["what"]]
    assert "trusts another key" in bad["what"] and "(hosts: h2)" in bad["what"] and "--sign-key" in bad["fix"]
    res = check(inv, "--pull-origin", str(origin_dir), "--sign-key", f"{key}.pub", "--json")  # newcomer 16
    [bad] = [r for r in failed(res, "pull origin") if "signing key" in r["what"]]
    assert "ssh-keygen -y cannot read it" in bad["what"] and f"({key}, not {key}.pub)" in bad["fix"]



def test_a_bootstrap_script_written_after_a_key_rotation_is_read_whole(tmp_path):
    """After `pull rotate-key`, bootstrap writes the signers list under a comment line: the key
    is looked for in every line of it, not in the first."""
    key, other = keypair(tmp_path / "release"), keypair(tmp_path / "other")
    origin_dir = tmp_path / "origin"
    for d in ("releases", "desired", "reports", "dist"):
        (origin_dir / d).mkdir(parents=True)
    boot = tmp_path / "bootstrap"
    for host, trusted in (("h1", key), ("h2", other)):
        (boot / host).mkdir(parents=True)
        listed = f"# tritonfleet release signers, generation 2\n{allowed_signers(trusted)}"
        (boot / host / "bootstrap.sh").write_text(bootstrap.script(
            {"host": host, "origin": "http://127.0.0.1:1"}, "0" * 64, listed))
    res = check(str(inventory(tmp_path)), "--pull-origin", str(origin_dir), "--sign-key", str(key),
                "--bootstrap-dir", str(boot), "--json")
    found = {r["what"] for r in rows(res) if r["check"] == "pull origin"}
    assert f"trusts {key} (hosts: h1)" in found, res.stdout
    [bad] = [r for r in failed(res, "pull origin") if "bootstrap script" in r["what"]]
    assert "(hosts: h2)" in bad["what"]

# ---- Prometheus and Alertmanager --------------------------------------------------------------

def prometheus_files(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "prom"
    res = tritonfleet("prometheus", str(inventory(tmp_path)), "--out", str(out), *args)
    assert res.returncode == 0, res.stderr
    return out


def test_quarantine_url_without_alertmanager_is_the_silent_miswiring(tmp_path):
    """newcomer 48: alertmanager.yml routes to the receiver, prometheus.yml sends no alert."""
    out = prometheus_files(tmp_path, "--quarantine-url", "http://127.0.0.1:9095", "--alertmanager", "127.0.0.1:9093")
    prom = yaml.safe_load((out / "prometheus.yml").read_text())
    del prom["alerting"]  # `prometheus` refuses to write this now; a hand-edited or older file
    (out / "prometheus.yml").write_text(yaml.safe_dump(prom))
    res = check(str(inventory(tmp_path)), "--prometheus-dir", str(out), "--json")
    assert res.returncode == 1
    bad = failed(res, "prometheus")
    assert any("no alerting: section" in r["what"] and "--alertmanager HOST:PORT" in r["fix"] for r in bad)
    assert any(r["what"].startswith("promtool accepts") for r in rows(res))
    assert any(r["what"].startswith("amtool accepts") for r in rows(res))


def test_alertmanager_as_a_url_in_prometheus_and_host_port_as_the_webhook(tmp_path):
    """newcomer 49: host:port where a URL is needed, and the reverse."""
    out = prometheus_files(tmp_path, "--quarantine-url", "http://127.0.0.1:9095", "--alertmanager", "127.0.0.1:9093")
    prom = yaml.safe_load((out / "prometheus.yml").read_text())
    prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = ["http://127.0.0.1:9093"]
    (out / "prometheus.yml").write_text(yaml.safe_dump(prom))
    am = yaml.safe_load((out / "alertmanager.yml").read_text())
    am["receivers"][1]["webhook_configs"][0]["url"] = "127.0.0.1:9095/alerts"
    (out / "alertmanager.yml").write_text(yaml.safe_dump(am))
    res = check(str(inventory(tmp_path)), "--prometheus-dir", str(out), "--json")
    assert res.returncode == 1
    bad = failed(res, "prometheus")
    assert any("Prometheus wants host:port" in r["what"] and "--alertmanager 127.0.0.1:9093" in r["fix"] for r in bad)
    assert any("is not a URL" in r["what"] and "--quarantine-url http://" in r["fix"] for r in bad)


def test_an_alertmanager_that_does_not_answer(tmp_path):
    port = free_port()
    out = prometheus_files(tmp_path, "--quarantine-url", "http://127.0.0.1:9095", "--alertmanager",
                           f"127.0.0.1:{port}")
    res = check(str(inventory(tmp_path)), "--prometheus-dir", str(out), "--json")
    bad = failed(res, "prometheus")
    assert [r["what"].split(" (")[0] for r in bad] == [f"Alertmanager at 127.0.0.1:{port}"]


# ---- the quarantine receiver ------------------------------------------------------------------

def test_an_unreachable_receiver(tmp_path):
    res = check(str(inventory(tmp_path, quarantine_url=f"http://127.0.0.1:{free_port()}")), "--json")
    assert res.returncode == 1
    [bad] = failed(res, "quarantine")
    assert "does not answer" in bad["what"] and "quarantine unit" in bad["fix"]


def test_the_real_receiver_with_and_without_its_token(tmp_path):
    """The receiver itself: with the inventory's token file the check passes and sees that the
    receiver refuses requests without one; without the file it says the receiver wants one."""
    token_file = tmp_path / "quarantine.token"
    hosts = [FleetHost(h, ["fleet"], {"quarantine_budget": 1, "lb": None, "quarantine_check_interval": 1,
                                      "quarantine_gate_timeout": 5, "quarantine_resolve_grace": 60}) for h in HOSTS]
    rec = quarantine.Receiver(hosts, tmp_path / "state", echo=lambda s: None, balancer_of=lambda fh: None)
    listen = f"127.0.0.1:{free_port()}"
    thread = threading.Thread(target=quarantine.serve, args=(rec, listen, [quarantine.Caller("operator", "s3cr3t")]),
                              daemon=True)
    thread.start()
    try:
        _until_answers(f"http://{listen}/-/healthy")
        inv = _token_inventory(tmp_path, f"http://{listen}", token_file)
        [bad] = failed(check(inv, "--json"), "quarantine")
        assert "wants a token" in bad["what"]
        token_file.write_text("s3cr3t\n")
        os.chmod(token_file, 0o600)
        res = check(inv, "--json")
    finally:
        rec.stop.set()
        thread.join(30)
    assert res.returncode == 0 and "refuses requests without a token" in res.stdout, res.stdout


def test_a_receiver_without_a_token(tmp_path):
    """A receiver that answers anyone (an older release): the check says so."""
    with ok_server(json.dumps({"hosts": {}, "events": []}).encode()) as address:
        res = check(str(inventory(tmp_path, quarantine_url=f"http://{address}")), "--json")
    assert res.returncode == 1
    [bad] = failed(res, "quarantine")
    assert "accepts requests without a token" in bad["what"] and "upgrade/restart it" in bad["fix"]


class _TokenReceiver(BaseHTTPRequestHandler):
    """GET /v1/quarantine as a receiver with a bearer token answers it: 200 with the token, 401
    without or with another."""

    def do_GET(self):  # noqa: N802 - http.server's name
        ok = self.headers.get("Authorization") == f"Bearer {self.server.token}"  # type: ignore[attr-defined]
        body = json.dumps({"hosts": {}, "events": self.server.events} if ok  # type: ignore[attr-defined]
                          else {"error": "a bearer token is required"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def token_receiver(token: str, events: list | None = None):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _TokenReceiver)
    srv.token, srv.events = token, events or []  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _token_inventory(tmp_path: Path, url: str, token_file: Path) -> str:
    return str(inventory(tmp_path, quarantine_url=url, quarantine_token_file=str(token_file)))


def test_the_receivers_token(tmp_path):
    token_file = tmp_path / "quarantine.token"
    events = [{"action": "alertmanager", "host": "-", "text": "cannot read 127.0.0.1:9093/api/v2/alerts?x: "
               "<urlopen error unknown url type: 127.0.0.1> (the webhook's alerts stand meanwhile)"}]
    with token_receiver("s3cr3t") as url:
        inv = _token_inventory(tmp_path, url, token_file)
        res = check(inv, "--json")  # no token file
        [bad] = failed(res, "quarantine")
        assert "wants a token" in bad["what"] and "mode 0600" in bad["fix"]
        token_file.write_text("wrong\n")
        os.chmod(token_file, 0o600)
        [bad] = failed(check(inv, "--json"), "quarantine")
        assert bad["what"].startswith("token refused:")
        token_file.write_text("s3cr3t\n")
        res = check(inv, "--json")
        assert res.returncode == 0 and "refuses requests without a token" in res.stdout
        os.chmod(token_file, 0o644)
        [bad] = failed(check(inv, "--json"), "quarantine")
        assert "others can read the token" in bad["what"] and bad["fix"] == f"chmod 600 {token_file}"
    os.chmod(token_file, 0o600)
    with token_receiver("s3cr3t", events) as url:  # newcomer 49: serve --alertmanager host:port
        [bad] = failed(check(_token_inventory(tmp_path, url, token_file), "--json"), "quarantine")
    assert "cannot read Alertmanager" in bad["what"] and "--alertmanager http://HOST:PORT" in bad["fix"]


def _until_answers(url: str) -> None:
    import time

    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.1)


# ---- the load balancer ------------------------------------------------------------------------

def test_haproxy_sockets_that_do_not_answer_and_a_server_not_in_the_backend(tmp_path):
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts, never answers
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(4)
    try:
        with ok_server() as backend, HAProxy(tmp_path, [("h1", backend)]) as hap:
            inv = str(inventory(tmp_path, lb="haproxy", lb_haproxy_sockets=[hap.socket]))
            res = check(inv, "--json")
            assert res.returncode == 1
            [bad] = failed(res, "load balancer")
            assert "no server 'h2'" in bad["what"] and "(hosts: h2)" in bad["what"]
            assert "1 host(s) have their server" in res.stdout
            for sock in (str(tmp_path / "nothing.sock"), str(tmp_path / "silent.sock")):
                res = check(str(inventory(tmp_path, name=Path(sock).stem, lb="haproxy",
                                          lb_haproxy_sockets=[sock])), "--json")
                [bad] = failed(res, "load balancer")
                assert sock in bad["what"] and "lb_haproxy_sockets" in bad["fix"], bad
    finally:
        silent.close()


# ---- generated pointers and reports -----------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                     max_leaves=8)
_files = st.one_of(st.binary(max_size=60), _json.map(lambda v: json.dumps(v).encode()),
                   st.fixed_dictionaries({"payload": _json.map(json.dumps) | st.text(max_size=30),
                                          "signature": st.text(max_size=30)}).map(lambda v: json.dumps(v).encode()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pointer=_files, report=_files)
def test_generated_pointers_and_reports_are_rows_never_a_traceback(tmp_path, pointer, report):
    """Whatever lies under desired/ and reports/ (anyone who can PUT there may write it), the pull
    origin's check gives rows: a pointer that is not this host's release pointer fails, named."""
    from tritonfleet.fleet import wiring

    origin_dir = tmp_path / "origin"
    for d in ("releases", "desired", "reports", "dist"):
        (origin_dir / d).mkdir(parents=True, exist_ok=True)
    (origin_dir / "desired" / "h1.json").write_bytes(pointer)
    (origin_dir / "reports" / "h1.json").write_bytes(report)
    w = wiring.Wiring("inv.py", [FleetHost("h1", ["fleet"], {})], pull_origin=origin_dir)
    out = wiring.pull_origin_rows(w)
    assert all(r.status in ("ok", "warn", "fail") and r.check == "pull origin" for r in out)
    payload = read_pointer(origin_dir / "desired" / "h1.json")
    if not (isinstance(payload, dict) and payload.get("host") == "h1"):
        assert any("desired/h1.json is not a release pointer" in r.what and r.status == "fail" for r in out)


def test_an_s3_origin_without_boto3_names_the_locked_install(monkeypatch):
    """Pre-flight and check say the same: README's hashed install of requirements-s3.lock, not an
    unpinned `pip install 'tritonfleet[s3]'`."""
    from tritonfleet.core.errors import UsageError
    from tritonfleet.fleet import wiring
    from tritonfleet.model_repo import origin as origins
    from tritonfleet.settings.defaults import DEFAULTS

    monkeypatch.setitem(__import__("sys").modules, "boto3", None)  # not installed
    data = {**DEFAULTS, "model_origin": "s3://models-prod/triton"}
    [row] = wiring.model_origin_rows(wiring.Wiring("inv.py", [FleetHost("h1", ["fleet"], data)]))
    assert row.status == "fail" and "pip install --require-hashes --no-deps -r requirements-s3.lock" in row.what
    with pytest.raises(UsageError, match="requirements-s3.lock"):  # what pre-flight's check_model_origin says
        origins.S3Store(origins.from_settings(FleetHost("h1", [], data)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(others=st.lists(st.text("ABCDEFabcdef0123456789+/", min_size=43, max_size=43), max_size=3),
       listed=st.booleans(), comments=st.lists(st.sampled_from(["# tritonfleet release signers, generation 7", "#"]),
                                                max_size=2),
       at=st.integers(0, 3))
def test_generated_signers_lists_pass_exactly_when_they_hold_the_key(tmp_path, others, listed, comments, at):
    """Whatever the list's order and comment lines, a host's script passes iff it lists the key."""
    from tritonfleet.fleet.wiring.pull_origin import _host_signers

    key = ["ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAI" + "k" * 43]
    lines = [f'tritonfleet-release namespaces="tritonfleet-release" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{o}'
             for o in others if o != key[1][25:]]
    if listed:
        lines.insert(min(at, len(lines)), f'tritonfleet-release namespaces="tritonfleet-release" {" ".join(key)} new')
    out = tmp_path / "boot"
    (out / "h1").mkdir(parents=True, exist_ok=True)
    (out / "h1" / "bootstrap.sh").write_text(bootstrap.script(
        {"host": "h1", "origin": "http://127.0.0.1:1"}, "0" * 64, "\n".join(comments + lines) + "\n"))
    _, status, what, _ = _host_signers(out, "h1", key, Path("keys/release"))
    assert (status == "ok") == listed, what
