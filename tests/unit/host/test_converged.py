"""The drop-in operations (tritonfleet.host.ops.converged) and the per-run fact memo, on pyinfra's @fake
connector: one command on a converged host, pyinfra's own operation for any change. The real
no-op run over SSH is in testbed/test_e2e.py."""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra.api import deploy
from pyinfra.operations import python, server

from tests.support.fakehost import run_fake
from tritonfleet.host.facts import DpkgState, FileState, UnitState
from tritonfleet.host.ops import converged

TEXT = "pinned\n"
SHA = hashlib.sha256(TEXT.encode()).hexdigest()
DPKG = "dpkg-query -W -f"


def dpkg(*rows: str) -> list[str]:
    return ["\t".join(r.split()) for r in rows]


@deploy("put")
def put_file():
    converged.put(name="pin", src=StringIO(TEXT), dest="/etc/x.pref", mode="644")


def test_put_converged_file_is_one_command():
    _, cmds, state = run_fake(put_file, yes=True, responses={"mode=%a user=%U": ["mode=644 user=root group=root", SHA]})
    assert not state.failed_hosts
    assert len(cmds) == 1 and cmds[0].startswith("[ -f /etc/x.pref ]"), cmds


def test_put_changed_content_or_mode_goes_through_files_put():
    _, cmds, _ = run_fake(put_file, yes=True, responses={"mode=%a user=%U": ["mode=644 user=root group=root", "0" * 64]})
    # handed to pyinfra's files.put: it reads the file itself, uploads and sets the mode
    assert any("stat -c 'user=%U group=%G mode=%A" in c for c in cmds)
    assert "mkdir -p /etc" in cmds and "chmod 644 /etc/x.pref" in cmds
    _, cmds, _ = run_fake(put_file, yes=True, responses={"mode=%a user=%U": ["mode=600 user=root group=root", SHA]})
    assert len(cmds) > 1  # handed to files.put, which fixes the mode


@deploy("packages")
def two_package_ops(change_between: bool = False, check_between: bool = False):
    converged.packages(name="a", packages=["dkms", "cuda-drivers-535"])
    if change_between:
        server.shell(name="something that changes the host", commands=["true"])
    if check_between:
        python.call(name="check: reads the host, changes nothing", function=lambda: None)
    converged.packages(name="b", packages=["nvidia-container-toolkit=1.16.2-1"])


INSTALLED = dpkg("ii dkms 3.0.10-8", "hi cuda-drivers-535 535.183.01-1",
                 "ii nvidia-container-toolkit 1.16.2-1")


def test_packages_read_dpkg_once_while_nothing_changes():
    _, cmds, _ = run_fake(two_package_ops, yes=True, responses={DPKG: INSTALLED})
    assert sum(c.startswith(DPKG) for c in cmds) == 1, cmds
    assert not any("apt-get" in c or "dpkg -l" in c for c in cmds)


def test_packages_read_dpkg_again_after_a_change():
    _, cmds, _ = run_fake(two_package_ops, yes=True, responses={DPKG: INSTALLED}, change_between=True)
    assert sum(c.startswith(DPKG) for c in cmds) == 2, cmds


def test_checks_do_not_make_facts_read_again():
    _, cmds, _ = run_fake(two_package_ops, yes=True, responses={DPKG: INSTALLED}, check_between=True)
    assert sum(c.startswith(DPKG) for c in cmds) == 1, cmds


def test_packages_missing_or_other_version_are_installed_by_apt_packages():
    rows = dpkg("ii dkms 3.0.10-8", "ii nvidia-container-toolkit 1.17.0-1")
    _, cmds, _ = run_fake(two_package_ops, yes=True, responses={DPKG: rows})
    installs = [c for c in cmds if " install " in c]
    assert any("cuda-drivers-535" in c for c in installs), cmds
    assert any("nvidia-container-toolkit=1.16.2-1" in c for c in installs), cmds


@deploy("service")
def docker_service():
    converged.service(name="docker", service="docker", running=True, enabled=True)


def test_service_running_and_enabled_is_one_command():
    _, cmds, _ = run_fake(docker_service, yes=True, responses={"systemctl show": ["SubState=running", "UnitFileState=enabled"]})
    assert cmds == ["systemctl show --property SubState --property UnitFileState docker.service "
                    "2>/dev/null || true"]


def test_service_stopped_is_started_by_systemd_service():
    _, cmds, _ = run_fake(docker_service, yes=True, responses={"--property SubState --property UnitFileState":
                                           ["SubState=dead", "UnitFileState=enabled"]})
    assert "systemctl start docker.service" in cmds


def test_fact_parsers():
    state = DpkgState().process(dpkg("ii dkms 3.0.10-8", "hi nvidia-smi 535.183.01-1", "rc old-pkg 1.0",
                                     "hi nvidia-smi 535.183.01-2") + ["garbage"])
    assert state == {"installed": {"dkms": ["3.0.10-8"], "nvidia-smi": ["535.183.01-1", "535.183.01-2"]},
                     "held": ["nvidia-smi", "nvidia-smi"], "interrupted": []}
    assert FileState().process(["mode=644 user=root group=adm", SHA]) == {
        "mode": "644", "user": "root", "group": "adm", "sha256": SHA}
    assert FileState().process([]) is None
    assert UnitState().process(["SubState=exited", "UnitFileState=static"]) == {"running": True, "enabled": True}
    assert UnitState().process(["SubState=dead", "UnitFileState=disabled"]) == {"running": False, "enabled": False}
