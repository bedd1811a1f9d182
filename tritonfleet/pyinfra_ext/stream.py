"""Operations that stream local data into a command on the host (tritonfleet.pyinfra_ext.transfer), and the
remote command wrapping they share with pyinfra (sudo, su, env, shell)."""

from __future__ import annotations

import inspect
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.connectors.util import make_unix_command, make_unix_command_for_host

from ..core import report
from ..core.shell import q
from . import transfer


def wrapped(command: str) -> str:
    """``command`` as pyinfra would run it for the current operation (sudo, su, env, shell)."""
    accepted = set(inspect.signature(make_unix_command).parameters)
    args = {
        k: v
        for k, v in (host.current_op_global_arguments or {}).items()
        if k in CONNECTOR_ARGUMENT_KEYS and k in accepted
    }
    return make_unix_command_for_host(state, host, StringCommand(command), **args).get_raw_value()


def _load(state, host, archive: str, remote: str, how: str) -> bool:
    try:
        sent = transfer.send_file(host, Path(archive), remote, how)
    except (transfer.TransferError, OSError) as e:
        text = report.without_host(str(e), host.name).splitlines() or [type(e).__name__]
        report.emit(
            host,
            report.Failure(
                host.name,
                "Triton image (docker load)",
                f"image archive {Path(archive).name} loaded into Docker",
                text[0],
                report.trim(text[1:]),
                "the transfer's and docker load's own words",
                "the image is loaded before any restart: the running Triton container and its unit are unchanged",
                "check the archive and the link to the host (and `docker load` on the host by hand: "
                f"ssh {host.name} docker load < {archive}), then run the deploy again",
                cause=text[0],
            ),
        )
        return False
    logger.info(f"{host.print_prefix}docker load: {sent}")
    return True


@operation(is_idempotent=False)
def docker_load(archive: str, transport: str = "auto"):
    """`docker load` of a local image archive, streamed into the host's `docker load` (no copy of the
    archive on the host's disk).

    + archive: the image archive on the control machine
    + transport: how it is streamed (``auto``, ``ssh``)

    Changes: the image in Docker's store.

    Tunables: none (the image step chooses the transport from ``bulk_transfer``).

    **Example:**

    .. code:: python

        docker_load(name="load the Triton image", archive="images/triton.tar")
    """
    how = transfer.choose(host, transport)
    yield FunctionCommand(_load, (archive, wrapped("docker load"), how), {})


def connector_arguments() -> dict:
    """The current operation's connector arguments (sudo, su, env, ...), for a command a Python
    callback runs itself."""
    return {k: v for k, v in (host.current_op_global_arguments or {}).items() if k in CONNECTOR_ARGUMENT_KEYS}


def _pull(state, host, image: str, arguments: dict) -> bool:
    ok, out = host.run_shell_command(f"docker pull {q(image)}", print_output=False, **arguments)
    if ok:
        return True
    said = [ln for ln in out.stdout_lines + out.stderr_lines if ln.strip()]
    first = next((ln for ln in said if "rror" in ln), said[-1] if said else "docker pull failed")
    report.emit(
        host,
        report.Failure(
            host.name,
            f"docker pull {image}",
            f"image {image} on the host before Triton is restarted",
            first.strip(),
            report.trim(said),
            "Docker's own words",
            "the image is pulled before any restart: the running Triton container, its unit and the live model "
            "release are unchanged (no later step ran)",
            f"check the image name and the registry (reachable from the host? logged in? `docker pull {image}` on the "
            "host shows it), then run the deploy again",
            cause=first.strip(),
        ),
    )
    return False


@operation(is_idempotent=False)
def docker_pull(image: str):
    """`docker pull`; a failure fails the host with Docker's words and what still serves.

    + image: the image reference (a digest pin is best)

    Changes: the image in Docker's store.

    Tunables: none.

    **Example:**

    .. code:: python

        docker_pull(name="pull the Triton image", image=config.get("triton_image"))
    """
    yield FunctionCommand(_pull, (image, connector_arguments()), {})
