"""The host-side fetch of a release's objects from a model origin (tritonfleet.model_repo.fetch),
with real curl from nginx on this machine: every sha256 verified, a cut transfer resumed, corrupt
and truncated objects refused and named, a down origin placing nothing."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from tritonfleet.model_repo import fetch
from tritonfleet.model_repo import release as release_plan
from tritonfleet_testbed.origin_servers import Nginx


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_fetch(base: Path, release: str, objects: dict, paths: dict, retries: int = 0) -> tuple[int, fetch.FetchResult]:
    script = fetch.fetch_script(str(base), release, "run1", parallel=4, retries=retries, connect_timeout=3)
    res = subprocess.run(["sh", "-c", script], input=fetch.fetch_list(objects, paths), capture_output=True,
                         text=True, timeout=120)
    return res.returncode, fetch.parse_fetch(res.stdout.splitlines())


def test_fetch_verifies_every_object_resumes_and_refuses_what_is_not_whole(tmp_path):
    blobs = {name: os.urandom(n) for name, n in (("a", 300_000), ("b", 5), ("c", 200_000), ("d", 100_000),
                                                  ("e", 400_000))}
    shas = {k: sha(v) for k, v in blobs.items()}
    base = tmp_path / "opt"
    inc = base / "releases" / release_plan.incoming_dir("rel1", "run1")
    (inc / "m" / "1").mkdir(parents=True)
    paths = {"m/1/model.onnx": shas["a"], "m/a copy": shas["a"], "m/-odd 'name'": shas["b"],
             "m/c.bin": shas["c"], "m/d.bin": shas["d"], "m/e.bin": shas["e"], "m/empty": sha(b"")}
    with Nginx(tmp_path / "nginx") as web:
        for k, data in blobs.items():
            p = web.object_path(shas[k])
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        web.object_path(shas["c"]).write_bytes(os.urandom(200_000))  # corrupt: same size, other bytes
        web.object_path(shas["d"]).write_bytes(blobs["d"][:60_000])  # truncated at the origin
        objdir = base / "releases" / fetch.OBJECTS_DIR
        objdir.mkdir(parents=True)
        (objdir / shas["e"]).write_bytes(blobs["e"][:150_000])  # what a cut transfer left
        objects = {shas[k]: (len(v), f"{web.url}/objects/sha256/{shas[k]}") for k, v in blobs.items()}
        objects[sha(b"")] = (0, f"{web.url}/objects/sha256/{sha(b'')}")
        mark = web.mark()
        rc, res = run_fetch(base, "rel1", objects, paths)
        assert rc == 1 and not res.ok and res.placed == 0, res
        assert set(res.corrupt) == {shas["c"]} and set(res.short) == {shas["d"]}, res
        assert res.resumed == {shas["e"]: 150_000}
        assert not (objdir / shas["c"]).exists()  # refused and deleted
        assert sorted(p.name for p in inc.rglob("*") if p.is_file()) == []  # nothing placed
        served = web.served(mark)
        assert served[shas["e"]] == 250_000  # only the rest of the cut transfer
        lines = fetch.problems(res, paths, web.url, lambda s: f"objects/sha256/{s}")
        assert any(ln.startswith("corrupt: m/c.bin") and shas["c"] in ln for ln in lines), lines
        assert any(ln.startswith("incomplete: m/d.bin") and "truncated" in ln for ln in lines), lines

        # the origin repaired: the next run fetches only what is missing, and places everything
        web.object_path(shas["c"]).write_bytes(blobs["c"])
        web.object_path(shas["d"]).write_bytes(blobs["d"])
        mark = web.mark()
        rc, res = run_fetch(base, "rel1", objects, paths)
        assert rc == 0 and res.ok and res.placed == len(paths), res
        served = web.served(mark)
        assert served == {shas["c"]: 200_000, shas["d"]: 40_000}  # d resumed from what arrived
        for path, s in paths.items():
            assert sha((inc / path).read_bytes()) == s
        assert (inc / "m/1/model.onnx").stat().st_ino == (inc / "m/a copy").stat().st_ino  # fetched once


def test_fetch_from_an_origin_that_is_down_places_nothing(tmp_path):
    from tritonfleet_testbed.origin_servers import free_port

    base = tmp_path / "opt"
    inc = base / "releases" / release_plan.incoming_dir("rel1", "run1")
    inc.mkdir(parents=True)
    s = sha(b"x" * 10)
    rc, res = run_fetch(base, "rel1", {s: (10, f"http://127.0.0.1:{free_port()}/objects/sha256/{s}")}, {"f": s})
    assert rc == 1 and not res.ok and s in res.short
    assert res.failed_transfer(s)[0] == 7  # curl: could not connect
    assert list(inc.iterdir()) == []




def _one_object(tmp_path: Path, web: Nginx) -> tuple[Path, str, bytes]:
    data = os.urandom(1000)
    p = web.object_path(sha(data))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    base = tmp_path / "opt"
    (base / "releases" / release_plan.incoming_dir("rel1", "run1")).mkdir(parents=True)
    return base, sha(data), data


def test_a_presigned_url_is_never_globbed(tmp_path):
    """A URL's '?' and '*' are glob characters where the script splits its list: a path in the
    fetch's working directory that matches must not replace the URL (``set -f``)."""
    with Nginx(tmp_path / "nginx") as web:
        base, s, data = _one_object(tmp_path, web)
        url = f"{web.url}/objects/sha256/{s}?X-Amz-Signature=ab*"
        cwd = tmp_path / "login"
        decoy = cwd / url.split("?", 1)[0].replace("//", "/")
        decoy.parent.mkdir(parents=True)
        Path(f"{decoy}XX-Amz-Signature=abdecoy").write_text("")  # what the glob would pick
        script = fetch.fetch_script(str(base), "rel1", "run1", retries=0, connect_timeout=3)
        res = subprocess.run(["sh", "-c", script], input=fetch.fetch_list({s: (len(data), url)}, {"f": s}),
                             capture_output=True, text=True, timeout=60, cwd=cwd)
        out = fetch.parse_fetch(res.stdout.splitlines())
        assert res.returncode == 0 and out.ok and out.placed == 1, res.stdout + res.stderr


def test_a_hostile_credentials_file_name_is_printed_not_run(tmp_path):
    """model_origin_credentials_file reaches the script's error message as data (printf '%s')."""
    mark = tmp_path / "PWNED"
    base = tmp_path / "opt"
    (base / "releases" / release_plan.incoming_dir("rel1", "run1")).mkdir(parents=True)
    file = f"/nonexistent/creds$(touch {mark})`touch {mark}`"
    script = fetch.fetch_script(str(base), "rel1", "run1", credentials=(file, "us-east-1"))
    res = subprocess.run(["sh", "-c", script], input="", capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and not mark.exists(), res
    assert fetch.parse_fetch(res.stdout.splitlines()).errors == [
        f"the origin credentials file {file} is missing on {os.uname().nodename}: {fetch.CREDENTIALS_FIX}"]


def test_no_credentials_are_left_behind_by_a_killed_fetch(tmp_path):
    """The curl config (presigned URLs, the host's S3 key) is removed when the fetch is ended by a
    signal (a lost SSH link, Ctrl-C), and what a SIGKILLed fetch left is removed by the next one."""
    import signal
    import socket
    import time

    base = tmp_path / "opt"
    (base / "releases" / release_plan.incoming_dir("rel1", "run1")).mkdir(parents=True)
    objdir = base / "releases" / fetch.OBJECTS_DIR
    objdir.mkdir(parents=True)
    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()
    for kind in ("curl", "list", "err"):
        (objdir / f"{kind}.{dead}").write_text("user = \"AKIA:secret\"\n")  # a SIGKILLed fetch's
    creds = tmp_path / "creds"
    creds.write_text("AWS_ACCESS_KEY_ID=AKIA\nAWS_SECRET_ACCESS_KEY=secret\n")
    with socket.socket() as hang:  # accepts, never answers
        hang.bind(("127.0.0.1", 0))
        hang.listen(8)
        s = sha(b"x")
        url = f"http://127.0.0.1:{hang.getsockname()[1]}/objects/sha256/{s}"
        script = fetch.fetch_script(str(base), "rel1", "run1", retries=0, credentials=(str(creds), "us-east-1"))
        proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, text=True)
        proc.stdin.write(fetch.fetch_list({s: (1, url)}, {"f": s}))
        proc.stdin.close()
        for _ in range(200):
            if (objdir / f"curl.{proc.pid}").exists() and not (objdir / f"curl.{dead}").exists():
                break
            time.sleep(0.05)
        for _ in range(200):  # curl is running (connected and waiting): on a loaded machine it takes a while
            if subprocess.run(["pgrep", "-s", str(proc.pid), "-x", "curl"], capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        assert (objdir / f"curl.{proc.pid}").exists() and not (objdir / f"curl.{dead}").exists()
        os.killpg(proc.pid, signal.SIGHUP)  # what the loss of the SSH session sends
        proc.wait(timeout=60)
    assert sorted(p.name for p in objdir.iterdir()) == [], proc.returncode
