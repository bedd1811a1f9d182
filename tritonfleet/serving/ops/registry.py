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
from ..image_mirror import htpasswd_script, secret_file_script


class MissingSecret(TritonfleetError, RuntimeError):
    pass


class SecretStdinCommand(StringCommand):
    """A shell command whose stdin is the value of an environment variable of the control
    machine, read only when the command runs."""

    def __init__(self, *bits, secret_env: str, **arguments):
        super().__init__(*bits, **arguments)
        self.secret_env = secret_env

    def execute(self, state, host, connector_arguments):
        secret = os.environ.get(self.secret_env)
        if not secret:
            raise MissingSecret(
                f"{host.name}: ${self.secret_env} is empty on the control machine; "
                "export the registry secret there (it is never read from files or argv)"
            )
        connector_arguments.update(self.connector_arguments)
        connector_arguments["_stdin"] = secret
        return host.run_shell_command(
            self, print_output=state.print_output, print_input=state.print_input, **connector_arguments
        )


@operation(is_idempotent=False)
def docker_login(registry: str, user: str, secret_env: str):
    """`docker login` to ``registry`` as ``user``; the secret comes from ``$secret_env`` on the control
    machine and reaches docker on stdin.

    + registry: the registry host
    + user: the user name
    + secret_env: the control machine's environment variable holding the secret

    Changes: Docker's credentials on the host.

    Tunables: none (the image step passes ``registry_user``, ``registry_password_env``).

    **Example:**

    .. code:: python

        docker_login(name="log in to nvcr.io", registry="nvcr.io", user="$oauthtoken", secret_env="NGC_API_KEY")
    """
    yield SecretStdinCommand(
        "docker",
        "login",
        "--username",
        QuoteString(user),
        "--password-stdin",
        QuoteString(registry),
        secret_env=secret_env,
    )


@operation(is_idempotent=False)
def secret_env_file(path: str, service: str, secret_env: str):
    """The registry secret (``$secret_env`` on the control machine, read when the command runs)
    written on the host to ``path``, the environment file of ``service``, which restarts when the
    secret changed; the secret reaches the host on stdin only (no plan, diff, argv or log holds it).

    + path: the environment file on the host (``REGISTRY_PROXY_PASSWORD='...'``, 0600 root)
    + service: the systemd unit that reads it, restarted only when the secret changed
    + secret_env: the control machine's environment variable holding the secret

    Changes: the environment file; restarts ``service`` when its content changed.

    Tunables: none (the mirror step passes ``registry_password_env``).

    **Example:**

    .. code:: python

        secret_env_file(name="the mirror's upstream secret", path="/etc/docker/registry/upstream-password.env",
                        service="docker-registry", secret_env="NGC_API_KEY")
    """
    yield SecretStdinCommand(secret_file_script(path, service), secret_env=secret_env)


@operation(is_idempotent=False)
def mirror_htpasswd(path: str, user: str, service: str, secret_env: str):
    """The image mirror's htpasswd file at ``path``: ``user`` with the bcrypt hash of
    ``$secret_env`` (control machine, read when the command runs), hashed on the host from stdin;
    ``service`` restarts when it changed (tritonfleet.serving.image_mirror.htpasswd_script).

    + path: the htpasswd file the registry's ``auth: htpasswd`` reads (0640 root:docker-registry)
    + user: the mirror's client login (``mirror_client_user``)
    + service: the registry's systemd unit, restarted only when the file changed
    + secret_env: the control machine's environment variable holding the client password

    Changes: the htpasswd file; restarts ``service`` when it changed.

    Tunables: none (the mirror step passes ``mirror_client_user``, ``mirror_client_password_env``).

    **Example:**

    .. code:: python

        mirror_htpasswd(name="the mirror's client login", path="/etc/docker/registry/htpasswd",
                        user="tritonfleet", service="docker-registry", secret_env="TRITONFLEET_MIRROR_PASSWORD")
    """
    yield SecretStdinCommand(htpasswd_script(path, user, service), secret_env=secret_env)
