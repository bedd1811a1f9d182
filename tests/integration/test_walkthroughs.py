"""docs/walkthroughs.md run as written: each walk-through's ```console commands, in order, in one
bash (``set -e``) in a scratch operator repository, its variables pointed at servers on loopback
that the fixtures start and stop by process id (nginx for the origins, tritonserver behind
HAProxy); Alertmanager and the receiver are started by the walk-through's own commands (its
background jobs end with its bash). Each command's exit status is checked, and every output line
the page shows (``...``: anything) must be in what it printed, in order. Blocks marked
``console not-run`` need a real host or the network: NOT_RUN names each with its reason and what
runs in its place."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.haproxy import HAProxy
from tests.support.tritonproc import copy_repository, local_server
from tritonfleet import ROOT, __version__
from tritonfleet.fleet.pull import bootstrap
from tritonfleet_testbed.origin_server import OriginServer
from tritonfleet_testbed.ports import free_port

DOC = ROOT / "docs" / "walkthroughs.md"
BIN = Path(sys.executable).parent
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"

#: each not-run command of the page: why the suite cannot run it, and the bash that stands in for it
#: (None: nothing needed, the walk-through's next steps do not depend on it)
NOT_RUN = {
    "pip wheel --no-deps -w dist .":
        ("builds from the package index; the fixture writes $WHEEL", None),
    "pip download --only-binary=:all: --no-deps -d wheels pyinfra==3.1 ...":
        ("needs the package index; the fixture writes a wheelhouse of every name==version the agent needs", None),
    "sudo sh bootstrap/$HOST/bootstrap.sh":
        ("needs a host to install the agent on; its files are written under $HOST_ROOT instead and "
         "`tritonfleet converge --config $PULL_CONFIG` runs on this machine",
         'python "$STANDINS/bootstrap.py" bootstrap/$HOST/bootstrap.sh "$HOST_ROOT"'),
    "tritonfleet rollout $INVENTORY deploys/models.py":
        ("needs Triton hosts; the next step runs the same model step on this machine (@local)", None),
}

STANDIN_BOOTSTRAP = '''\
"""What bootstrap.sh writes on a host, written under ROOT: its release signers, report key and
pull.json (with those paths under ROOT too)."""
import json, re, sys
from pathlib import Path
script, root = Path(sys.argv[1]).read_text(), Path(sys.argv[2])
for path, body in re.findall(r"cat > (\\S+)\\.tmp <<'TRITONFLEET_EOF'\\n(.*?)\\nTRITONFLEET_EOF", script, re.S):
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(body + "\\n")
    p.chmod(0o600)
config = root / "etc/tritonfleet/pull.json"
cfg = json.loads(config.read_text())
for k in ("signers", "report_key", "textfile"):
    cfg[k] = str(root / cfg[k].lstrip("/"))
config.write_text(json.dumps(cfg))
'''


# ---- the page ---------------------------------------------------------------------------------

@dataclass
class Command:
    text: str
    shown: list[str] = field(default_factory=list)  # the output lines the page shows
    run: bool = True


@dataclass
class Walkthrough:
    title: str
    commands: list[Command]


def parse(text: str) -> list[Walkthrough]:
    """Every ``## `` section that holds a ```console block: its commands, in order (a ``$ `` line,
    its ``\\`` continuations), each with the output lines shown under it."""
    out: list[Walkthrough] = []
    current: Walkthrough | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            current = Walkthrough(line[3:].strip(), [])
            out.append(current)
        elif line.startswith("```console"):
            info = line[3:].split()
            run = info[1:] != ["not-run"]
            assert info[1:] in ([], ["not-run"]), f"{DOC.name}:{i + 1}: unknown block marker {line!r}"
            assert current is not None, f"{DOC.name}:{i + 1}: a console block outside a walk-through"
            i += 1
            while not lines[i].startswith("```"):
                if lines[i].startswith("$ "):
                    cmd = lines[i][2:]
                    while cmd.endswith("\\"):
                        i += 1
                        cmd = cmd[:-1] + lines[i].strip()
                    current.commands.append(Command(cmd, run=run))
                elif lines[i].strip():
                    assert current.commands, f"{DOC.name}:{i + 1}: output before any command"
                    current.commands[-1].shown.append(lines[i])
                i += 1
        i += 1
    return [w for w in out if w.commands]


def pattern(shown: str) -> re.Pattern:
    """A shown output line as a search: ``...`` is anything, a run of spaces any white space."""
    parts = [r"\s+".join(re.escape(w) for w in piece.split()) for piece in shown.split("...")]
    return re.compile(".*".join(p for p in parts))


def script(walk: Walkthrough) -> str:
    """The walk-through as one bash script: a marker line before each command (its output is what
    follows), the commands themselves, not-run ones replaced by their stand-ins."""
    body = ["set -euo pipefail", "exec 2>&1", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for n, cmd in enumerate(walk.commands):
        body.append(f"printf '\\n@@ {n}\\n'")
        if cmd.run:
            body.append(cmd.text)
        else:
            assert cmd.text in NOT_RUN, f"{walk.title}: `{cmd.text}` is marked not-run but not listed in NOT_RUN"
            body.append(NOT_RUN[cmd.text][1] or ":")
    body.append("printf '\\n@@ end\\n'")
    return "\n".join(body) + "\n"


def check_run(walk: Walkthrough, rc: int, output: str) -> None:
    """Every command ran (exit status 0 under set -e) and printed the lines the page shows."""
    pieces = re.split(r"^@@ (\d+|end)$", output, flags=re.M)
    said = {pieces[k]: pieces[k + 1] for k in range(1, len(pieces) - 1, 2)}
    last = [k for k in said if k != "end"]
    if rc != 0 or "end" not in said:
        n = int(last[-1]) if last else 0
        raise AssertionError(f"{walk.title}: `{walk.commands[n].text}` failed (exit status {rc}):\n"
                             f"{said.get(last[-1], output)[-3000:] if last else output[-3000:]}")
    for n, cmd in enumerate(walk.commands):
        if not cmd.run:
            continue
        got = said[str(n)].splitlines()
        at = 0
        for shown in cmd.shown:
            if shown.strip() == "...":
                continue
            pat = pattern(shown)
            found = next((k for k in range(at, len(got)) if pat.search(got[k])), None)
            assert found is not None, (f"{walk.title}: `{cmd.text}` did not print {shown!r}"
                                       f"{' after the lines before it' if at else ''}; it printed:\n"
                                       + "\n".join(got)[-3000:])
            at = found + 1


def walkthrough(title: str) -> Walkthrough:
    [walk] = [w for w in parse(DOC.read_text()) if w.title.startswith(title)]
    return walk


# ---- the scratch repository and the runner ---------------------------------------------------

@pytest.fixture
def site(tmp_path):
    """An operator repository as `tritonfleet init` lays it out (group data, deploys, models),
    and the environment the walk-throughs read (the venv's commands first on PATH)."""
    repo = tmp_path / "site"
    for d in ("inventories/group_data", "files", "deploys"):
        shutil.copytree(ROOT / d, repo / d)
    standins = tmp_path / "standins"
    standins.mkdir()
    (standins / "bootstrap.py").write_text(STANDIN_BOOTSTRAP)
    env = {"PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
           "LANG": "C.UTF-8", "STANDINS": str(standins)}
    return repo, env


def run_walkthrough(walk: Walkthrough, cwd: Path, env: dict, timeout: float = 150) -> None:
    """The walk-through in one bash process group, ended (and what it left running) by its id."""
    proc = subprocess.Popen(["bash", "-c", script(walk)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{walk.title}: not done in {timeout}s:\n{out[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    check_run(walk, proc.returncode, out)


def agent_files(tmp: Path) -> tuple[Path, Path]:
    """tritonfleet's wheel and a wheelhouse: one file per distribution the agent needs, named as
    pip names them (bootstrap pins each by its sha256; no host installs them here)."""
    wheel = tmp / f"tritonfleet-{__version__}-py3-none-any.whl"
    wheel.write_bytes(b"tritonfleet wheel")
    wheelhouse = tmp / "wheels"
    wheelhouse.mkdir()
    for name, version in bootstrap.runtime_closure().items():
        if name != "tritonfleet":
            (wheelhouse / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(f"{name} {version}".encode())
    return wheel, wheelhouse


# ---- the walk-throughs --------------------------------------------------------------------------

MARK_DEPLOY = """\
from tritonfleet import pyinfra_patches

pyinfra_patches.install()
from pyinfra import host  # noqa: E402
from pyinfra.operations import server  # noqa: E402

server.shell(name="mark", commands=[f"echo {host.name} {host.data.get('colour')} > {host.data.get('mark_file')}"])
"""


def test_the_page_parses_and_every_not_run_command_is_listed():
    walks = parse(DOC.read_text())
    assert [w.title.split(":")[0] for w in walks] == ["Pull mode", "Quarantine", "Model origin"]
    not_run = [c.text for w in walks for c in w.commands if not c.run]
    assert sorted(not_run) == sorted(NOT_RUN)
    assert all(len(w.commands) >= 8 for w in walks)


def test_pull_mode(site, tmp_path):
    repo, env = site
    (repo / "deploys" / "mark.py").write_text(MARK_DEPLOY)
    (repo / "inventories" / "prod.py").write_text(
        f"pulled = [('h1', {{'colour': 'blue', 'mark_file': '{tmp_path}/mark', "
        "'extra_host_data': ['colour', 'mark_file']})]\n")
    wheel, wheelhouse = agent_files(tmp_path)
    origin = tmp_path / "origin"
    origin.mkdir()
    srv = OriginServer(origin, tmp_path / "nginx")
    host_root = tmp_path / "host"
    try:
        run_walkthrough(walkthrough("Pull mode"), repo, {
            **env, "INVENTORY": "inventories/prod.py", "HOST": "h1", "DEPLOY": "deploys/mark.py",
            "ORIGIN_DIR": str(origin), "ORIGIN_URL": srv.url, "WHEEL": str(wheel), "WHEELHOUSE": str(wheelhouse),
            "HOST_ROOT": str(host_root), "PULL_CONFIG": str(host_root / "etc/tritonfleet/pull.json"),
            "TRITONFLEET_PULL_STATE": str(host_root / "var/lib/tritonfleet/pull")})
    finally:
        srv.stop()
    # the deploy ran on the "host" under its own name with its own data, and it reported so
    assert (tmp_path / "mark").read_text() == "h1 blue\n"
    report = json.loads(json.loads((origin / "reports" / "h1.json").read_text())["payload"])
    assert report["result"] == "ok"
    assert "tritonfleet-release-2" in (host_root / "etc/tritonfleet/release-signers").read_text()


@pytest.fixture
def fleet_behind_haproxy(site, tmp_path):
    """Two inventory hosts, each a real tritonserver on loopback, behind a real HAProxy."""
    repo, env = site
    models = copy_repository(tmp_path / "models", kind_cpu=True)
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(local_server(models, tmp_path / f"triton-{h}")) for h in ("h1", "h2")]
        hap = HAProxy(tmp_path, [(h, f"127.0.0.1:{s.http_port}") for h, s in zip(("h1", "h2"), servers, strict=True)],
                      inter="200ms")
        stack.callback(hap.stop)
        hosts = [(h, {"ssh_hostname": "127.0.0.1", "health_host": "127.0.0.1", "triton_http_port": s.http_port,
                      "triton_metrics_port": s.metrics_port, "telemetry_node_exporter_port": free_port(),
                      "lb": "haproxy", "lb_haproxy_sockets": [hap.socket], "model_repository": str(models),
                      "model_overrides": {}})
                 for h, s in zip(("h1", "h2"), servers, strict=True)]
        (repo / "inventories" / "prod.py").write_text(f"fleet = {hosts!r}\n")
        yield repo, env, hap


def test_quarantine(fleet_behind_haproxy, tmp_path):
    repo, env, hap = fleet_behind_haproxy
    run_walkthrough(walkthrough("Quarantine"), repo, {
        **env, "INVENTORY": "inventories/prod.py", "TOKEN_FILE": str(tmp_path / "quarantine.token"),
        "RECEIVER": f"http://127.0.0.1:{free_port()}", "ALERTMANAGER": f"127.0.0.1:{free_port()}"})
    # behind HAProxy: h1 out, back once released, then h2 (never both at once: the budget)
    events = [json.loads(x) for x in (repo / ".tritonfleet/quarantine/events.jsonl").read_text().splitlines()]
    acts = [(e["host"], e["action"]) for e in events if e["action"] in ("quarantined", "over-budget", "returned")]
    assert acts == [("h1", "quarantined"), ("h2", "over-budget"), ("h1", "returned"), ("h2", "quarantined")], acts
    rows = [ln.split() for ln in hap.command("show servers state triton").splitlines() if not ln.startswith("#")]
    state = {r[3]: r[6] for r in rows if len(r) > 6}
    assert state == {"h1": "0", "h2": "1"}  # srv_admin_state: h2 held in maintenance, h1 serving


NGINX_MODEL_ORIGIN = """\
daemon off; user root; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 64; }}
http {{ access_log {d}/access.log; client_body_temp_path {d}/body; default_type application/octet-stream;
  server {{ listen 127.0.0.1:{port}; root {d}/www;
    location /triton/ {{ dav_methods PUT; create_full_put_path on; client_max_body_size 0; }} }} }}
"""


@pytest.fixture
def model_origin(tmp_path):
    """nginx taking GET and PUT below /triton/, as the page configures it."""
    d = tmp_path / "model-origin"
    (d / "www" / "triton").mkdir(parents=True)
    port = free_port()
    (d / "nginx.conf").write_text(NGINX_MODEL_ORIGIN.format(d=d, port=port))
    proc = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(d), "-c", str(d / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not (d / "nginx.pid").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "nginx did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/triton", d / "www" / "triton"
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_model_origin(site, model_origin, tmp_path):
    repo, env = site
    url, served = model_origin
    (repo / "inventories" / "prod.py").write_text(
        "t4 = [('h1', {'ssh_hostname': '127.0.0.2'}), ('h2', {'ssh_hostname': '127.0.0.3'})]\n")
    base = tmp_path / "opt-triton"
    run_walkthrough(walkthrough("Model origin"), repo, {
        **env, "INVENTORY": "inventories/prod.py", "MODEL_ORIGIN": url, "TRITON_BASE": str(base)})
    # the release went through the origin: every object there, the live link to an exact copy
    assert list((served / "releases").iterdir()) and list((served / "objects" / "sha256").iterdir())
    live = base / "model_repository"
    for f in (repo / "files" / "model_repository").rglob("*"):
        if f.is_file():
            assert (live / f.relative_to(repo / "files" / "model_repository")).read_bytes() == f.read_bytes()


# ---- the runner itself, on a page of shell builtins --------------------------------------------

RUNNER_PAGE = """\
## Demo: three commands

1. Say something.

```console
$ echo "first  line"; echo 'second line, 42 s'
first line
second line, ... s
```

2. A command the suite cannot run.

```console not-run
$ pip wheel --no-deps -w dist .
```

3. Then this.

```console
$ printf 'done\\n'
done
```
"""


def test_the_runner_checks_exit_status_and_each_shown_line(tmp_path):
    """What the walk-throughs rely on: a page run as written passes; a command that fails, or one
    that prints other than the page shows, fails the test naming that command."""
    [walk] = parse(RUNNER_PAGE)
    assert [(c.text, c.run) for c in walk.commands] == [
        ("echo \"first  line\"; echo 'second line, 42 s'", True), ("pip wheel --no-deps -w dist .", False),
        ("printf 'done\\n'", True)]
    env = {"PATH": os.environ["PATH"]}
    run_walkthrough(walk, tmp_path, env)
    with pytest.raises(AssertionError, match=r"; exit 3` failed \(exit status 3\)"):
        run_walkthrough(parse(RUNNER_PAGE.replace("$ printf 'done\\n'", "$ printf 'done\\n'; exit 3"))[0],
                        tmp_path, env)
    with pytest.raises(AssertionError, match="did not print 'second line, ... min'"):
        run_walkthrough(parse(RUNNER_PAGE.replace("... s\n", "... min\n"))[0], tmp_path, env)
    with pytest.raises(AssertionError, match="not listed in NOT_RUN"):
        script(parse(RUNNER_PAGE.replace("-w dist .", "-w build ."))[0])
