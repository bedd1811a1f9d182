"""A new operator's mistakes (the newcomer report's table): each one answered with one line that
names the fix and exit status 2, before anything is published, written or run; and the habits
tritonfleet takes over from pyinfra (-y, --dry, N or P% wherever a count is taken).

Each command runs in-process in a forked child (tests/integration/cli/test_bad_input.py), no host contacted.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.integration.cli.test_bad_input import GEN, GOOD_INVENTORY, assert_usage_error, invoke
from tritonfleet import ROOT, __version__
from tritonfleet.fleet.pull import bootstrap
from tritonfleet.fleet.rollout import engine, plan
from tritonfleet.fleet.runner.pyinfra_run import PyinfraRun


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The layout `tritonfleet init` writes, hosts that never answer (as tests/integration/cli/test_bad_input.py)."""
    for d in ("inventories/group_data", "files", "deploys"):
        shutil.copytree(ROOT / d, tmp_path / d)
    (tmp_path / "inventories" / "prod.py").write_text(GOOD_INVENTORY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def keypair(tmp_path):
    d = tmp_path / "keys"
    d.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "release", "-f", str(d / "release")],
                   check=True)
    return d / "release"


@pytest.fixture
def agent(project, monkeypatch):
    """An origin directory, tritonfleet's wheel and a wheelhouse for an agent of one dependency."""
    monkeypatch.setattr(bootstrap, "runtime_closure", lambda: {"tritonfleet": __version__, "six": "1.16.0"})
    (project / "origin").mkdir()
    (project / "wh").mkdir()
    (project / "wh" / "six-1.16.0-py2.py3-none-any.whl").write_bytes(b"six")
    wheel = project / f"tritonfleet-{__version__}-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    return ["bootstrap", "inventories/prod.py", "--origin", "origin", "--wheel", wheel.name, "--wheelhouse", "wh",
            "--out", "boot"]


# ---- 14: an origin given as its URL -----------------------------------------------------------

@pytest.mark.parametrize("url", ["http://127.0.0.1:8765", "https://origin.example/x/", "s3://bucket/p"])
def test_status_pull_with_the_origins_url_asks_for_the_directory(project, url):
    res = invoke("status", "inventories/prod.py", "--pull", url)
    assert_usage_error(res, f"origin {url} is an address", "the origin directory this machine writes")
    assert "create it" not in res.output


# ---- 16: the public half is enough for bootstrap; every --sign-key says which half ----------------

def test_bootstrap_takes_the_public_key(agent, keypair):
    pub = keypair.with_suffix(".pub")
    pub.chmod(0o644)
    keypair.unlink()  # only the public half on this machine: ssh-keygen -y is never needed
    res = invoke(*agent, "--url", "http://127.0.0.1:8765", "--sign-key", str(pub))
    assert res.exit_code == 0, res.output
    script = Path("boot/t4-a/bootstrap.sh").read_text()
    assert pub.read_text().split()[1] in script and "PRIVATE" not in res.output


def test_every_sign_key_option_says_which_half_it_takes():
    for args in (["bootstrap"], ["pull", "publish"], ["pull", "rollout"]):
        res = invoke(*args, "--help")
        text = " ".join(res.output.split())
        assert res.exit_code == 0 and "--sign-key" in text
        assert "public half" in text if args == ["bootstrap"] else "the private key" in text, text


# ---- 18, 21: bootstrap's --url and its choice of --sign-key or --release ------------------------

@GEN
@given(url=st.one_of(
    st.sampled_from(["htp://127.0.0.1:8765", "http//127.0.0.1:8765", "127.0.0.1:8765", "http://", "ftp://h/x",
                     "http://:8080", "http://h:port", "http://[::1", "http://h /x", "https:/h"]),
    st.text(max_size=20).filter(lambda u: not u.startswith(("http://", "https://")))))
def test_bootstrap_refuses_an_origin_url_that_is_not_http(agent, keypair, url):
    res = invoke(*agent, "--url", url, "--sign-key", str(keypair))
    assert_usage_error(res, "--url", "http:// or https:// URL with a host")
    assert not Path("boot").exists() and not Path("origin/dist").exists()


def test_bootstrap_refuses_a_release_and_a_sign_key_together(agent, keypair):
    res = invoke(*agent, "--url", "http://127.0.0.1:8765", "--sign-key", str(keypair), "--release", "ab" * 32)
    assert_usage_error(res, "--sign-key and --release: choose one")
    assert not Path("boot").exists()


# ---- 22: a second bootstrap keeps every earlier script valid ----------------------------------

def _script(user_data: str) -> str:
    """The script a user-data file runs (what a launch template keeps)."""
    return yaml.safe_load(Path(user_data).read_text())["write_files"][0]["content"]


def _fetched(script: str) -> str:
    line = next(ln for ln in script.splitlines() if ln.startswith("curl ") and "requirements" in ln)
    return line.rsplit("$ORIGIN/", 1)[1].strip('"')


def _checked(script: str) -> str:
    return next(ln for ln in script.splitlines() if "sha256sum -c" in ln).split('"')[1].split()[0]


def _still_installs(script: str) -> None:
    """What the script's pip would find on the origin: the requirements file its hash names, and
    every wheel that file pins, listed on the index page, with the pinned content."""
    body = Path("origin", _fetched(script)).read_bytes()
    assert hashlib.sha256(body).hexdigest() == _checked(script)
    index = Path("origin/dist/wheels/index.html").read_text()
    pins = [ln.split(" --hash=sha256:") for ln in body.decode().splitlines() if not ln.startswith("#")]
    for name_version, digest in pins:
        name, version = name_version.split("==")
        wheel = next(Path("origin/dist/wheels").glob(f"{name}-{version}-*.whl"))
        assert f'href="{wheel.name}"' in index and hashlib.sha256(wheel.read_bytes()).hexdigest() == digest


def test_a_second_bootstrap_with_another_wheelhouse_keeps_earlier_scripts_valid(agent, keypair, monkeypatch):
    first = invoke(*agent, "--url", "http://127.0.0.1:8765", "--sign-key", str(keypair))
    assert first.exit_code == 0, first.output
    old = _script("boot/t4-a/user-data")  # as a launch template keeps it
    # the next wheelhouse: six upgraded
    monkeypatch.setattr(bootstrap, "runtime_closure", lambda: {"tritonfleet": __version__, "six": "1.17.0"})
    Path("wh/six-1.17.0-py2.py3-none-any.whl").write_bytes(b"six 1.17")
    second = invoke(*agent, "--url", "http://127.0.0.1:8765", "--sign-key", str(keypair))
    assert second.exit_code == 0, second.output
    new = _script("boot/t4-a/user-data")
    assert _checked(old) != _checked(new)
    assert "the agent's requirements changed" in second.output and "requirements changed" not in first.output
    _still_installs(old)
    _still_installs(new)
    again = invoke(*agent, "--url", "http://127.0.0.1:8765", "--sign-key", str(keypair))
    assert again.exit_code == 0 and "requirements changed" not in again.output  # the same set: nothing said
    # a rebuilt wheel under a name the origin already serves would break the scripts that pin it
    Path("wh/six-1.17.0-py2.py3-none-any.whl").write_bytes(b"six 1.17, rebuilt")
    before = {p: p.read_bytes() for p in Path("origin").rglob("*") if p.is_file()}
    res = invoke(*agent, "--url", "http://127.0.0.1:8765", "--sign-key", str(keypair))
    assert_usage_error(res, "six-1.17.0-py2.py3-none-any.whl differ from the files of the same name on the origin")
    assert {p: p.read_bytes() for p in Path("origin").rglob("*") if p.is_file()} == before
    _still_installs(old)
    _still_installs(new)


# ---- 23: pull publish with a key that is not there -----------------------------------------------

def test_pull_publish_with_a_missing_key_is_bad_input_and_publishes_nothing(project):
    Path("origin").mkdir()
    res = invoke("pull", "publish", "inventories/prod.py", "deploys/models.py", "--origin", "origin",
                 "--sign-key", "keys/nope")
    assert_usage_error(res, "signing key keys/nope not found")
    assert not Path("origin/releases").exists()


# ---- 58, 61, 62, 64: the options pyinfra and Ansible users reach for ------------------------------

def test_deploy_takes_pyinfras_y(project):
    res = invoke("deploy", "inventories/prod.py", "deploys/nothing.py", "-y")
    assert_usage_error(res, "deploy deploys/nothing.py not found")  # -y itself accepted: the next check speaks
    assert "No such option" not in res.output


@pytest.mark.parametrize("cmd", [
    ["deploy", "inventories/prod.py", "deploys/nope.py", "--dry"],
    ["rollout", "inventories/prod.py", "deploys/nope.py"],
    ["pull", "publish", "inventories/prod.py", "deploys/nope.py", "--origin", "origin"],
])
def test_a_missing_deploy_file_is_refused_naming_the_directory(project, cmd):
    Path("origin").mkdir()
    res = invoke(*cmd)
    assert_usage_error(res, f"deploy deploys/nope.py not found in {project}", "repository's root")
    assert "pyinfra" not in res.output and not Path("origin/releases").exists()


def test_max_fail_takes_a_count_or_a_percentage_rounded_down():
    parse = plan.parse_max_fail
    assert parse("10%", 9) == 0 and parse("10%", 10) == 1 and parse("10%", 29) == 2
    assert parse("0", 5) == 0 and parse(3, 5) == 3 and parse("100%", 7) == 7
    for bad in ("-1", "x", "150%", "%", "-5%", "1.5"):
        with pytest.raises(plan.RolloutError, match="--max-fail must be a number of hosts"):
            parse(bad, 10)


@pytest.mark.parametrize("cmd", [["rollout"], ["pull", "rollout"]])
def test_max_fail_as_a_percentage_is_accepted_by_both_rollouts(project, cmd):
    extra = ["--origin", "files", "--sign-key", "nokey"] if cmd[0] == "pull" else ["--limit", "nosuchhost"]
    res = invoke(*cmd, "inventories/prod.py", "deploys/models.py", *extra, "--max-fail", "10%")
    # the next check (no key / no such host) speaks: the percentage itself passed
    assert_usage_error(res, "signing key nokey not found" if cmd[0] == "pull" else "matches no host")
    res = invoke(*cmd, "inventories/prod.py", "deploys/models.py", *extra, "--max-fail", "150%")
    assert_usage_error(res, "--max-fail must be a number of hosts (>= 0) or a percentage")


def test_canary_weight_takes_a_percent_sign(project):
    res = invoke("rollout", "inventories/prod.py", "deploys/models.py", "--canary-weight", "5%")
    # accepted as 5: refused only for the missing HAProxy, as 5 is
    assert_usage_error(res, "lb = 'haproxy'")
    res = invoke("rollout", "inventories/prod.py", "deploys/models.py", "--canary-weight", "five%")
    assert_usage_error(res, "is not a percentage")


def test_rollout_dry_plans_and_stops(project, monkeypatch):
    """--dry: the probe and pyinfra --dry's plan, the batches printed, no batch deployed, exit 0."""
    from tritonfleet.fleet import probe

    def fake_probe(fh):
        return probe.HostStatus(fh.name, "127.0.0.1", fh.gpu_class, reachable=True)

    def fake_run(inventory, deploy, hosts, data, *, dry=False, log_path=None, settings=None, **kw):
        if not dry:
            raise AssertionError(f"a dry rollout ran pyinfra without --dry on {hosts}")
        assert hosts == ["t4-a", "l4-a"]  # one plan, of every reachable target
        ops = [{"name": "triton | Start the unit", "success": ["t4-a"], "no_change": ["l4-a"], "error": []}]
        return PyinfraRun(0, {"results": {"operations": ops}}, "", str(log_path))

    monkeypatch.setattr(engine.workers, "parallel", lambda hosts, fn: [fake_probe(h) for h in hosts])
    monkeypatch.setattr(engine.workers, "run_pyinfra", fake_run)
    res = invoke("rollout", "inventories/prod.py", "deploys/models.py", "--dry", "--batch", "1",
                 "--data", "rollout_metrics_listen=127.0.0.1:0")
    assert res.escaped is None and res.exit_code == 0, res.output
    assert "[canary] would deploy to t4-a" in res.output and "would deploy to l4-a" in res.output
    assert "dry: 1 operation(s) would change" in res.output and "dry: no change" in res.output
    assert "dry run: nothing changed" in res.output
    res = invoke("rollout", "--resume", "--dry")
    assert_usage_error(res, "--dry plans a new rollout")


# ---- M10: a host twice in a group, or in groups of different GPU classes -------------------------

GPU_GROUPS = ('t4 = [("a", {"ssh_hostname": "127.0.0.1", "ssh_port": 1})]\n'
              'l4 = [("a", {"ssh_hostname": "127.0.0.1", "ssh_port": 1})]\n')


@pytest.mark.parametrize(("body", "words"), [
    (GPU_GROUPS, ["a is in groups with different GPU classes", "t4: gpu_class 'T4'", "l4: gpu_class 'L4'"]),
    ('t4 = [("a", {"ssh_hostname": "127.0.0.1"}), ("a", {"ssh_hostname": "127.0.0.2"})]\n',
     ["a is listed more than once in group t4"]),
    ('t4 = ["a", "b", "a"]\n', ["a is listed more than once in group t4"]),
    ('t4 = [("a", {"ssh_hostname": "127.0.0.1"})]\nrack1 = [("a", {"ssh_hostname": "127.0.0.9"})]\n',
     ["a is listed in groups t4 and rack1 with different ssh_hostname ('127.0.0.1' and '127.0.0.9')"]),
])
def test_an_inventory_with_a_host_twice_is_refused_at_load(project, body, words):
    Path("inventories/prod.py").write_text(body)
    for cmd in (["status", "inventories/prod.py"], ["prometheus", "inventories/prod.py", "--out", "p"]):
        assert_usage_error(invoke(*cmd), "inventories/prod.py", *words)


def test_a_host_in_two_groups_of_one_class_or_with_its_own_class_is_accepted(project):
    """A host may be in several groups (a canary group, a rack) as long as its GPU class is one."""
    Path("inventories/group_data/canary.py").write_text("")
    Path("inventories/prod.py").write_text('t4 = [("a", {"ssh_hostname": "127.0.0.1"})]\ncanary = ["a"]\n'
                                           'rack = [("a", {"ssh_hostname": "127.0.0.1", "ssh_port": 22})]\n'
                                           'l4 = [("b", {"ssh_hostname": "127.0.0.2", "gpu_class": "L4"})]\n'
                                           't4b = (["b"], {"gpu_class": "T4"})\n')
    res = invoke("prometheus", "inventories/prod.py", "--out", "p")
    assert res.exit_code == 0, res.output


# ---- M3, M5, 38: settings an operator writes the way the docs seem to say ----------------------

@pytest.mark.parametrize(("line", "words"), [
    ('quarantine_budget = "25"\n', "quarantine_budget = '25' (inventories/group_data/all.py): must be a whole number "
                                  "of hosts >= 0 or \"P%\" of the group (0 to 100) (write 25 without quotes or '25%')"),
    ('triton_image = "nvcr.io/nvidia/tritonserver:24.08-py3 "\n', "without leading or trailing white space "
                                                                  "(write 'nvcr.io/nvidia/tritonserver:24.08-py3')"),
    ('extra_host_data = {"webhook_token": "s3cr3t"}\n', "the names only, e.g. extra_host_data = ['webhook_token']"),
    ('model_origin_credentials_file = "relative/creds"\n', "must be an absolute path"),
    ('model_origin = "s3://Models_Prod/triton"\n', "its bucket name must be 3 to 63 lower-case letters"),
])
def test_settings_written_the_way_an_operator_guesses_are_refused_at_load(project, line, words):
    f = Path("inventories/group_data/all.py")
    f.write_text(f.read_text() + line)
    assert_usage_error(invoke("status", "inventories/prod.py"), words)


def test_extra_host_data_as_names_with_values_of_their_own_is_accepted(project):
    f = Path("inventories/group_data/all.py")
    f.write_text(f.read_text() + 'extra_host_data = ["webhook_token"]\nwebhook_token = "s3cr3t"\n'
                 'quarantine_budget = "25%"\nmodel_origin = "s3://models-prod.eu-1/triton"\n')
    Path("inventories/prod.py").write_text('t4 = [("t4-a", {"ssh_hostname": "127.0.0.1"})]\n'
                                           'l4 = [("l4-a", {"ssh_hostname": "127.0.0.2"})]\n')
    res = invoke("prometheus", "inventories/prod.py", "--out", "p")
    assert res.exit_code == 0, res.output


BUCKET_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.-"


@GEN
@given(bucket=st.text(alphabet=BUCKET_CHARS + "ABCXYZ_ ~", min_size=0, max_size=70))
def test_an_s3_bucket_name_s3_would_refuse_is_refused(bucket):
    from tritonfleet.settings.check import RULES

    parts = bucket.split(".")
    ip = len(parts) == 4 and all(p.isdigit() for p in parts)
    fine = (3 <= len(bucket) <= 63 and set(bucket) <= set(BUCKET_CHARS) and bucket[0] not in ".-"
            and bucket[-1] not in ".-" and ".." not in bucket and not ip)
    why = RULES["model_origin"].problem(f"s3://{bucket}/prefix")
    if fine:
        assert why is None, (bucket, why)
    else:
        assert why is not None, bucket


# ---- README: every command in the CLI table -------------------------------------------------------

def test_readmes_cli_table_names_every_command():
    import click

    from tritonfleet.cli import main

    table = (ROOT / "README.md").read_text().split("## CLI", 1)[1].split("\n## ", 1)[0]
    names = []
    for name, cmd in main.commands.items():
        if name == "testbed":
            names.append(name)
        elif isinstance(cmd, click.Group) and name != "quarantine":  # quarantine's verbs share one row
            names += [f"{name} {sub}" for sub in cmd.commands]
        else:
            names.append(name)
    missing = [n for n in names if f"| `tritonfleet {n}" not in table]
    assert not missing, f"README's CLI table lacks: {missing}"


def test_a_bare_true_in_data_gets_the_quoting_hint_and_the_quoted_one_passes(project):
    """newcomer-2 #50: `--data lb_ready_command=true` is a boolean after pyinfra's --data parsing;
    the refusal says how to write the string."""
    res = invoke("status", "inventories/prod.py", "--data", "lb_ready_command=true")
    assert_usage_error(res, "lb_ready_command = True (--data)", "a bare true is read as a boolean",
                       "NAME='\"true\"'")
    res = invoke("check", "inventories/prod.py", "--data", 'lb_ready_command="true"')
    assert res.exit_code != 2 and "lb_ready_command" not in res.output, res.output
