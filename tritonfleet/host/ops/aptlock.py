"""apt and dpkg commands that wait for the package manager's locks, with a bound, and fail a host
with one report that says what apt's failure means (tritonfleet.host.apt_diagnosis).

unattended-upgrades (or an operator's ``apt``) holding ``/var/lib/dpkg/lock-frontend`` or
``/var/lib/apt/lists/lock`` makes apt-get fail at once ("Could not get lock ... held by process
1234 (unattended-upgr)"); ``-o DPkg::Lock::Timeout`` covers installs but not ``apt-get update``.
``wrap()`` runs a command and, while it fails on a lock, runs it again every 2 s until
``apt_lock_timeout`` seconds have passed; then it fails with what held the lock and what to do.
A command that failed on a lock did nothing (apt takes the locks before it changes anything), so
running it again is safe.

The command runs with ``LC_ALL=C.UTF-8`` (apt's messages are then the ones the classifier
reads). When it fails, the whole output stays on the host (``apt_diagnosis.APT_LOG``) and the host
fails with the report of ``apt_report.failure``: the command, apt's key lines, what they mean and
the fix; pyinfra's own dump of the output is not repeated.
"""

from __future__ import annotations

import contextlib

from pyinfra import host, logger
from pyinfra.api import StringCommand, operation
from pyinfra.connectors.util import CommandOutput

from ...core import report
from ...core.connection_errors import CONNECTION_ERRORS
from ...core.shell import q
from ...pyinfra_ext import memo
from ...settings import access
from .. import apt_diagnosis, apt_messages, apt_report
from ..facts import DpkgState

LOCK_ERRORS = apt_messages.LOCK_ERRORS

WRAPPER = """\
tf_end=$(( $(date +%s) + {timeout} )); tf_out=$(mktemp); tf_wait=0
while :; do
  ( export LC_ALL=C.UTF-8; unset LANGUAGE; {command} ) >"$tf_out" 2>&1; tf_rc=$?
  if [ "$tf_rc" -ne 0 ] && grep -qE {pattern} "$tf_out"; then
    if [ "$(date +%s)" -lt "$tf_end" ]; then tf_wait=$((tf_wait + 2)); sleep 2; continue; fi
    echo "tritonfleet: the apt/dpkg lock on $(hostname) stayed held by another process for more than \
{timeout} s ($(grep -oE 'held by process [0-9]+( \\([^)]*\\))?' "$tf_out" | head -n 1 || true)); this step \
changed nothing. Let that process finish (unattended-upgrades usually does within minutes) or stop it, \
then run the deploy again; apt_lock_timeout (group data) sets how long to wait" >>"$tf_out"
  fi
  [ "$tf_wait" -gt 0 ] && echo "waited ${{tf_wait}} s for the apt/dpkg lock"
  if [ "$tf_rc" -ne 0 ] || grep -q '^W: ' "$tf_out"; then
    {{ mkdir -p {log_dir} && cp "$tf_out" {log}; }} 2>/dev/null
  fi
  if [ "$tf_rc" -eq 0 ]; then cat "$tf_out"; else cat "$tf_out" >&2; fi
  rm -f "$tf_out"; exit "$tf_rc"
done"""


class AptCommand(StringCommand):
    """An apt/dpkg command (``script``: ``command`` inside the lock wait) whose failure fails the
    host with the report of tritonfleet.host.apt_diagnosis. ``require``: a repository URL that the command
    (an ``apt-get update``) must have read; ``setting``: the group-data setting that chose its
    packages or versions (named in the fix)."""

    def __init__(self, script: str, command: str, require: str = "", setting: str = "", shown: str = ""):
        super().__init__(script)
        self.command, self.require, self.setting = shown or command, require, setting

    def execute(self, state, host, connector_arguments):
        status, output = super().execute(state, host, connector_arguments)
        lines = list(output.output_lines) if output is not None else []
        diagnosis = apt_diagnosis.classify(lines, 0 if status else 100, require=self.require)
        if diagnosis is None:
            if status:
                warn_unread(host, lines)
            return status, output
        report_failure(state, host, diagnosis, self, connector_arguments)
        # the report holds apt's key lines (and the host all of them): no second dump of the output
        return False, CommandOutput([])


def warn_unread(host, lines: list[str]) -> None:
    """apt-get update exits 0 when a repository cannot be read: say so (its packages cannot be
    installed until it can)."""
    said = [ln for ln in lines if ln.startswith("W: ") and ("Failed to fetch" in ln or "GPG error" in ln)]
    if said:
        logger.warning(
            f"{host.name}: apt-get update could not read every repository; packages only they carry cannot "
            "be installed until they can:\n    " + "\n    ".join(report.trim(said, 6))
        )


def report_failure(
    state, host, diagnosis: apt_diagnosis.AptDiagnosis, command: AptCommand, connector_arguments
) -> None:
    """Print the report of a failed apt command, hand it to a rollout and leave it on the host; what
    the host's package lists carry of a missing version, and which sources file names a repository
    in question, are read from the host (best effort: one command each, only now)."""
    available, sources = {}, []
    # as the command ran (sudo, su, env), without what only applies to it (stdin, exit codes, retries)
    args = {
        k: v
        for k, v in (connector_arguments or {}).items()
        if k not in ("_stdin", "_success_exit_codes", "_retries", "_retry_delay", "_retry_until")
    }
    with contextlib.suppress(*CONNECTION_ERRORS):  # best effort: the report goes out without it
        if diagnosis.cause == "version not available" and diagnosis.packages:
            ok, out = host.run_shell_command(
                apt_report.madison_command(diagnosis.packages), print_output=False, print_input=False, **args
            )
            available = apt_report.parse_madison(out.stdout_lines) if ok else {}
            available = {p: available.get(p, []) for p in diagnosis.packages}
    with contextlib.suppress(*CONNECTION_ERRORS):  # best effort: the report goes out without it
        if diagnosis.urls:
            ok, out = host.run_shell_command(
                apt_report.sources_command(diagnosis.urls), print_output=False, print_input=False, **args
            )
            sources = [ln.strip() for ln in out.stdout_lines if ln.strip().startswith("/")] if ok else []
    report.emit(
        host,
        apt_report.failure(
            diagnosis,
            host=host.name,
            step=report.step_name(state, host),
            command=command.command,
            setting=command.setting,
            available=available,
            sources=sources,
        ),
    )


def timeout() -> int:
    value = access.get("apt_lock_timeout")
    try:
        value = int(value)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise access.ConfigError(
            f"{host.name}: apt_lock_timeout must be a number of seconds >= 0, not "
            f"{access.get('apt_lock_timeout')!r} (group data, inventories/group_data/all.py)"
        )
    return value


def script(command: str, seconds: int) -> str:
    """The shell that runs ``command`` waiting up to ``seconds`` for held apt/dpkg locks."""
    log = apt_diagnosis.APT_LOG
    return WRAPPER.format(
        timeout=seconds, command=command, pattern=q(LOCK_ERRORS), log=q(log), log_dir=q(log.rsplit("/", 1)[0])
    )


def wrap(command, seconds: int | None = None, *, require: str = "", setting: str = "", shown: str = ""):
    """``command`` (a shell string) run so that it waits for held apt/dpkg locks and, when it
    fails, fails the host with apt's failure explained (``AptCommand``; ``shown``: the command as
    the report names it, when ``command`` is a script); other command objects (file uploads,
    Python callbacks) are returned unchanged."""
    if isinstance(command, StringCommand):
        command = command.get_raw_value()
    if not isinstance(command, str):
        return command
    seconds = timeout() if seconds is None else seconds
    return AptCommand(script(command, seconds), command, require=require, setting=setting, shown=shown)


@operation(is_idempotent=False)
def update(source: str = ""):
    """``apt-get update``, waiting for the lists lock (apt_lock_timeout). ``source``: the URL of the
    repository the step just added; apt-get update only warns when it cannot read one (exit status 0),
    and the install that follows would fail as "Unable to locate package": that repository's warning
    fails the host here, with its cause.

    + source: the URL of the repository the step just added; its warning fails the host

    Changes: apt's package lists.

    Tunables: ``apt_lock_timeout``.

    **Example:**

    .. code:: python

        aptlock.update(name="apt-get update", source=vendor_repos.docker().url)
    """
    yield wrap("apt-get update", require=source)


def wrapped(commands: list, setting: str = "") -> list:
    """Every shell string of ``commands`` waiting for the apt/dpkg locks (for server.shell)."""
    return [wrap(c, setting=setting) for c in commands]


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
    """``dpkg --configure -a`` when an earlier dpkg run was cut (a package left half-installed, unpacked or
    half-configured, or dpkg's journal not folded in): apt refuses every install until then ("dpkg was
    interrupted, you must manually run 'dpkg --configure -a'"). Each host-layer step starts with it;
    once it ran, the facts are read again (facts.memo) and the later ones find nothing to do. Waits for
    the locks like every apt command.

    Changes: dpkg's state, only after a cut dpkg run.

    Tunables: ``apt_lock_timeout``.

    **Example:**

    .. code:: python

        aptlock.repair_interrupted(name="finish an interrupted dpkg run")
    """

    what = memo.fact(DpkgState).get("interrupted") or []
    if not what:
        host.noop("dpkg was not interrupted")
        return
    shown = ", ".join(what[:5]) + (f" and {len(what) - 5} more" if len(what) > 5 else "")
    logger.warning(f"{host.name}: dpkg was interrupted earlier ({shown}): the deploy runs dpkg --configure -a first")
    yield wrap(REPAIR.format(what=shown.replace('"', "")), shown="dpkg --configure -a")
