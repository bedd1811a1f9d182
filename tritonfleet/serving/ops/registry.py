"""Private registry login with the secret on stdin only.

The secret is read from the control machine's environment when the command executes (never while
pyinfra plans, so ``--dry`` never holds it), and written to ``docker login --password-stdin``
over the SSH channel: it is in no command line (argv), no file on the host or here, no
operation argument and no log line. Docker keeps the login in ``~/.docker/config.json`` (0600).
"""

from __future__ import annotations

import os

from pyinfra.api import QuoteString, StringCommand, operation

from ...core.errors import TritonfleetError
from ...host.facts import DockerImageId
from ...pyinfra_ext import memo
from ...settings import access as config


class MissingSecret(TritonfleetError, RuntimeError):
    pass


def registry_of(image: str) -> str:
    """The registry an image reference pulls from, by Docker's rules: the first path component
    when it has a '.' or ':' or is 'localhost', else Docker Hub (docker.io)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def login_registry() -> str:
    """The registry the login (registry_user) is for: registry_host, or triton_image's registry."""
    return config.get("registry_host") or registry_of(config.get("triton_image"))


def needs_login(image: str) -> bool:
    """Pulling ``image`` needs the registry login."""
    return bool(config.get("registry_user")) and registry_of(image) == login_registry()


def pulls(images: list[str]) -> list[str]:
    """Those of ``images`` this host will pull (no archive configured, not present yet)."""
    archives = config.get("image_archives") or {}
    return [i for i in images if i not in archives and not memo.fact(DockerImageId, image=i)]


class SecretStdinCommand(StringCommand):
    """A shell command whose stdin is the value of an environment variable of the control
    machine, read only when the command runs."""

    def __init__(self, *bits, secret_env: str, **arguments):
        super().__init__(*bits, **arguments)
        self.secret_env = secret_env

    def execute(self, state, host, connector_arguments):
        secret = os.environ.get(self.secret_env)
        if not secret:
            raise MissingSecret(f"{host.name}: ${self.secret_env} is empty on the control machine; "
                                "export the registry secret there (it is never read from files or argv)")
        connector_arguments.update(self.connector_arguments)
        connector_arguments["_stdin"] = secret
        return host.run_shell_command(self, print_output=state.print_output, print_input=state.print_input,
                                      **connector_arguments)


@operation(is_idempotent=False)
def docker_login(registry: str, user: str, secret_env: str):
    """`docker login` to ``registry`` as ``user``; the secret comes from ``$secret_env`` on the
    control machine and reaches docker on stdin."""
    yield SecretStdinCommand("docker", "login", "--username", QuoteString(user), "--password-stdin",
                             QuoteString(registry), secret_env=secret_env)


DIGEST_RE = r"sha256:[0-9a-f]{64}"


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """Docker's image reference grammar, the parts tritonfleet needs: ``name[:tag][@digest]`` ->
    (name, tag or None, digest or None). A ':' before the last '/' belongs to a registry port."""
    import re

    ref, _, digest = str(image).partition("@")
    name, tag = ref, None
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        name, tag = ref[:colon], ref[colon + 1:]
    if digest and not re.fullmatch(DIGEST_RE, digest):
        raise ValueError(f"image {image!r}: the digest must be sha256:<64 hex digits>")
    return name, tag, digest or None
