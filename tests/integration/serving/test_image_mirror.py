"""The image mirror (tritonfleet.serving.image_mirror) against Debian's registry on this machine,
as upstream and as pull-through mirror: manifests read, the mirror filled once from the upstream
whatever the number of hosts. Bytes are counted at the upstream from its own logs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tritonfleet.serving import image_mirror
from tritonfleet_testbed.origin_servers import Registry


def test_manifests_give_the_platform_and_its_blobs():
    d = lambda c: "sha256:" + c * 64  # noqa: E731
    index = {"manifests": [{"digest": d("1"), "platform": {"os": "linux", "architecture": "arm64"}},
                           {"digest": d("2"), "platform": {"os": "linux", "architecture": "amd64"}}]}
    assert image_mirror.parse_manifest(__import__("json").dumps(index)) == ("index", [d("2")])
    image = {"config": {"digest": d("3")}, "layers": [{"digest": d("4")}, {"digest": d("5")}]}
    assert image_mirror.parse_manifest(__import__("json").dumps(image)) == ("image", [d("3"), d("4"), d("5")])
    with pytest.raises(ValueError, match="no linux/amd64"):
        image_mirror.parse_manifest('{"manifests": []}')


def small_image(tmp_path: Path, mb: int) -> Path:
    from tritonfleet_testbed.standin_images import write_image_archive

    root = tmp_path / "rootfs"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "weights.bin").write_bytes(os.urandom(mb << 20))
    out = tmp_path / "image.tar.gz"
    write_image_archive(root, out, ["nvcr.io/nvidia/tritonserver:24.08-py3"], {"Cmd": ["true"]}, compresslevel=1)
    return out


def pull(registry: str, ref: str, dest: Path) -> None:
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{registry}/{ref}",
                    f"dir:{dest}"], check=True, timeout=300, capture_output=True)


def test_a_filled_mirror_costs_the_upstream_the_image_once_whatever_the_hosts(tmp_path):
    archive = small_image(tmp_path, 64)
    with Registry(tmp_path / "up") as up:
        digest = up.push(archive, "nvidia/tritonserver:24.08-py3")
        with Registry(tmp_path / "cold", proxy=f"http://{up.host}") as cold:
            mark = up.mark()
            pull(cold.host, f"nvidia/tritonserver@{digest}", tmp_path / "p0")
            size = sum(p.stat().st_size for p in (tmp_path / "p0").iterdir() if p.name.startswith(("sha", "0", "1",
                       "2", "3", "4", "5", "6", "7", "8", "9", "a", "b", "c", "d", "e", "f")) and len(p.name) == 64)
            # Distribution 2.8's proxy: a blob it lacks is fetched twice (client and store; the
            # store's fetch may end, and be logged, after the client has it all)
            for _ in range(100):
                if up.blob_bytes(mark) >= 1.9 * size:
                    break
                time.sleep(0.1)
            assert up.blob_bytes(mark) >= 1.9 * size
        with Registry(tmp_path / "mirror", proxy=f"http://{up.host}") as mirror:
            url = f"http://{mirror.host}"
            text = subprocess.run(image_mirror.manifest_command(url, "nvidia/tritonserver", digest), shell=True,
                                  capture_output=True, text=True, check=True).stdout
            _, blobs = image_mirror.parse_manifest(text)
            mark = up.mark()
            res = subprocess.run(["sh", "-c", image_mirror.fill_script(url, "nvidia/tritonserver", blobs,
                                                                       str(mirror.storage))],
                                 capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stdout + res.stderr
            assert sorted(image_mirror.parse_fill(res.stdout.splitlines())["filled"]) == sorted(blobs)
            time.sleep(1)  # a request cut by the fill is logged when the upstream notices
            filled = up.blob_bytes(mark)
            # once, plus what got through for the request the fill cut (a read at full speed: 2x;
            # bench/run.py mirror-fill measures the overhead: about 2 MB a blob here)
            assert size <= filled <= size + (16 << 20), (filled, size)
            mark = up.mark()
            threads = [threading.Thread(target=pull, args=(mirror.host, f"nvidia/tritonserver@{digest}",
                                                            tmp_path / f"p{i}")) for i in range(1, 4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert up.blob_bytes(mark) == 0  # three pulls, all from the mirror's store
            again = subprocess.run(["sh", "-c", image_mirror.fill_script(url, "nvidia/tritonserver", blobs,
                                                                         str(mirror.storage))],
                                   capture_output=True, text=True, timeout=60)
            assert sorted(image_mirror.parse_fill(again.stdout.splitlines())["cached"]) == sorted(blobs)
    shutil.rmtree(tmp_path / "p0", ignore_errors=True)


def test_a_fill_whose_upstream_hangs_asks_again_then_names_every_blob_it_lacks(tmp_path):
    """The upstream stops answering (SIGSTOP) after the manifest: no upload into the mirror's
    store grows, so each blob is asked for ``attempts`` times, ``stall`` seconds each, then named
    as failed; once the upstream answers again, the same fill brings every blob in."""
    archive = small_image(tmp_path, 8)
    with Registry(tmp_path / "up") as up:
        digest = up.push(archive, "nvidia/tritonserver:24.08-py3")
        with Registry(tmp_path / "mirror", proxy=f"http://{up.host}") as mirror:
            url = f"http://{mirror.host}"
            text = subprocess.run(image_mirror.manifest_command(url, "nvidia/tritonserver", digest), shell=True,
                                  capture_output=True, text=True, check=True).stdout
            _, blobs = image_mirror.parse_manifest(text)
            script = image_mirror.fill_script(url, "nvidia/tritonserver", blobs, str(mirror.storage), attempts=2,
                                              stall=1)
            assert up.proc is not None
            os.kill(up.proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
                took = time.monotonic() - t0
            finally:
                os.kill(up.proc.pid, signal.SIGCONT)
            assert res.returncode == 1, res.stdout + res.stderr
            failed = image_mirror.parse_fill(res.stdout.splitlines())["failed"]
            assert sorted(f.split(" ", 1)[0] for f in failed) == sorted(blobs)
            assert all(f.endswith("after 2 requests: no byte reached its upload into the store for 1 s")
                       for f in failed), failed
            # two requests a blob, each given up after a second without progress (and the request's own second)
            assert 2 * len(blobs) <= took < 30, took
            again = subprocess.run(["sh", "-c", image_mirror.fill_script(url, "nvidia/tritonserver", blobs,
                                                                         str(mirror.storage))],
                                   capture_output=True, text=True, timeout=120)
            assert again.returncode == 0, again.stdout + again.stderr
            done = image_mirror.parse_fill(again.stdout.splitlines())
            assert sorted(done["filled"] + done["cached"]) == sorted(blobs)


class _TokenUpstream:
    """A registry upstream as NGC answers: /v2/ asks for a Bearer token, whose realm is asked with
    the proxy's basic credentials; records the credentials each token request carried."""

    def __init__(self):
        import base64
        import http.server

        outer = self
        self.logins: list[str] = []

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path.startswith("/token"):
                    auth = self.headers.get("Authorization", "")
                    outer.logins.append(base64.b64decode(auth[6:]).decode() if auth.startswith("Basic ") else auth)
                    body = b'{"token": "t", "access_token": "t", "expires_in": 300}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                elif self.headers.get("Authorization") == "Bearer t":
                    body = b'{"errors": [{"code": "MANIFEST_UNKNOWN", "message": "unknown"}]}'
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                else:
                    body = b'{"errors": [{"code": "UNAUTHORIZED", "message": "login"}]}'
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", f'Bearer realm="{outer.url}/token",service="up"')
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_mirror_logs_in_upstream_from_its_environment_and_listens_only_on_its_address(tmp_path):
    """Debian's registry (2.8) with the configuration tritonfleet writes: no password in
    config.yml; the upstream login (a token asked for with basic credentials, as NGC does) made
    with the password from $REGISTRY_PROXY_PASSWORD, the unit's EnvironmentFile; and http.addr the
    mirror's own address, so another address of the machine is refused (security-review-2
    findings 8 and 9)."""
    import socket

    from tritonfleet_testbed.origin_servers import free_port

    user, secret = "$oauthtoken", "nvapi-upstream-s3cr3t"
    up = _TokenUpstream()
    try:
        port = free_port("127.0.0.1")
        addr = image_mirror.listen_address(f"127.0.0.1:{port}", None, port)
        config = image_mirror.registry_config(addr, str(tmp_path / "mirror" / "data"), up.url, user)
        assert secret not in config and addr == f"127.0.0.1:{port}"
        with Registry(tmp_path / "mirror", port=port, config=config, env={image_mirror.PASSWORD_VAR: secret}):
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.2", port), timeout=2).close()
            subprocess.run(image_mirror.manifest_command(f"http://{addr}", "nvidia/tritonserver", "sha256:" + "a" * 64)
                           .replace("--retry 30", "--retry 3"), shell=True, capture_output=True, timeout=60)
        assert up.logins and set(up.logins) == {f"{user}:{secret}"}, up.logins
    finally:
        up.close()


@pytest.mark.parametrize("mirror,listen,want", [
    ("10.0.0.5:5000", None, "10.0.0.5:5000"), ("mirror.internal:5000", None, "mirror.internal:5000"),
    ("[fd00::5]:5000", None, "[fd00::5]:5000"), ("mirror.internal:5000", "10.0.0.5", "10.0.0.5:5000"),
    ("10.0.0.5:5000", "fd00::5", "[fd00::5]:5000"), ("0.0.0.0:5000", None, ValueError),
    ("mirror:5000", "::", ValueError), ("mirror:5000", "0.0.0.0", ValueError),
])
def test_the_mirror_listens_on_a_named_address_never_on_every_one(mirror, listen, want):
    if want is ValueError:
        with pytest.raises(ValueError, match="every address"):
            image_mirror.listen_address(mirror, listen, 5000)
    else:
        assert image_mirror.listen_address(mirror, listen, 5000) == want


@pytest.mark.parametrize("listen,refused", [("10.0.0.5", False), ("mirror.internal", False), ("fd00::5", False),
                                            ("0.0.0.0", True), ("::", True), ("[::]", True), ("", True),
                                            ("10.0.0.5:5000 ", True), (5000, True)])
def test_the_settings_check_refuses_every_address_for_the_mirror(listen, refused):
    from tritonfleet.gpu.rules import GPU_CLASSES
    from tritonfleet.settings import check

    found = check.problems("m1", {"image_mirror_listen": listen}, lambda k: "here", GPU_CLASSES)
    assert bool(found) == refused, found


# --------------------------------------------------------------------------- client authentication

CLIENT_SECRET = "mirror-cl1ent \"q'uo`$(id)`\\te"


@pytest.fixture(scope="module")
def htpasswd_env(tmp_path_factory):
    """PATH and LD_LIBRARY_PATH with Debian's htpasswd (apache2-utils and its libraries, unpacked
    here as the mirror host installs them) and a systemctl that records what it was asked."""
    from tritonfleet_testbed.standin_repo import debian_package

    root = tmp_path_factory.mktemp("htpasswd")
    for name in ("apache2-utils", "libapr1", "libaprutil1"):
        subprocess.run(["dpkg-deb", "-x", str(debian_package(name)), str(root)], check=True)
    (root / "bin").mkdir()
    (root / "bin" / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >> {root}/restarts\n")
    (root / "bin" / "systemctl").chmod(0o755)
    libs = [str(p) for p in root.glob("usr/lib/*-linux-gnu")]
    return root, {**os.environ, "PATH": f"{root}/bin:{root}/usr/bin:{os.environ['PATH']}",
                  "LD_LIBRARY_PATH": ":".join(libs)}


def write_htpasswd(env, path: Path, secret: str, user: str = "tritonfleet"):
    # group root here: the mirror host's is docker-registry, the user the registry runs as
    return subprocess.run(["sh", "-c", image_mirror.htpasswd_script(str(path), user, "docker-registry", "root")],
                          input=secret, capture_output=True, text=True, env=env, timeout=60)


def status(url: str, *curl: str, stdin: str | None = None) -> str:
    return subprocess.run(["sh", "-c", "curl -s -o /dev/null -w '%{http_code}' \"$@\"", "curl", *curl, url],
                          input=stdin, capture_output=True, text=True, timeout=60).stdout


def test_the_mirror_refuses_a_client_without_its_login_and_fills_with_it(tmp_path, htpasswd_env):
    """security-review-2 finding 8: whoever reached the mirror pulled through its upstream login.
    Debian's registry (2.8) with the configuration tritonfleet writes and the htpasswd file its
    script writes: /v2/ and a manifest asked without credentials, or with a wrong password, are
    refused 401; the manifest and the fill with the client's password on stdin succeed."""
    _, env = htpasswd_env
    archive = small_image(tmp_path, 2)
    with Registry(tmp_path / "up") as up:
        digest = up.push(archive, "nvidia/tritonserver:24.08-py3")
        from tritonfleet_testbed.origin_servers import free_port

        port = free_port("127.0.0.1")
        htpasswd = tmp_path / "mirror" / "htpasswd"
        res = write_htpasswd(env, htpasswd, CLIENT_SECRET + "\n")
        assert res.stdout.strip() == "secret changed", res
        config = image_mirror.registry_config(f"127.0.0.1:{port}", str(tmp_path / "mirror" / "data"),
                                              f"http://{up.host}", htpasswd=str(htpasswd))
        assert CLIENT_SECRET not in config and CLIENT_SECRET not in htpasswd.read_text()
        with Registry(tmp_path / "mirror", port=port, config=config) as mirror:
            url = f"http://{mirror.host}"
            manifest = f"{url}/v2/nvidia/tritonserver/manifests/{digest}"
            assert status(f"{url}/v2/") == "401"
            assert status(manifest) == "401"
            assert status(manifest, "-u", "tritonfleet:wrong") == "401"
            assert status(manifest, "-u", "other:" + CLIENT_SECRET) == "401"
            assert up.blob_bytes() == 0
            # the manifest and the fill as the mirror's client, the password on stdin
            got = subprocess.run(["sh", "-c", image_mirror.manifest_command(url, "nvidia/tritonserver", digest,
                                                                            user="tritonfleet")],
                                 input=CLIENT_SECRET + "\n", capture_output=True, text=True, timeout=120)
            assert got.returncode == 0, got.stderr
            _, blobs = image_mirror.parse_manifest(got.stdout)
            res = subprocess.run(["sh", "-c", image_mirror.fill_script(url, "nvidia/tritonserver", blobs,
                                                                       str(mirror.storage), user="tritonfleet")],
                                 input=CLIENT_SECRET + "\n", capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stdout + res.stderr
            assert sorted(image_mirror.parse_fill(res.stdout.splitlines())["filled"]) == sorted(blobs)
            # without the password the fill gets nothing through (a blob it lacks is asked for in vain)
            nothing = subprocess.run(["sh", "-c", image_mirror.fill_script(url, "nvidia/tritonserver", blobs,
                                                                           str(mirror.storage), user="tritonfleet")],
                                     input="", capture_output=True, text=True, timeout=60)
            assert nothing.returncode == 2 and "no mirror client secret" in nothing.stderr


def test_the_htpasswd_file_is_bcrypt_0640_and_rewritten_only_when_the_secret_changes(tmp_path, htpasswd_env):
    """The htpasswd writer run by sh with the secret on stdin: a bcrypt hash the secret verifies,
    0640, ``secret same`` (no restart) the second time, rewritten for a new secret or user; a
    secret with quotes, ``$(...)``, backquotes and backslashes is hashed as it is; an empty one, a
    line break, a control character or more than bcrypt's 72 bytes are refused (exit 2) and the
    file is left as it was."""
    import stat

    root, env = htpasswd_env
    restarts = root / "restarts"
    restarts.unlink(missing_ok=True)
    path = tmp_path / "etc" / "htpasswd"

    def verifies(secret: str, user: str = "tritonfleet") -> bool:
        return subprocess.run(["htpasswd", "-v", "-i", str(path), user], input=secret + "\n", env=env, text=True,
                              capture_output=True).returncode == 0

    for secret, user, said in ((CLIENT_SECRET, "tritonfleet", "secret changed"),
                               (CLIENT_SECRET, "tritonfleet", "secret same"),
                               ("second", "tritonfleet", "secret changed"),
                               ("second", "fleet2", "secret changed")):
        res = write_htpasswd(env, path, secret + "\n", user)
        assert res.stdout.strip() == said and res.returncode == 0, res
        assert verifies(secret, user) and not verifies(secret + "x", user)
        line = path.read_text()
        assert line.startswith(f"{user}:$2y$") and line.count("\n") == 1 and secret not in line
        assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_uid == 0
    assert restarts.read_text().splitlines() == ["try-restart docker-registry"] * 3
    before = path.read_text()
    for bad in ("", "first\nsecond", "tab\there", "cr\r", "x" * 73, "é" * 37):
        res = write_htpasswd(env, path, bad + "\n", "fleet2")
        assert res.returncode == 2 and res.stdout.startswith("error"), (bad, res)
        assert path.read_text() == before
    assert write_htpasswd(env, path, "x" * 72, "fleet2").stdout.strip() == "secret changed"
    assert sorted(p.name for p in path.parent.iterdir()) == ["htpasswd"]


@pytest.mark.parametrize("secret,ok", [(CLIENT_SECRET, True), ("x" * 72, True), ("", False), (None, False),
                                       ("a\nb", False), ("a\r", False), ("x" * 73, False), ("é" * 37, False)])
def test_the_client_secret_is_one_line_of_at_most_72_bytes(secret, ok):
    assert (image_mirror.client_secret_problem(secret) is None) == ok


def test_the_htpasswd_writer_and_the_control_machine_agree_on_every_secret(tmp_path, htpasswd_env):
    """Generated secrets (any characters, quotes, ``$``, backslashes, control characters, long
    ones): the writer on the host refuses exactly what :func:`client_secret_problem` refuses on
    the control machine (pre-flight), and what it takes verifies as it is."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    _, env = htpasswd_env
    path = tmp_path / "htpasswd"
    alphabet = st.sampled_from(list("aZ9 '\"$`\\;|&*?[]{}()#~!:=%-_é\t\r\x7f\x01"))

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    # the length first (uniform up to 90 bytes' worth), then the characters: long secrets come often
    @given(st.integers(0, 90).flatmap(lambda n: st.text(alphabet, min_size=n, max_size=n)))
    def check(secret):
        res = write_htpasswd(env, path, secret + "\n")
        if image_mirror.client_secret_problem(secret):
            assert res.returncode == 2 and res.stdout.startswith("error"), (secret, res)
        else:
            assert res.returncode == 0 and res.stdout.strip() in ("secret changed", "secret same"), (secret, res)
            ok = subprocess.run(["htpasswd", "-v", "-i", str(path), "tritonfleet"], input=secret + "\n", env=env,
                                text=True, capture_output=True)
            assert ok.returncode == 0, (secret, ok)

    check()


@pytest.mark.parametrize("user,refused", [("tritonfleet", False), ("fleet.pull-2@site", False), ("a:b", True),
                                          ("two words", True), ("", True), (None, True), ("x\n", True),
                                          ("x" * 65, True)])
def test_the_settings_check_refuses_a_client_name_htpasswd_cannot_hold(user, refused):
    from tritonfleet.gpu.rules import GPU_CLASSES
    from tritonfleet.settings import check

    found = check.problems("m1", {"mirror_client_user": user}, lambda k: "here", GPU_CLASSES)
    assert bool(found) == refused, found
