"""Drop-in operations for pyinfra's ``files.put``, ``apt.packages`` and ``systemd.service`` that
recognise a converged host in one cheap remote command and hand everything else to pyinfra's own
operation (which then reads the host again and does the change exactly as it always does).

On a converged host these cost: ``put`` one command (pyinfra's: three), ``packages`` nothing
once ``dpkg`` was read in the run (pyinfra's: ``dpkg -l`` every time), ``service`` one command
(pyinfra's: two). Same arguments as the pyinfra operations they stand in for.
"""

from __future__ import annotations

import hashlib
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import apt, files, systemd

from ...pyinfra_ext import memo
from ..facts import DpkgState, FileState, UnitState
from . import aptlock


def _local_sha256(src) -> str | None:
    if isinstance(src, StringIO):
        return hashlib.sha256(src.getvalue().encode()).hexdigest()
    if isinstance(src, (str, Path)) and Path(src).is_file():
        h = hashlib.sha256()
        with open(src, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    return None


def _mode(mode) -> str | None:
    if mode is None or isinstance(mode, bool):
        return None
    return format(int(str(mode), 8), "o")


@operation()
def put(src, dest: str, user: str | None = None, group: str | None = None, mode=None, **kwargs):
    """``files.put``: no change when the remote file has the same sha256, mode, user and group.

    + src: the local file or file-like object
    + dest: the path on the host
    + user: the owner
    + group: the group
    + mode: the mode (``"644"``)

    Changes: the file, only when its content, mode or owner differ.

    Tunables: none.

    **Example:**

    .. code:: python

        converged.put(name="systemd unit", src=StringIO(text), dest=path, mode="644")
    """
    digest = _local_sha256(src)
    if digest is not None and not kwargs and mode is not True:
        have = memo.fact(FileState, path=dest)
        if (
            have
            and have["sha256"] == digest
            and (mode is None or have["mode"] == _mode(mode))
            and (user is None or have["user"] == user)
            and (group is None or have["group"] == group)
        ):
            host.noop(f"file {dest} is already uploaded")
            return
    if isinstance(src, StringIO):
        src.seek(0)
    yield from files.put._inner(src=src, dest=dest, user=user, group=group, mode=mode, **kwargs)


def _present(spec: str, installed: dict) -> bool:
    name, _, version = spec.partition("=")
    versions = installed.get(name)
    return bool(versions) and (not version or version in versions)


@operation()
def packages(
    packages=None,
    present: bool = True,
    latest: bool = False,
    update: bool = False,
    upgrade: bool = False,
    setting: str = "",
    **kwargs,
):
    """``apt.packages``: no change (and no command) when dpkg, read once per run, already has every package
    (at the pinned version, where one is given) or, with present=False, none. ``setting``: the group-
    data setting(s) that chose the packages or versions; a failed apt-get names it in its report
    (tritonfleet.host.ops.aptlock).

    + packages: the packages (``name=version`` to pin one)
    + present: installed (True) or removed (False)
    + latest: upgrade to the latest version
    + update: run apt-get update first
    + upgrade: run apt-get upgrade first
    + setting: the group-data setting(s) that chose the packages, named in a failure report

    Changes: the packages, only when dpkg does not already have them as asked.

    Tunables: none.

    **Example:**

    .. code:: python

        converged.packages(name="Docker Engine", packages=["docker.io", "apparmor"], setting="docker_source")
    """
    specs = [packages] if isinstance(packages, str) else list(packages or [])
    if not (latest or update or upgrade):
        installed = memo.fact(DpkgState)["installed"]
        if present and all(_present(s, installed) for s in specs):
            host.noop(f"packages {', '.join(specs)} are installed")
            return
        if not present and not any(s.partition("=")[0] in installed for s in specs):
            host.noop(f"packages {', '.join(specs)} are not installed")
            return
    # every apt-get command waits for a held apt/dpkg lock (unattended-upgrades), with a bound,
    # and a failure is reported with its cause
    for command in apt.packages._inner(
        packages=specs, present=present, latest=latest, update=update, upgrade=upgrade, **kwargs
    ):
        yield aptlock.wrap(command, setting=setting)


@operation()
def service(service: str, running: bool = True, enabled: bool | None = None, restarted: bool = False, **kwargs):
    """``systemd.service``: no change when the unit already runs (and is enabled) as asked.

    + service: the unit
    + running: running or stopped
    + enabled: enabled at boot (None: left as it is)
    + restarted: restart it

    Changes: the unit's state, only when it differs.

    Tunables: none.

    **Example:**

    .. code:: python

        converged.service(name="docker running", service="docker.service", enabled=True)
    """
    if not restarted and not kwargs and running is not None:
        unit = service if "." in service else f"{service}.service"
        have = memo.fact(UnitState, unit=unit)
        if have["running"] == running and (enabled is None or have["enabled"] == enabled):
            host.noop(
                f"service {unit} is {'running' if running else 'stopped'}"
                + ("" if enabled is None else f" and {'enabled' if enabled else 'disabled'}")
            )
            return
    yield from systemd.service._inner(service=service, running=running, enabled=enabled, restarted=restarted, **kwargs)
