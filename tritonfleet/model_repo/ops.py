"""The operation that makes a model repository release live on a host (layout and plan:
tritonfleet.model_repo.release). Reads the host when it runs, so it always works from the host's real state:
the same release already there (switch only), an interrupted transfer (resume), earlier releases
(hard links by content), or nothing (send everything)."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.facts import FactBase

from ..core import report as failure
from ..core import runid
from ..core.shell import q
from ..pyinfra_ext import transfer
from ..pyinfra_ext.stream import wrapped
from . import release as release_plan

# a prepare script above this size is uploaded (SFTP) instead of sent as the command line
INLINE_SCRIPT_MAX = 64 * 1024


class ReleaseIndex(FactBase):
    """What building a release can reuse on the host (tritonfleet.model_repo.release.parse_index)."""

    @staticmethod
    def default():
        return {"releases": {}, "drift": {}, "incoming": {}}

    def command(self, base: str, release: str) -> str:
        return release_plan.index_command(base, release)

    def process(self, output):
        return release_plan.parse_index(output)


DISK_FULL_HELP = (
    "{host}: the disk holding {base} is full (or over quota). The live model release is unchanged and Triton keeps "
    "serving it; the part already sent stays in {base}/releases/{incoming} and the next run "
    "sends only the rest. Free space on the host (`df -h {base}`; fewer earlier releases kept: "
    "triton_keep_releases), then run the deploy again."
)


def _send_files(state, host, root: str, paths: list[str], remote: str, transport: str,
                base: str = "", release: str = "") -> bool:
    try:
        sent = transfer.send(host, Path(root), paths, remote, transport)
    except (transfer.TransferError, OSError) as e:
        text = failure.without_host(str(e), host.name).splitlines() or [type(e).__name__]
        now = (f"the live model release is unchanged and Triton keeps serving it; what was sent stays in "
               f"{base}/releases/{release_plan.INCOMING}{release} and the next run sends only the rest")
        fix = "restore the link to the host, then run the deploy again"
        # tar on the host: "Cannot write: No space left on device", or a short write ("Wrote
        # only 4608 of 10240 bytes") when the disk fills in the middle of a block
        if re.search(r"No space left on device|Disk quota exceeded|tar: .*: Wrote only \d+ of \d+ bytes", str(e)):
            fix = DISK_FULL_HELP.format(host=host.name, base=base, incoming=release_plan.incoming_dir(release, runid.RUN_ID))
        failure.emit(host, failure.Failure(
            host.name, "Model repository (transfer)", f"release {release} sent to {base}/releases",
            text[0], failure.trim(text[1:]), "the transfer's own words (ssh, tar)", now, fix, cause=text[0]))
        return False
    logger.info(f"{host.print_prefix}model release: {sent}")
    return True


@operation(is_idempotent=True)
def model_release(base: str, release: str, local: str, manifest: dict, keep: int,
                  transport: str = "auto"):
    """Make ``release`` (the repository at ``local``, whose manifest is ``manifest``) the live
    model repository below ``base``; keep ``keep`` earlier releases."""
    index = host.get_fact(ReleaseIndex, base=base, release=release)
    if release in index["releases"] and not index["drift"].get(release):
        # complete and untouched on the host (an earlier release, or one built by a run that
        # stopped before the switch): switching is all there is to do
        yield StringCommand(release_plan.switch_script(base, release, keep, runid.RUN_ID))
        return
    plan = release_plan.make_plan(release, manifest, index)
    how = transfer.choose(host, transport) if plan.send else None
    logger.info(f"{host.print_prefix}model release {release}"
                f"{' (rebuilding: files changed on the host)' if plan.repair else ''}: {plan.summary()}"
                f"{f' over {how}' if how else ''}")
    script = release_plan.prepare_script(base, plan, manifest, runid.RUN_ID)
    if len(script) <= INLINE_SCRIPT_MAX:
        yield StringCommand(script)
    else:
        path = f"{base}/releases/{release_plan.OWN_PREFIX}plan-{release}.{runid.RUN_ID}.sh"
        yield StringCommand(f"mkdir -p {q(base + '/releases')}")
        yield FileUploadCommand(StringIO(script), path)
        yield StringCommand(f"sh {q(path)}; rc=$?; rm -f {q(path)}; exit $rc")
    if plan.send:
        remote = wrapped(release_plan.receive_command(base, release, runid.RUN_ID))
        yield FunctionCommand(_send_files, (local, plan.send, remote, how), {"base": base, "release": release})
    yield StringCommand(release_plan.finish_script(base, release, keep, manifest, runid.RUN_ID))
