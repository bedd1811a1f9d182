"""The Triton image through a pull-through cache (``deploys/mirror.py``; why and how:
tritonfleet.serving.image_mirror and docs/model-origin.md).

* ``image_mirror()``: on the hosts of the ``image_mirror_group`` inventory group, Debian's packaged
  registry (``docker-registry``) in proxy mode for ``image_mirror_upstream``, with TLS when given,
  restarted only when its configuration changed; with ``image_mirror_auth``, every client logs in
  with the mirror-only credential (``mirror_client_user``, ``$mirror_client_password_env``), whose
  bcrypt hash is written on the mirror host from stdin (``htpasswd -B -i``, apache2-utils).
* ``mirror_trust()``: on every other host, Docker trusts the mirror's CA
  (``/etc/docker/certs.d/<image_mirror>/ca.crt``, read on each pull: no daemon restart).
* ``mirror_filled()``: on the mirror's hosts, every blob of the fleet's pinned Triton image is
  brought into the mirror's store once (the staging run does this before the hosts pull; the
  operation: tritonfleet.serving.ops.image_mirror).
"""

from __future__ import annotations

import os
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.operations import files, systemd

from ..host.ops import converged
from ..pyinfra_ext import install
from ..pyinfra_ext.check import will_change
from ..serving import image_mirror as mirror
from ..serving.ops.image_mirror import fill
from ..serving.ops.registry import mirror_htpasswd, secret_env_file
from ..settings import access, mirrored

CONFIG = "/etc/docker/registry/config.yml"
CERT = "/etc/docker/registry/mirror.crt"
KEY = "/etc/docker/registry/mirror.key"
CA = "/etc/docker/registry/ca.crt"
DROP_IN = "/etc/systemd/system/docker-registry.service.d/tritonfleet.conf"
# the upstream's password, $REGISTRY_PROXY_PASSWORD for the registry (0600 root: systemd reads it
# before the service drops to its user); written at run time from the control machine's
# $registry_password_env on stdin, never part of config.yml or of pyinfra's plan
SECRET = "/etc/docker/registry/upstream-password.env"
# the mirror's clients (mirror_client_user and the bcrypt hash of $mirror_client_password_env),
# 0640 root:docker-registry; written at run time from stdin, never part of pyinfra's plan
HTPASSWD = "/etc/docker/registry/htpasswd"
# Distribution 2.8 exits when the upstream does not answer at its start (it pings it): systemd
# starts it again until it does (Debian's unit has no Restart=)
DROP_IN_TEXT = f"[Service]\nRestart=on-failure\nRestartSec=5\nEnvironmentFile=-{SECRET}\n"


def runs_mirror() -> bool:
    return access.get("image_mirror_group") in host.groups


def mirror_url() -> str:
    tls = access.get("image_mirror_tls_cert") and access.get("image_mirror_tls_key")
    return f"{'https' if tls else 'http'}://{access.get('image_mirror')}"


def client_ca_path() -> str | None:
    """Where Docker on each host reads the mirror's CA (``image_mirror_ca``), or None without one."""
    if not access.get("image_mirror") or not access.get("image_mirror_ca"):
        return None
    return f"/etc/docker/certs.d/{access.get('image_mirror')}/ca.crt"


def client_auth() -> bool:
    """The mirror asks its clients to log in (``image_mirror_auth``)."""
    return bool(access.get("image_mirror_auth"))


def client_secret_problem() -> str | None:
    """Why ``$mirror_client_password_env`` on the control machine cannot be the mirror's client
    password, with the fix (None: it can, or the mirror is open). The value is never named."""
    env = access.get("mirror_client_password_env")
    why = client_auth() and mirror.client_secret_problem(os.environ.get(env))
    if not why:
        return None
    return (
        f"the image mirror asks its clients to log in as mirror_client_user {access.get('mirror_client_user')!r} "
        f"(image_mirror_auth), but ${env} on the control machine {why}: export the mirror's client password "
        f"there (one line, at most {mirror.SECRET_MAX} bytes; or set image_mirror_auth = False in "
        "inventories/group_data/all.py for an open mirror)"
    )


def _local_file(name: str) -> str | None:
    path = access.get(name)
    if path and not Path(path).is_file():
        raise access.ConfigError(
            f"{host.name}: {name} {path} is not a file on this machine (inventories/group_data/all.py)"
        )
    return path


@install.tritonfleet_step("Image mirror (pull-through registry)")
def image_mirror():
    """The image mirror: a pull-through registry for the Triton image on the
    ``image_mirror`` group's hosts.

    Changes: Debian's ``docker-registry`` and curl, the registry's configuration (a proxy of the
    upstream), its TLS certificate, key and CA, a restart-on-failure drop-in; the registry restarted
    when its configuration changed, running and enabled.

    Tunables: ``image_mirror``, ``image_mirror_upstream``, ``image_mirror_port``, ``image_mirror_tls_cert``,
    ``image_mirror_tls_key``, ``image_mirror_storage``, ``registry_user``, ``registry_password_env``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.mirror import image_mirror

        image_mirror()
    """
    if not runs_mirror():
        return []
    if not access.get("image_mirror"):
        raise access.ConfigError(
            f"{host.name} is in the {access.get('image_mirror_group')} group but image_mirror "
            "is not set: set it to the address the hosts pull through (host:port, "
            "inventories/group_data/all.py)"
        )
    cert, key, ca = (
        _local_file("image_mirror_tls_cert"),
        _local_file("image_mirror_tls_key"),
        _local_file("image_mirror_ca"),
    )
    user = access.get("registry_user")
    # only whether it is there: its value is read when the command that writes it runs
    if user and not os.environ.get(access.get("registry_password_env") or ""):
        raise access.ConfigError(
            f"{host.name}: the mirror logs in to {access.get('image_mirror_upstream')} as "
            f"registry_user {user!r}, but ${access.get('registry_password_env')} is empty on "
            "the control machine: export the registry secret there"
        )
    problem = client_secret_problem()
    if problem:
        raise access.ConfigError(f"{host.name}: {problem}")
    if client_auth():
        pkgs = converged.packages(
            name="Debian's registry (docker-registry), curl and htpasswd (apache2-utils)",
            packages=["docker-registry", "curl", "apache2-utils"],
        )
    else:
        pkgs = converged.packages(
            name="Debian's registry (docker-registry) and curl", packages=["docker-registry", "curl"]
        )
    try:
        addr = mirror.listen_address(
            access.get("image_mirror"), access.get("image_mirror_listen"), int(access.get("image_mirror_port"))
        )
    except ValueError as e:
        raise access.ConfigError(f"{host.name}: {e} (inventories/group_data/all.py)") from e
    text = mirror.registry_config(
        addr,
        access.get("image_mirror_storage"),
        access.get("image_mirror_upstream"),
        user,
        CERT if cert and key else None,
        KEY if cert and key else None,
        HTPASSWD if client_auth() else None,
    )
    changed = [
        converged.put(
            name=f"registry configuration {CONFIG} (proxy of {access.get('image_mirror_upstream')})",
            src=StringIO(text),
            dest=CONFIG,
            user="root",
            group="docker-registry",
            mode="640",
        )
    ]
    if cert and key:
        changed.append(converged.put(name=f"mirror TLS certificate {CERT}", src=cert, dest=CERT, mode="644"))
        changed.append(
            converged.put(
                name=f"mirror TLS key {KEY}", src=key, dest=KEY, user="root", group="docker-registry", mode="640"
            )
        )
    if ca:
        changed.append(converged.put(name=f"mirror CA {CA}", src=ca, dest=CA, mode="644"))
    drop_in = converged.put(
        name=f"restart the registry when it fails, its upstream password from {SECRET} ({DROP_IN})",
        src=StringIO(DROP_IN_TEXT),
        dest=DROP_IN,
        mode="644",
    )
    if will_change(drop_in):
        systemd.daemon_reload(name="systemd daemon-reload (registry drop-in)")
    if user:
        secret_env_file(
            name=f"upstream password {SECRET} (from ${access.get('registry_password_env')}, on stdin)",
            path=SECRET,
            service="docker-registry",
            secret_env=access.get("registry_password_env"),
        )
    else:
        files.file(name=f"no upstream password ({SECRET})", path=SECRET, present=False)
    if client_auth():
        mirror_htpasswd(
            name=f"mirror client {access.get('mirror_client_user')} in {HTPASSWD} (bcrypt of "
            f"${access.get('mirror_client_password_env')}, on stdin)",
            path=HTPASSWD,
            user=access.get("mirror_client_user"),
            service="docker-registry",
            secret_env=access.get("mirror_client_password_env"),
        )
    else:
        files.file(name=f"no mirror client logins ({HTPASSWD}; image_mirror_auth is off)", path=HTPASSWD, present=False)
    if will_change(pkgs, drop_in, *changed):
        systemd.service(
            name="restart docker-registry (configuration changed)", service="docker-registry", restarted=True
        )
    converged.service(name="docker-registry running and enabled", service="docker-registry", running=True, enabled=True)
    return changed


@install.tritonfleet_step("Trust the image mirror")
def mirror_trust():
    """The hosts' trust in the image mirror: its CA for Docker's registry certificates.

    Changes: /etc/docker/certs.d/<mirror>/ca.crt (nothing without ``image_mirror_ca``).

    Tunables: ``image_mirror``, ``image_mirror_ca``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.mirror import mirror_trust

        mirror_trust()
    """
    ca, dest = _local_file("image_mirror_ca"), client_ca_path()
    if not dest or not ca or (runs_mirror() and not host.data.get("gpu_class")):
        return []
    return [
        converged.put(
            name=f"Docker trusts the image mirror ({dest})", src=ca, dest=dest, mode="644", create_remote_dir=True
        )
    ]


@install.tritonfleet_step("Fill the image mirror")
def mirror_filled():
    """The image mirror filled: every blob of the Triton image fetched once from the
    upstream into the mirror's store.

    Changes: the mirror's storage (on the mirror hosts only).

    Tunables: ``image_mirror``, ``image_mirror_upstream``, ``image_mirror_storage``, ``image_mirror_ca``.

    **Example:**

    .. code:: python

        from tritonfleet.steps.mirror import mirror_filled

        mirror_filled()
    """
    if not runs_mirror() or not access.get("image_mirror"):
        return []
    out = []
    for image in dict.fromkeys(access.get(k) for k in mirrored.MIRRORED):
        registry, path, _, digest = mirrored.parse_reference(image)
        if registry != access.get("image_mirror") or not digest:
            continue  # not through this mirror (pre-flight refuses an unpinned one)
        out.append(
            fill(
                name=f"image mirror holds {path}@{digest[:19]} (fetched once from "
                f"{access.get('image_mirror_upstream')})",
                url=mirror_url(),
                path=path,
                digest=digest,
                storage=access.get("image_mirror_storage"),
                ca=CA if access.get("image_mirror_ca") else None,
                upstream=access.get("image_mirror_upstream"),
                user=access.get("mirror_client_user") if client_auth() else None,
                secret_env=access.get("mirror_client_password_env"),
            )
        )
    return out
