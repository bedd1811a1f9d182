"""The package on its own: defaults from tritonfleet/settings/defaults.py wherever a tunable is not set,
files found through tritonfleet.resource, and `tritonfleet init` (the operator's repository).

The wheel itself, installed in a fresh virtual environment and run against the testbed, is
tests/testbed/test_wheel.py."""

from __future__ import annotations

import filecmp
import re
import runpy
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from tritonfleet import ROLLBACK_DEPLOY, ROOT, SKELETON, TEMPLATES, preflight
from tritonfleet.cli import main, scaffold
from tritonfleet.inventory import roster
from tritonfleet.settings import access as config
from tritonfleet.settings.defaults import DEFAULTS

SKELETON_FILES = {
    ".gitignore", "README.md", "config.py",
    "deploys/host.py", "deploys/models.py", "deploys/rollback.py", "deploys/telemetry.py", "deploys/triton.py",
    "deploys/verify.py", "deploys/stage.py", "deploys/mirror.py", "deploys/reboot.py",
    "inventories/prod.py", "inventories/group_data/all.py", "inventories/group_data/t4.py",
    "inventories/group_data/l4.py",
    "files/model_repository/resnet50_onnx/config.pbtxt", "files/model_repository/resnet50_onnx/1/model.onnx",
    "files/model_repository/text_classifier_onnx/config.pbtxt",
    "files/model_repository/text_classifier_onnx/1/model.onnx",
}


def pyinfra_host(data: dict, name: str = "@fake/gpu1"):
    inventory = Inventory(([(name, data)], {}))
    state = State(inventory, Config())
    return inventory.get_host(name), state


# --------------------------------------------------------------------------- defaults

def test_config_takes_the_package_default_when_no_data_sets_it():
    h, _ = pyinfra_host({"triton_http_port": 9000})
    with ctx_host.use(h):
        assert config.get("triton_http_port") == 9000  # host data wins
        assert config.get("triton_grpc_port") == DEFAULTS["triton_grpc_port"]
        # a caller's fallback never replaces the package's default (this one is a security default)
        assert config.get("triton_restricted_apis", []) == DEFAULTS["triton_restricted_apis"] != []
        assert config.get("gpu_class", None) is None  # no tunable: the caller's fallback
        with pytest.raises(config.ConfigError, match="gpu1: 'no_such_tunable' is not set and is no tunable"):
            config.get("no_such_tunable")


def test_a_default_is_a_copy():
    h, _ = pyinfra_host({})
    with ctx_host.use(h):
        config.get("triton_restricted_apis").append("changed")
        config.get("model_overrides")["m"] = {}
        assert config.get("triton_restricted_apis") == DEFAULTS["triton_restricted_apis"]
        assert config.get("model_overrides") == {}


def test_fleet_inventory_has_the_defaults_under_its_data(tmp_path, monkeypatch):
    d = tmp_path / "inventories"
    (d / "group_data").mkdir(parents=True)
    (d / "group_data" / "all.py").write_text("triton_http_port = 9000\n")
    (d / "group_data" / "t4.py").write_text('gpu_class = "T4"\n')
    (d / "prod.py").write_text('t4 = [("h1", {"ssh_hostname": "192.0.2.1", "triton_grpc_port": 9001})]\n')
    monkeypatch.chdir(tmp_path)
    (h,) = roster.load_inventory(d / "prod.py")
    assert h.get("triton_http_port") == 9000 and h.get("triton_grpc_port") == 9001
    assert h.get("triton_metrics_port") == DEFAULTS["triton_metrics_port"]
    assert h.gpu_class == "T4"
    # the package's host-key policy reaches pyinfra's connection settings of the fleet commands
    assert h.pyinfra_host.connector.data["ssh_strict_host_key_checking"] == "yes"
    assert DEFAULTS["ssh_strict_host_key_checking"] == "yes"


def test_preflight_refuses_an_ssh_host_without_a_host_key_policy():
    h, state = pyinfra_host({"ssh_hostname": "192.0.2.1"}, name="triton-t4-01")
    h.init(state)
    with ctx_state.use(state), ctx_host.use(h):
        with pytest.raises(preflight.PreflightError) as e:
            preflight.check_host_key_policy()
        assert "triton-t4-01: ssh_strict_host_key_checking is not set" in str(e.value)
        assert "no host was changed" in str(e.value) and "inventories/group_data/all.py" in str(e.value)
    for policy in ("yes", "off"):
        h, state = pyinfra_host({"ssh_hostname": "192.0.2.1", "ssh_strict_host_key_checking": policy})
        h.init(state)
        with ctx_state.use(state), ctx_host.use(h):
            preflight.check_host_key_policy()
    h, state = pyinfra_host({})  # not an SSH host (@fake): nothing to check
    h.init(state)
    with ctx_state.use(state), ctx_host.use(h):
        preflight.check_host_key_policy()


def test_repository_group_data_holds_only_what_differs():
    for name in ("all", "t4", "l4"):
        ns = runpy.run_path(str(ROOT / "inventories" / "group_data" / f"{name}.py"))
        values = {k for k in ns if not k.startswith("_")}
        assert values <= {"ssh_strict_host_key_checking", "gpu_class"}, (name, values)
    ns = runpy.run_path(str(ROOT / "inventories" / "group_data" / "all.py"))
    assert ns["ssh_strict_host_key_checking"] == DEFAULTS["ssh_strict_host_key_checking"]


# --------------------------------------------------------------------------- shipped files

def test_shipped_files_are_found_through_the_package():
    assert (TEMPLATES / "triton.service.j2").is_file()
    assert ROLLBACK_DEPLOY.is_file() and ROLLBACK_DEPLOY.parent.parent == SKELETON
    from tritonfleet.host import nvidia_repos as vendorfacts
    from tritonfleet.settings import table as tunables

    assert tunables.DEFAULTS_FILE.is_file()
    assert sorted(p.stem for p in vendorfacts.DATA.glob("*.toml")) == ["common", "debian12", "ubuntu2204",
                                                                      "ubuntu2404", "ubuntu2604"]


def test_no_package_module_reads_through_the_checkout_root():
    """ROOT (the checkout) exists for the tests and bench/; the package finds what it ships
    through tritonfleet.resource, so an installed wheel never looks for a checkout."""
    offenders = []
    for p in (ROOT / "tritonfleet").rglob("*.py"):
        if "testbed" in p.parts or p.name == "__init__.py":
            continue
        if re.search(r"\bROOT\b", p.read_text()):
            offenders.append(str(p.relative_to(ROOT)))
    assert offenders == []


# --------------------------------------------------------------------------- tritonfleet init

def test_skeleton_is_the_repository_own_files():
    """One source: the skeleton's entry points, inventory, group data and models are this
    repository's own (links in a checkout, copies in a wheel)."""
    assert set(dict.fromkeys(r for r in _rel_files(SKELETON))) == SKELETON_FILES
    for rel in SKELETON_FILES - {".gitignore", "README.md"}:
        assert filecmp.cmp(SKELETON / rel, ROOT / rel, shallow=False), rel


def _rel_files(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in scaffold._rglob_following_links(root)]


def init(*args: str):
    return CliRunner().invoke(main, ["init", *args], catch_exceptions=False)


def test_init_writes_the_skeleton_then_has_nothing_to_do(tmp_path):
    dest = tmp_path / "fleet-infra"
    res = init(str(dest))
    assert res.exit_code == 0, res.output
    assert set(_rel_files(dest)) == SKELETON_FILES
    assert f"{dest}: {len(SKELETON_FILES)} file(s) written" in res.output
    for rel in SKELETON_FILES:
        assert filecmp.cmp(SKELETON / rel, dest / rel, shallow=False), rel
    again = init(str(dest))
    assert again.exit_code == 0 and "nothing to do" in again.output and "wrote" not in again.output
    (dest / "inventories" / "staging.py").write_text("t4 = []\n")  # an operator's own file
    assert "nothing to do" in init(str(dest)).output


def test_init_refuses_a_directory_that_is_not_empty(tmp_path):
    dest = tmp_path / "repo"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine\n")
    res = init(str(dest))
    assert res.exit_code == 2  # bad input, as every command's
    assert f"{dest} is not empty (it holds notes.txt): nothing was written" in res.output
    assert "--force" in res.output
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt"]
    res = init("--force", str(dest))
    assert res.exit_code == 0, res.output
    assert (dest / "notes.txt").read_text() == "mine\n" and (dest / "deploys" / "triton.py").is_file()


def test_init_refuses_changed_files_without_force_and_keeps_others_with_it(tmp_path):
    dest = tmp_path / "repo"
    assert init(str(dest)).exit_code == 0
    prod = dest / "inventories" / "prod.py"
    prod.write_text("t4 = []\n")
    res = init(str(dest))
    assert res.exit_code == 2 and "its inventories/prod.py differs from tritonfleet's skeleton" in res.output
    assert prod.read_text() == "t4 = []\n"
    res = init("--force", str(dest))
    assert res.exit_code == 0 and "overwrote  inventories/prod.py (yours kept as inventories/prod.py.orig)" \
        in res.output
    assert filecmp.cmp(prod, SKELETON / "inventories" / "prod.py", shallow=False)
    # the edited inventory was kept, not lost; a second --force keeps the next edit beside it
    assert (dest / "inventories" / "prod.py.orig").read_text() == "t4 = []\n"
    prod.write_text("l4 = []\n")
    assert "prod.py.orig.1" in init("--force", str(dest)).output
    assert (dest / "inventories" / "prod.py.orig").read_text() == "t4 = []\n"
    assert (dest / "inventories" / "prod.py.orig.1").read_text() == "l4 = []\n"
    # the backups are no .py files: pyinfra does not take them for group data or groups
    assert "nothing to do" in init(str(dest)).output


def test_init_accepts_a_fresh_git_repository_and_refuses_a_file(tmp_path):
    dest = tmp_path / "repo"
    (dest / ".git").mkdir(parents=True)
    assert init(str(dest)).exit_code == 0
    f = tmp_path / "file"
    f.write_text("")
    res = init(str(f))
    assert res.exit_code != 0


def test_the_printed_rollback_command_names_an_entry_point_that_exists(tmp_path, monkeypatch):
    from tritonfleet.core.report import rollback_command

    monkeypatch.chdir(tmp_path)  # no deploys/ here: the package's own rollback entry point
    cmd = rollback_command("tb1-t4", ["pyinfra", "inventories/prod.py", "deploys/models.py"])
    assert cmd == f"pyinfra -y inventories/prod.py {ROLLBACK_DEPLOY} --limit tb1-t4"
    (tmp_path / "deploys").mkdir()
    (tmp_path / "deploys" / "rollback.py").write_text("")  # the repository's own (tritonfleet init)
    cmd = rollback_command("tb1-t4", ["pyinfra", "inventories/prod.py", "deploys/models.py"])
    assert cmd == "pyinfra -y inventories/prod.py deploys/rollback.py --limit tb1-t4"
