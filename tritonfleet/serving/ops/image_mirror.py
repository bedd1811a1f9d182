"""The image mirror's fill as an operation (the step that runs it: tritonfleet.steps.mirror;
what the fill does and why: tritonfleet.serving.image_mirror)."""

from __future__ import annotations

import os

from pyinfra import logger
from pyinfra.api import FunctionCommand, operation

from ...core import report
from ...pyinfra_ext.stream import connector_arguments
from .. import image_mirror as mirror


def _fill(
    state,
    host,
    url: str,
    path: str,
    digest: str,
    storage: str,
    ca: str | None,
    upstream: str,
    user: str | None,
    secret_env: str | None,
    arguments: dict,
) -> bool:
    step = f"Image mirror (fill with {path}@{digest[:19]})"

    def fail(found: str, words: list[str]) -> bool:
        report.emit(
            host,
            report.Failure(
                host.name,
                step,
                f"every blob of {path}@{digest} in the mirror's store",
                found,
                report.trim(words),
                "the mirror's and curl's own words",
                "the hosts still serve their image; nothing was pulled",
                f"check the mirror ({url}) and its upstream (journalctl -u docker-registry on {host.name}), then run "
                "again",
                cause=found[:200],
            ),
        )
        return False

    if user:
        # the mirror's client password, read now (never while pyinfra plans) and sent on stdin
        secret = os.environ.get(secret_env or "")
        if mirror.client_secret_problem(secret):
            return fail(f"${secret_env} on the control machine {mirror.client_secret_problem(secret)}", [])
        arguments = {**arguments, "_stdin": secret}
    reference, blobs = digest, []
    for _ in range(2):  # an index names the platform's manifest: one more step
        ok, out = host.run_shell_command(
            mirror.manifest_command(url, path, reference, ca, user), print_output=False, **arguments
        )
        if not ok:
            return fail(f"the mirror did not give the manifest {path}@{reference}", out.stderr_lines)
        try:
            kind, found = mirror.parse_manifest("\n".join(out.stdout_lines))
        except ValueError as e:
            return fail(f"manifest {path}@{reference}: {e}", [])
        if kind == "image":
            blobs = found
            break
        reference = found[0]
    ok, out = host.run_shell_command(
        mirror.fill_script(url, path, blobs, storage, ca, user=user), print_output=False, **arguments
    )
    res = mirror.parse_fill(out.stdout_lines)
    if not ok or res["failed"]:
        return fail(f"{len(res['failed'])} blob(s) did not reach the mirror's store", res["failed"] + out.stderr_lines)
    logger.info(
        f"{host.print_prefix}image mirror: {path}@{digest[:19]}: {len(res['filled'])} blob(s) fetched "
        f"from {upstream}, {len(res['cached'])} already there"
    )
    return True


@operation(is_idempotent=False)
def fill(
    url: str,
    path: str,
    digest: str,
    storage: str,
    ca: str | None = None,
    upstream: str = "",
    user: str | None = None,
    secret_env: str | None = None,
):
    """Bring every blob of ``path@digest`` into the mirror's store (one fetch from the upstream);
    with ``user``, logged in to the mirror as that client.

    + url: the mirror's URL
    + path: the repository path of the image
    + digest: the manifest digest to fetch
    + storage: the mirror's storage directory
    + ca: the mirror's CA file (TLS)
    + upstream: the upstream registry
    + user: the mirror's client login (``mirror_client_user``); None: the mirror has no client login
    + secret_env: the control machine's variable holding that login's password, read when the fill
      runs and sent on stdin

    Changes: the mirror's store (blobs fetched once from the upstream).

    Tunables: none (the mirror step passes them from ``image_mirror_*``, ``mirror_client_*``).

    **Example:**

    .. code:: python

        fill(name="fill the mirror", url=url, path="nvidia/tritonserver", digest=digest, storage="/var/lib/registry",
             user="tritonfleet", secret_env="TRITONFLEET_MIRROR_PASSWORD")
    """
    yield FunctionCommand(
        _fill, (url, path, digest, storage, ca, upstream, user, secret_env, connector_arguments()), {}
    )
