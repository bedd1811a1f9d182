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

from ..core import report, runid
from ..core.shell import q
from ..pyinfra_ext import stream, transfer
from ..pyinfra_ext.stream import wrapped
from ..settings import access
from .release import (
    INCOMING,
    OWN_PREFIX,
    finish_script,
    incoming_dir,
    index_command,
    make_plan,
    parse_index,
    prepare_script,
    receive_command,
    switch_script,
)

# a prepare script above this size is uploaded (SFTP) instead of sent as the command line
INLINE_SCRIPT_MAX = 64 * 1024


class ReleaseIndex(FactBase):
    """What building a release can reuse on the host (tritonfleet.model_repo.release.parse_index)."""

    @staticmethod
    def default():
        return {"releases": {}, "drift": {}, "incoming": {}}

    def command(self, base: str, release: str) -> str:
        return index_command(base, release)

    def process(self, output):
        return parse_index(output)


DISK_FULL_HELP = (
    "{host}: the disk holding {base} is full (or over quota). The live model release is unchanged and Triton keeps "
    "serving it; the part already sent stays in {base}/releases/{incoming} and the next run "
    "sends only the rest. Free space on the host (`df -h {base}`; fewer earlier releases kept: "
    "triton_keep_releases), then run the deploy again."
)


def _send_files(
    state, host, root: str, paths: list[str], remote: str, transport: str, base: str = "", release: str = ""
) -> bool:
    try:
        sent = transfer.send(host, Path(root), paths, remote, transport)
    except (transfer.TransferError, OSError) as e:
        text = report.without_host(str(e), host.name).splitlines() or [type(e).__name__]
        now = (
            f"the live model release is unchanged and Triton keeps serving it; what was sent stays in "
            f"{base}/releases/{INCOMING}{release} and the next run sends only the rest"
        )
        fix = "restore the link to the host, then run the deploy again"
        # tar on the host: "Cannot write: No space left on device", or a short write ("Wrote
        # only 4608 of 10240 bytes") when the disk fills in the middle of a block
        if re.search(r"No space left on device|Disk quota exceeded|tar: .*: Wrote only \d+ of \d+ bytes", str(e)):
            fix = DISK_FULL_HELP.format(host=host.name, base=base, incoming=incoming_dir(release, runid.RUN_ID))
        report.emit(
            host,
            report.Failure(
                host.name,
                "Model repository (transfer)",
                f"release {release} sent to {base}/releases",
                text[0],
                report.trim(text[1:]),
                "the transfer's own words (ssh, tar)",
                now,
                fix,
                cause=text[0],
            ),
        )
        return False
    logger.info(f"{host.print_prefix}model release: {sent}")
    return True


# --- model origin: the host fetches the objects itself (tritonfleet.model_repo) -------------


def _fetch_objects(
    state,
    host,
    root: str,
    manifest: dict,
    paths: list[str],
    origin,
    base: str = "",
    release: str = "",
    parallel: int = 8,
    retries: int = 3,
) -> bool:
    """Make the origin hold ``release`` (uploads what it lacks, once a run), then have the host
    fetch, verify and place the objects of ``paths``; a failure is reported naming each object."""
    from . import fetch
    from . import origin as origins

    now = "the live model release is unchanged and Triton keeps serving it"
    step = "Model repository (fetch from the model origin)"
    try:
        # a pull-mode host only reads: the control machine published at `tritonfleet pull publish`
        published = (
            origins.publish(origin, Path(root), manifest, release)
            if origins.publishes_here()
            else origins.published(origin, manifest, release)
        )
        wanted = {p: manifest[p][1] for p in paths}
        sizes = {manifest[p][1]: int(manifest[p][0]) for p in paths}
        urls = origins.urls(origin, list(sizes))
    except origins.OriginError as e:
        report.emit(
            host,
            report.Failure(
                host.name,
                step,
                f"release {release} at the model origin {origin.url}",
                str(e),
                [],
                "",
                now + "; nothing was fetched",
                "make the origin reachable from this machine (model_origin, model_origin_endpoint, credentials), "
                "then run the deploy again",
                cause=str(e)[:200],
            ),
        )
        return False
    logger.info(f"{host.print_prefix}{published}")
    stdin = fetch.fetch_list({s: (n, urls[s]) for s, n in sizes.items()}, wanted)
    script = fetch.fetch_script(
        base, release, runid.RUN_ID, parallel, retries, credentials=origins.store_for(origin).host_fetch_config()
    )
    ok, out = host.run_shell_command(
        StringCommand(script), print_output=False, **{**stream.connector_arguments(), "_stdin": stdin}
    )
    res = fetch.parse_fetch(out.stdout_lines)
    if ok and res.ok:
        resumed = sum(res.resumed.values())
        logger.info(
            f"{host.print_prefix}model release: fetched {len(res.verified)} objects "
            f"({res.fetched_bytes / 1e6:.1f} MB this run{f', {resumed / 1e6:.1f} MB resumed' if resumed else ''}) "
            f"from {origin.url}, every sha256 verified"
        )
        return True
    lines = (
        fetch.problems(res, wanted, origin.url, origin.object_key)
        or [ln for ln in out.stdout_lines + out.stderr_lines if ln.strip()][-5:]
        or ["the fetch failed"]
    )
    said = res.curl_said + [ln for ln in out.stderr_lines if ln.strip()]
    corrupt = bool(res.corrupt)
    fix = (
        "an object at the origin is not what its name says: delete it there (the next run uploads it again "
        "from this machine) and run the deploy again"
        if corrupt
        else "make the origin reachable from the host (curl on the host, its network, the URL's expiry: "
        "model_origin_url_expiry), then run the deploy again: what arrived is kept and resumes"
    )
    report.emit(
        host,
        report.Failure(
            host.name,
            step,
            f"every object of release {release} fetched from {origin.url} and its sha256 verified",
            lines[0],
            report.trim(lines[1:] + said),
            "the fetch's own words (curl, sha256sum)",
            now
            + (
                "; the refused objects were deleted on the host"
                if corrupt
                else f"; what arrived stays in {base}/releases/{fetch.OBJECTS_DIR}"
            ),
            fix,
            cause=lines[0][:200],
        ),
    )
    return False


@operation(is_idempotent=True)
def model_release(
    base: str,
    release: str,
    local: str,
    manifest: dict,
    keep: int,
    transport: str = "auto",
    origin=None,
    switch: bool = True,
):
    """Make ``release`` (the repository at ``local``, whose manifest is ``manifest``) the live model
    repository below ``base``; keep ``keep`` earlier releases. ``origin``
    (tritonfleet.model_repo.origin.Origin): the host fetches what it lacks from there instead of
    receiving it over SSH. ``switch`` False: staging, the release is made complete on the host and the
    live link is left alone.

    + base: the Triton base directory on the host
    + release: the release id
    + local: the repository on the control machine
    + manifest: its manifest (path: digest)
    + keep: how many earlier releases to keep
    + transport: how files are sent (``auto``, ``sftp``, ``tar``)
    + origin: the model origin the host fetches from instead
    + switch: switch the live link (False: staging)

    Changes: ``<base>/releases/<release>`` and, with ``switch``, the ``model_repository`` link.

    Tunables: ``model_origin_parallel``, ``model_origin_retries``.

    **Example:**

    .. code:: python

        model_release(name="model release", base="/opt/triton", release=rid, local=repo, manifest=man, keep=3)
    """
    index = host.get_fact(ReleaseIndex, base=base, release=release)
    if not switch and release in index["releases"] and not index["drift"].get(release):
        host.noop(f"model release {release} is staged (complete on the host)")
        return
    if release in index["releases"] and not index["drift"].get(release):
        # complete and untouched on the host (an earlier release, or one built by a run that
        # stopped before the switch): switching is all there is to do
        yield StringCommand(switch_script(base, release, keep, runid.RUN_ID))
        return
    plan = make_plan(release, manifest, index)
    how = transfer.choose(host, transport) if plan.send and origin is None else None
    logger.info(
        f"{host.print_prefix}model release {release}"
        f"{' (rebuilding: files changed on the host)' if plan.repair else ''}: {plan.summary()}"
        f"{f' over {how}' if how else ''}{f' from {origin.url}' if origin and plan.send else ''}"
    )
    script = prepare_script(base, plan, manifest, runid.RUN_ID)
    if len(script) <= INLINE_SCRIPT_MAX:
        yield StringCommand(script)
    else:
        path = f"{base}/releases/{OWN_PREFIX}plan-{release}.{runid.RUN_ID}.sh"
        yield StringCommand(f"mkdir -p {q(base + '/releases')}")
        yield FileUploadCommand(StringIO(script), path)
        yield StringCommand(f"sh {q(path)}; rc=$?; rm -f {q(path)}; exit $rc")
    if plan.send and origin is not None:
        yield FunctionCommand(
            _fetch_objects,
            (local, manifest, plan.send, origin),
            {
                "base": base,
                "release": release,
                "parallel": int(access.get("model_origin_parallel")),
                "retries": int(access.get("model_origin_retries")),
            },
        )
    elif plan.send:
        remote = wrapped(receive_command(base, release, runid.RUN_ID))
        yield FunctionCommand(_send_files, (local, plan.send, remote, how), {"base": base, "release": release})
    yield StringCommand(finish_script(base, release, keep, manifest, runid.RUN_ID, switch=switch))
