"""Triton's secure-deployment defaults: restricted admin APIs with a per-host key, a non-root
container. Differential against the real tritonserver 2.51 of the nvidia-pytriton wheel: the
flags the unit gives Triton refuse an unauthenticated load, and the deploy's own load command
(run here by sh against the local server) gets through with the key file."""

from __future__ import annotations

import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
import requests

from tests.support.fakehost import defaults, run_fake
from tritonfleet.fleet import probe
from tritonfleet.serving import apikey, repository_api
from tritonfleet.serving.unit import render_unit, unit_context
from tritonfleet.settings import access as config
from tritonfleet.steps import triton
from tritonfleet_testbed.localtriton import LocalTriton

REPO = Path(__file__).resolve().parents[2] / "corpus" / "good" / "python"
KEY = "0123456789abcdef" * 4


def unit(**over) -> str:
    data = {**defaults("t4"), **over}
    return render_unit(unit_context(data))


def exec_start_argv(text: str) -> list[str]:
    """ExecStart's words as systemd passes them ("$$" is a literal "$", quotes group words)."""
    lines, on = [], False
    for line in text.splitlines():
        on = on or line.startswith("ExecStart=")
        if on:
            lines.append(line.rstrip("\\").strip())
            if not line.endswith("\\"):
                break
    return shlex.split(" ".join(lines).removeprefix("ExecStart=").replace("$$", "$"))


def test_unit_defaults_follow_the_guide():
    text = unit()
    argv = exec_start_argv(text)
    assert argv[argv.index("--user") + 1] == "triton-server"
    assert "-i" in argv and "StandardInput=file:/etc/tritonfleet/triton-api-key" in text
    i = argv.index("sh")
    assert argv[i + 1] == "-c" and argv[i + 3] == "tritonserver"
    assert KEY not in text and "api-key=" not in " ".join(argv[i + 3:])
    # the old behaviour is one tunable away
    off = exec_start_argv(unit(triton_restricted_apis=[], triton_container_user=""))
    assert "--user" not in off and "sh" not in off and "-i" not in off


def test_container_command_reads_the_key_from_stdin(tmp_path):
    """The unit's `sh -c` wrapper, run here with the key on stdin: tritonserver gets its own
    arguments, then the restriction flags with the key; without a key it refuses to start."""
    argv = exec_start_argv(unit(triton_model_control_mode="explicit"))
    i = argv.index("sh")
    fake = tmp_path / "tritonserver"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    cmd = argv[i:i + 3] + [str(fake)] + argv[i + 4:]
    out = subprocess.run(cmd, input=KEY + "\n", capture_output=True, text=True, check=True).stdout.splitlines()
    apis = ",".join(defaults()["triton_restricted_apis"])
    assert out == ["--model-repository=/opt/triton/model_repository", "--strict-model-config=true",
                   "--model-control-mode=explicit", "--load-model=*", "--exit-timeout-secs=30",
                   f"--http-restricted-api={apis}:tritonfleet-api-key={KEY}",
                   f"--grpc-restricted-protocol={apis}:tritonfleet-api-key={KEY}"]
    # a key file without its newline works too; an empty one stops the container
    assert subprocess.run(cmd, input=KEY, capture_output=True, text=True).returncode == 0
    empty = subprocess.run(cmd, input="", capture_output=True, text=True)
    assert empty.returncode == 2 and "no Triton API key" in empty.stderr


def test_key_is_made_on_the_host(tmp_path):
    path = tmp_path / "etc" / "tritonfleet" / "key"
    subprocess.run(["sh", "-c", apikey.key_command(str(path))], check=True)
    key = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # run again: the key stays, its mode is put right
    subprocess.run(["sh", "-c", apikey.key_command(str(path))], check=True)
    assert path.read_text() == key and stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("over,message", [
    ({"triton_restricted_apis": ["model-repository", "admin"]}, "'admin' is not a Triton API category"),
    ({"triton_api_key_file": "/opt/triton/key"}, "outside triton_base_dir"),
    ({"triton_api_key_file": "key"}, "plain absolute path"),
])
def test_bad_settings_are_refused(over, message):
    with pytest.raises(config.ConfigError, match=message):
        unit(**over)


def test_key_made_once_and_restart_when_new():
    """@fake: a host without the key gets it (made on the host; the control machine never sees
    it) and Triton restarts to take it; a host with it (0600 root) changes nothing for it."""
    _, cmds, state = run_fake(triton.triton_service, {}, {})
    names = [n for meta in state.op_meta.values() for n in meta.names]
    assert any("Triton API key /etc/tritonfleet/triton-api-key (made on the host)" in n for n in names)
    assert any("restart triton" in n for n in names)
    assert any("od -An -N32 -tx1 /dev/urandom" in c for c in cmds)
    have = {re.compile(r"\[ -f /etc/tritonfleet/triton-api-key \] && stat"): ["mode=600 user=root group=root",
                                                                             "0" * 64]}
    _, cmds, state = run_fake(triton.triton_service, have, {})
    names = [n for meta in state.op_meta.values() for n in meta.names]
    assert not any("API key" in n for n in names) and not any("urandom" in c for c in cmds)


@pytest.fixture(scope="module")
def restricted_triton(tmp_path_factory):
    """The wheel's tritonserver in explicit mode with the flags the unit gives it (on a copy of
    the corpus case: the python stub writes __pycache__ next to model.py)."""
    apis = defaults()["triton_restricted_apis"]
    repo = tmp_path_factory.mktemp("served") / "repo"
    subprocess.run(["cp", "-r", str(REPO), str(repo)], check=True)
    with LocalTriton(repo, model_control_mode="explicit",
                     extra_args=["--load-model=*", *apikey.flags(apis, KEY)]) as t:
        yield t


def _model(t) -> str:
    return requests.post(f"{t.http_url}/v2/repository/index", headers={apikey.HEADER: KEY},
                         timeout=10).json()[0]["name"]


def test_unauthenticated_load_and_unload_are_refused(restricted_triton):
    t = restricted_triton
    m = _model(t)
    for verb in ("unload", "load"):
        for headers in ({}, {apikey.HEADER: "wrong"}):
            r = requests.post(f"{t.http_url}/v2/repository/models/{m}/{verb}", headers=headers, timeout=10)
            assert r.status_code == 403 and "restricted" in r.text, (verb, r.status_code, r.text)
    for path in ("/v2/repository/index", f"/v2/models/{m}/config", f"/v2/models/{m}/stats", "/v2/logging",
                 "/v2/trace/setting"):
        assert requests.request("POST" if "repository" in path else "GET", t.http_url + path,
                                timeout=10).status_code == 403, path
    # what the health gate and clients use stays open; the model is still served
    assert requests.get(f"{t.http_url}/v2/health/ready", timeout=10).status_code == 200
    assert requests.get(f"{t.http_url}/v2/models/{m}/ready", timeout=10).status_code == 200


def test_deploys_own_load_gets_through(restricted_triton, tmp_path):
    """repository_api_commands, run by sh: the header comes from the key file."""
    t = restricted_triton
    m = _model(t)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    (tmp_path / "model_repository").symlink_to(REPO)
    port = int(t.http_url.rsplit(":", 1)[1])
    data = {"triton_http_bind": "127.0.0.1", "triton_http_port": port, "triton_base_dir": str(tmp_path),
            "triton_api_key_file": str(key_file)}
    # (find -exec touch on the model's directories: a copy, the corpus stays as it is)
    repo = tmp_path / "repo"
    subprocess.run(["cp", "-r", str(REPO), str(repo)], check=True)
    (tmp_path / "model_repository").unlink()
    (tmp_path / "model_repository").symlink_to(repo)
    cmd = repository_api.repository_api_commands(data, [m], [])
    ok = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    key_file.write_text("wrong\n")
    bad = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "restricted" in bad.stderr and f"load of {m} failed" in bad.stderr
    assert KEY not in ok.stderr + bad.stderr
    assert requests.get(f"{t.http_url}/v2/models/{m}/ready", timeout=10).status_code == 200


def test_status_probe_reads_the_index_with_the_key(restricted_triton, tmp_path):
    """`tritonfleet status`'s probe command, run by sh: the repository index (a restricted API)
    answers with the key file, and not without it."""
    t = restricted_triton
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    data = {**defaults(), "triton_http_bind": "127.0.0.1", "triton_http_port": int(t.http_url.rsplit(":", 1)[1]),
            "triton_base_dir": str(tmp_path), "triton_api_key_file": str(key_file)}
    cmd = probe.command(data)
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60).stdout
    index = " ".join(probe.parse(out)["models"])
    assert '"state":"READY"' in index, index
    key_file.unlink()
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60).stdout
    assert "restricted" in " ".join(probe.parse(out)["models"])
