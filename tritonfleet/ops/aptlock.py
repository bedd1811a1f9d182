"""apt and dpkg commands that wait for the package manager's locks, with a bound.

unattended-upgrades (or an operator's ``apt``) holding ``/var/lib/dpkg/lock-frontend`` or
``/var/lib/apt/lists/lock`` makes apt-get fail at once ("Could not get lock ... held by process
1234 (unattended-upgr)"); ``-o DPkg::Lock::Timeout`` covers installs but not ``apt-get update``.
``wrap()`` runs a command and, while it fails on a lock, runs it again every 2 s until
``apt_lock_timeout`` seconds have passed; then it fails with what held the lock and what to do.
A command that failed on a lock did nothing (apt takes the locks before it changes anything), so
running it again is safe.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation

from .. import config
from ..shell import q

LOCK_ERRORS = ("Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock (the )?"
               "(administration )?directory|frontend lock was locked|status database area is locked")

WRAPPER = """\
tf_end=$(( $(date +%s) + {timeout} )); tf_out=$(mktemp); tf_wait=0
while :; do
  ( {command} ) >"$tf_out" 2>&1; tf_rc=$?
  if [ "$tf_rc" -ne 0 ] && grep -qE {pattern} "$tf_out"; then
    if [ "$(date +%s)" -lt "$tf_end" ]; then tf_wait=$((tf_wait + 2)); sleep 2; continue; fi
    cat "$tf_out" >&2
    echo "tritonfleet: the apt/dpkg lock on $(hostname) stayed held by another process for more than \
{timeout} s ($(grep -oE 'held by process [0-9]+( \\([^)]*\\))?' "$tf_out" | head -n 1 || true)); this step \
changed nothing. Let that process finish (unattended-upgrades usually does within minutes) or stop it, \
then run the deploy again; apt_lock_timeout (group data) sets how long to wait" >&2
    rm -f "$tf_out"; exit "$tf_rc"
  fi
  [ "$tf_wait" -gt 0 ] && echo "waited ${{tf_wait}} s for the apt/dpkg lock"
  if [ "$tf_rc" -eq 0 ]; then cat "$tf_out"; else cat "$tf_out" >&2; fi
  rm -f "$tf_out"; exit "$tf_rc"
done"""


def timeout() -> int:
    value = config.get("apt_lock_timeout")
    try:
        value = int(value)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise config.ConfigError(f"{host.name}: apt_lock_timeout must be a number of seconds >= 0, not "
                                 f"{config.get('apt_lock_timeout')!r} (group data, inventories/group_data/all.py)")
    return value


def wrap(command, seconds: int | None = None):
    """``command`` (a shell string) run so that it waits for held apt/dpkg locks; other command
    objects (file uploads, Python callbacks) are returned unchanged."""
    if isinstance(command, StringCommand):
        command = command.get_raw_value()
    if not isinstance(command, str):
        return command
    seconds = timeout() if seconds is None else seconds
    return StringCommand(WRAPPER.format(timeout=seconds, command=command, pattern=q(LOCK_ERRORS)))


@operation(is_idempotent=False)
def update():
    """``apt-get update``, waiting for the lists lock (apt_lock_timeout)."""
    yield wrap("apt-get update")


def wrapped(commands: list) -> list:
    """Every shell string of ``commands`` waiting for the apt/dpkg locks (for server.shell)."""
    return [wrap(c) for c in commands]


REPAIR = """\
echo "tritonfleet: dpkg on $(hostname) was interrupted earlier ({what}); running dpkg --configure -a to \
finish it before anything else"
if ! DEBIAN_FRONTEND=noninteractive dpkg --configure -a; then
  echo "tritonfleet: dpkg --configure -a failed on $(hostname): a package's maintainer script fails (its \
output is above; dpkg --audit lists what is left half-installed). Fix or remove that package by hand \
(dpkg --remove <package>), then run the deploy again; nothing else was changed" >&2
  exit 1
fi"""


@operation(is_idempotent=False)
def repair_interrupted():
    """``dpkg --configure -a`` when an earlier dpkg run was cut (a package left half-installed,
    unpacked or half-configured, or dpkg's journal not folded in): apt refuses every install until
    then ("dpkg was interrupted, you must manually run 'dpkg --configure -a'"). Each host-layer step
    starts with it; once it ran, the facts are read again (facts.memo) and the later ones find
    nothing to do. Waits for the locks like every apt command."""
    from pyinfra import logger

    from ..facts import memo
    from ..facts.host import DpkgState

    what = memo.fact(DpkgState).get("interrupted") or []
    if not what:
        host.noop("dpkg was not interrupted")
        return
    shown = ", ".join(what[:5]) + (f" and {len(what) - 5} more" if len(what) > 5 else "")
    logger.warning(f"{host.name}: dpkg was interrupted earlier ({shown}): the deploy runs dpkg --configure -a "
                   "first")
    yield wrap(REPAIR.format(what=shown.replace('"', "")))
