"""The Triton image through a pull-through cache: pure functions (the steps: tritonfleet.steps.mirror;
the image references rewritten to the mirror: tritonfleet.settings.mirrored).

**Why a rewrite, not Docker's ``registry-mirrors``.** dockerd's ``registry-mirrors`` setting
applies to Docker Hub only (Docker's "Mirror the Docker Hub library": "It's currently not possible
to mirror another private registry. Only the central Hub can be mirrored."), and a Distribution
registry in proxy mode mirrors one upstream at a time (Distribution's "Registry as a pull through
cache" recipe; ``proxy.remoteurl``). So an ``nvcr.io`` image is pulled through
the mirror by naming the mirror in the reference: ``nvcr.io/nvidia/tritonserver:24.08-py3@sha256:D``
becomes ``<mirror>/nvidia/tritonserver:24.08-py3@sha256:D`` (the repository path is kept, the tag
too: tritonfleet reads the Triton release from it; Docker resolves a reference with both by the
digest alone). The digest is required: every host then runs the same bytes whatever the tag does
upstream, and the mirror can serve it from its cache without asking the upstream about the tag.

**The mirror** is Debian's packaged CNCF Distribution registry (``docker-registry``, 2.8.2 in
Debian 12) with ``proxy: {remoteurl, username, password}`` (Distribution's configuration
reference, "proxy"; its "Registry as a pull through cache" recipe).

**Who may pull through it.** Whoever reaches the mirror pulls through its upstream login, so the
mirror listens on one named address (:func:`listen_address`) and, with ``image_mirror_auth``,
asks every client for a mirror-only credential: Distribution's ``auth: htpasswd`` (bcrypt only,
read once when the registry starts). The file is written on the mirror host by
:func:`htpasswd_script` from the secret on stdin with ``htpasswd -B -i`` (apache2-utils: the
registry binary has no tool that writes one, and Python's bcrypt is not on a bare host); the GPU
hosts ``docker login`` to the mirror, and the mirror's own fill sends the same credential
(:func:`client_auth`).

**Filling it once.** Distribution 2.8's proxy blob store fetches a blob it does not have twice from
the upstream, once for the client and once for its own store (``registry/proxy/proxyblobstore.go``
at v2.8.2: ``ServeBlob`` starts ``storeLocal`` and ``copyContent`` side by side; 3.0 serves and
stores from one fetch, commit 17952924 "avoid redundant blob fetching"), and every request for
a blob still in flight fetches it again: N hosts pulling a new image at once cost the upstream up
to N + 1 times its size. So a staging run fills the mirror first, on the mirror host: for each
blob of the pinned image it makes one request through the mirror and cuts it as soon as the
headers arrive (``curl --max-filesize 1``: the blob's Content-Length is over the limit, so curl
closes the connection before reading the body). The request starts the mirror's own fetch into its
store, which goes on without it: 2.8's store reads the upstream through
``transport.NewHTTPReadSeeker(client, url, errorHandler)``, which takes no request context, and
writes to the filesystem driver, which does not look at one (measured: every blob stored with its
digest). The mirror's fetch for the cut request stops at its next write to the closed connection,
so the upstream sends for it only what got through before that (``bench/run.py mirror-fill``:
about 2 MB a blob on loopback, where a request held open at a trickle, as the fill did before, let
the sockets between mirror and upstream fill: 6.6 MB a blob). The fill then waits until the blob is
committed (the repository's ``_layers/sha256/<hex>/link``, which Distribution writes then), asking
again when the upload into the store (``_uploads``) stops growing for ``stall`` seconds: a fetch
that failed or an upstream that hangs. Filling costs the upstream about 1.0x the image, and the
hosts then pull from the mirror's store in parallel without reaching the upstream at all.
"""

from __future__ import annotations

import json
import re

from ..core.shell import q

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# the manifest kinds a pull of a pinned image meets (Docker's and OCI's media types)
ACCEPT = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    ]
)


# --------------------------------------------------------------------------- the mirror host

# the variable Distribution reads the upstream's password from (its configuration's environment
# override of proxy.password: REGISTRY_<section>_<key>), set by the unit's EnvironmentFile
PASSWORD_VAR = "REGISTRY_PROXY_PASSWORD"


def listen_address(mirror: str, listen: str | None, port: int) -> str:
    """``address:port`` the mirror listens on: ``listen``, else the address the hosts pull
    through (``mirror``'s host part), never every address (whoever reaches the mirror pulls through
    its upstream login). ValueError for an address that is every one."""
    host = listen or mirror
    if not listen and not host.endswith("]") and host.count(":") == 1:
        host = host.rsplit(":", 1)[0]  # host:port
    elif not listen and host.startswith("[") and "]:" in host:
        host = host.rsplit(":", 1)[0]  # [v6]:port
    if host.strip("[]") in ("", "0.0.0.0", "::", "*"):
        raise ValueError(
            f"the mirror would listen on every address ({host!r}): set image_mirror_listen to "
            "the address the hosts reach it at"
        )
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{int(port)}"


def registry_config(
    addr: str,
    storage: str,
    upstream: str,
    user: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    htpasswd: str | None = None,
) -> str:
    """/etc/docker/registry/config.yml of a pull-through mirror (JSON, which YAML reads): the
    upstream with its login name (never its password: that is ``$REGISTRY_PROXY_PASSWORD`` in the
    unit's environment, see :func:`secret_file_script`), the cache's storage, TLS when given, JSON
    logs with each response's size (``http.response.written``); with ``htpasswd`` (its path on
    the mirror host) every client must log in (:func:`htpasswd_script`). ``addr``:
    ``address:port`` (:func:`listen_address`)."""
    proxy = {"remoteurl": upstream}
    if user:
        proxy.update(username=user)
    http: dict = {"addr": addr, "headers": {"X-Content-Type-Options": ["nosniff"]}}
    if cert and key:
        http["tls"] = {"certificate": cert, "key": key}
    auth = {"auth": {"htpasswd": {"realm": REALM, "path": htpasswd}}} if htpasswd else {}
    return (
        json.dumps(
            {
                **auth,
                "version": 0.1,
                "log": {"level": "info", "formatter": "json", "fields": {"service": "registry-mirror"}},
                "storage": {
                    "filesystem": {"rootdirectory": storage},
                    "delete": {"enabled": True},
                    "cache": {"blobdescriptor": "inmemory"},
                },
                "http": http,
                "proxy": proxy,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


def secret_file_script(path: str, service: str) -> str:
    """Shell that writes the upstream password it reads on stdin (one line) to ``path`` as the
    unit's environment file (``REGISTRY_PROXY_PASSWORD='<secret>'``, 0600 root: systemd reads it
    before the registry drops to its user) and restarts ``service`` if it runs and the password
    changed. The secret is in no command line, no pyinfra plan or diff; printed: ``secret same``,
    ``secret changed`` or ``error <words>``. A value systemd's single quotes cannot hold (a quote,
    a backslash, a line break) is refused."""
    return (
        "\n".join(
            [
                "set -u",
                "umask 077",
                f'f={q(path)}; t="$f.tmp.$$"',
                "IFS= read -r s || [ -n \"$s\" ] || { echo 'error no registry secret arrived on stdin'; exit 2; }",
                "more=; IFS= read -r more || :",
                "[ -z \"$more\" ] || { echo 'error the registry secret holds a line break'; exit 2; }",
                "case \"$s\" in *\\'*|*\\\\*|'') echo 'error the registry secret is empty or holds a quote or a backslash, "
                "which the mirror'\"'\"'s environment file cannot hold'; exit 2;; esac",
                "trap 'rm -f \"$t\"' EXIT",
                f'mkdir -p "$(dirname "$f")" && printf "{PASSWORD_VAR}=\'%s\'\\n" "$s" > "$t" && chown root:root "$t" '
                '&& chmod 600 "$t" || { echo "error cannot write $f"; exit 1; }',
                'if cmp -s "$t" "$f"; then echo \'secret same\'; exit 0; fi',
                'mv -f "$t" "$f" || { echo "error cannot write $f"; exit 1; }',
                f"systemctl try-restart {q(service)} || {{ echo 'error {service} did not restart with the new secret'; exit 1; }}",
                "echo 'secret changed'",
            ]
        )
        + "\n"
    )


# the realm the mirror names when it asks a client to log in (WWW-Authenticate: Basic realm=...)
REALM = "tritonfleet image mirror"
# bcrypt's cost for the client credential (2^10 rounds: tens of ms a request on the mirror, which
# checks it on every request; Distribution 2.8 reads bcrypt only)
HTPASSWD_COST = 10
# bcrypt reads the first 72 bytes of a password and ignores the rest
SECRET_MAX = 72


def client_secret_problem(secret: str | None) -> str | None:
    """Why ``secret`` cannot be the mirror's client password (None: it can): empty, a line break
    or another control character (``docker login --password-stdin`` and ``htpasswd -i`` read one
    line), or longer than bcrypt reads. Never names the value."""
    if not secret:
        return "is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in secret):
        return "holds a line break or another control character"
    if len(secret.encode()) > SECRET_MAX:
        return f"is longer than {SECRET_MAX} bytes (bcrypt ignores the rest)"
    return None


def htpasswd_script(path: str, user: str, service: str, group: str = "docker-registry") -> str:
    """Shell that writes the mirror's htpasswd file (``user`` and the bcrypt hash of the password
    it reads on stdin, one line) to ``path``, 0640 root:``group`` (the registry runs as that
    group's user), and restarts ``service`` if it runs and the file changed (Distribution 2.8 reads
    it only at its start). The hash is salted, so "changed" is asked of the file itself
    (``htpasswd -v``: the password verifies for ``user``, who is its only line). The secret is in
    no command line, plan or diff; printed: ``secret same``, ``secret changed`` or ``error
    <words>`` (exit 2: a secret :func:`client_secret_problem` refuses)."""
    cost = int(HTPASSWD_COST)
    return (
        "\n".join(
            [
                "set -u",
                "umask 027",
                f'f={q(path)}; u={q(user)}; t="$f.tmp.$$"',
                "IFS= read -r s || [ -n \"$s\" ] || { echo 'error no mirror client secret arrived on stdin'; exit 2; }",
                "more=; IFS= read -r more || :",
                "[ -z \"$more\" ] || { echo 'error the mirror client secret holds a line break'; exit 2; }",
                "case \"$s\" in ''|*[[:cntrl:]]*) echo 'error the mirror client secret is empty or holds a control "
                "character'; exit 2;; esac",
                f'[ "$(printf \'%s\' "$s" | wc -c)" -le {SECRET_MAX} ] || {{ echo \'error the mirror client secret is '
                f"longer than {SECRET_MAX} bytes (bcrypt ignores the rest)'; exit 2; }}",
                "command -v htpasswd >/dev/null || { echo 'error htpasswd is not installed (apt-get install apache2-utils)'; "
                "exit 1; }",
                "trap 'rm -f \"$t\"' EXIT",
                f'if [ -f "$f" ] && [ "$(stat -c %U:%G:%a "$f")" = root:{group}:640 ] '
                '&& [ "$(cut -d: -f1 "$f")" = "$u" ] '
                '&& printf \'%s\\n\' "$s" | htpasswd -v -i "$f" "$u" >/dev/null 2>&1; then echo \'secret same\'; exit 0; fi',
                f'mkdir -p "$(dirname "$f")" && printf \'%s\\n\' "$s" | htpasswd -B -C {cost} -i -c "$t" "$u" '
                f'>/dev/null 2>&1 && chown root:{group} "$t" && chmod 640 "$t" || {{ echo "error cannot write $f"; exit 1; }}',
                'mv -f "$t" "$f" || { echo "error cannot write $f"; exit 1; }',
                f"systemctl try-restart {q(service)} || {{ echo 'error {service} did not restart with the new client secret'; "
                "exit 1; }",
                "echo 'secret changed'",
            ]
        )
        + "\n"
    )


def client_auth(user: str | None) -> tuple[str, str]:
    """(shell that reads the mirror's client password on stdin into a 0600 header file ``$h``,
    removed when the shell ends; curl's option that sends it) for ``user``, or ("", "") without
    one. The secret and its Basic encoding pass only through the shell's builtins and pipes, never
    a command line (curl reads the header from the file: ``-H @file``)."""
    if not user:
        return "", ""
    return "\n".join(
        [
            "IFS= read -r s || [ -n \"$s\" ] || { echo 'no mirror client secret arrived on stdin' >&2; exit 2; }",
            "h=$(mktemp) || exit 1",
            "trap 'rm -f \"$h\"' EXIT",
            f'printf \'Authorization: Basic %s\\n\' "$(printf \'%s:%s\' {q(user)} "$s" | base64 -w0)" > "$h" || exit 1',
            "s=",
        ]
    ) + "\n", '-H "@$h" '


def manifest_command(url: str, path: str, reference: str, ca: str | None = None, user: str | None = None) -> str:
    """curl of a manifest through the mirror at ``url`` (its body on stdout); with ``user``, as
    that client of the mirror, its password on stdin (:func:`client_auth`). The mirror may have
    been restarted just before (its configuration changed): a refused connection is tried again
    for up to 30 s while the registry opens its port (measured on the test hosts under load: the
    first request came 0 ms after the restart and was refused)."""
    tls = f" --cacert {q(ca)}" if ca else ""
    prelude, auth = client_auth(user)
    return (
        f"{prelude}curl -fsS --max-time 120 --retry 30 --retry-delay 1 --retry-connrefused{tls} {auth}"
        f"-H {q('Accept: ' + ACCEPT)} "
        f"{q(f'{url}/v2/{path}/manifests/{reference}')}"
    )


def parse_manifest(text: str, os_name: str = "linux", arch: str = "amd64") -> tuple[str, list[str]]:
    """("index", [the platform's manifest digest]) for a manifest list / OCI index, or ("image",
    [config digest, layer digests...]) for an image manifest. ValueError for anything else."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not a manifest (JSON): {text[:120]!r}") from e
    if isinstance(doc.get("manifests"), list):
        for m in doc["manifests"]:
            p = m.get("platform") or {}
            if p.get("os") == os_name and p.get("architecture") == arch and DIGEST.match(str(m.get("digest"))):
                return "index", [m["digest"]]
        raise ValueError(f"the image index has no {os_name}/{arch} manifest")
    if isinstance(doc.get("layers"), list) and isinstance(doc.get("config"), dict):
        blobs = [doc["config"].get("digest")] + [layer.get("digest") for layer in doc["layers"]]
        if not all(DIGEST.match(str(b)) for b in blobs):
            raise ValueError("a blob digest of the manifest is not sha256:<64 hex digits>")
        return "image", blobs
    raise ValueError("neither an image manifest nor an index (schema 1 manifests are not mirrored)")


def layer_link(storage: str, path: str, digest: str) -> str:
    """Where Distribution's filesystem storage records that a repository holds a blob (written
    when the blob is committed: registry/storage/paths.go, layerLinkPathSpec)."""
    return f"{storage}/docker/registry/v2/repositories/{path}/_layers/sha256/{digest.split(':', 1)[1]}/link"


def fill_script(
    url: str,
    path: str,
    blobs: list[str],
    storage: str,
    ca: str | None = None,
    timeout: int = 3600,
    attempts: int = 3,
    stall: int = 60,
    user: str | None = None,
) -> str:
    """Shell on the mirror host: every blob of ``blobs`` the mirror's store lacks is brought in by
    one request cut at its headers (see the module doc), then waited for until it is committed to
    the store; asked again (up to ``attempts`` requests) when its upload into the store has not
    grown for ``stall`` seconds or the wait passed ``timeout`` seconds. Prints ``cached <digest>``,
    ``filled <digest> <seconds>`` or ``failed <digest> after <n> requests: <why>`` (no byte reached
    the store for ``stall`` s: the upstream does not answer the mirror, or refuses its login; or the
    blob was not stored within ``timeout``); exits 1 when a blob did not arrive. With ``user``, the
    requests log in to the mirror as that client, its password on stdin (:func:`client_auth`)."""
    tls = f"--cacert {q(ca)} " if ca else ""
    prelude, auth = client_auth(user)
    uploads = f"{storage}/docker/registry/v2/repositories/{path}/_uploads"
    ticks, still_ticks = int(timeout) * 5, int(stall) * 5  # the wait's checks, one every 0.2 s
    out = [
        "set -u",
        *prelude.splitlines(),
        "rc=0",
        "fill() {",
        "  try=0; why=",
        f"  while [ $try -lt {int(attempts)} ]; do",
        '    [ -f "$1" ] && return 0',
        f'    curl -s {tls}{auth}--max-filesize 1 --max-time {int(stall)} -o /dev/null "$2"',
        "    n=0; still=0; last=",
        f'    while [ ! -f "$1" ] && [ $n -lt {ticks} ] && [ $still -lt {still_ticks} ]; do',
        f"      now=$(du -sb {q(uploads)} 2>/dev/null | cut -f1)",
        '      if [ "$now" = "$last" ]; then still=$((still + 1)); else still=0; last=$now; fi',
        "      sleep 0.2; n=$((n + 1))",
        "    done",
        f"    if [ $still -ge {still_ticks} ]; then why={q(f'no byte reached its upload into the store for {int(stall)} s')}; "
        f"else why={q(f'it was not in the store after {int(timeout)} s')}; fi",
        "    try=$((try + 1))",
        "  done",
        '  [ -f "$1" ]',
        "}",
    ]
    for digest in blobs:
        link = layer_link(storage, path, digest)
        out.append(
            f"if [ -f {q(link)} ]; then echo {q('cached ' + digest)}; else t0=$(date +%s); "
            f"if fill {q(link)} {q(f'{url}/v2/{path}/blobs/{digest}')}; then "
            f'echo "filled {digest} $(( $(date +%s) - t0 ))"; else '
            f'echo "failed {digest} after {int(attempts)} requests: $why"; rc=1; fi; fi'
        )
    out.append("exit $rc")
    return "\n".join(out) + "\n"


def parse_fill(lines) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"cached": [], "filled": [], "failed": []}
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        if kind in out and rest:
            out[kind].append(rest.split(" ", 1)[0] if kind != "failed" else rest)
    return out
