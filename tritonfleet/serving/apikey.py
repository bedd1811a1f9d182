"""The host's key for Triton's restricted APIs (``triton_restricted_apis``).

Triton refuses a request to a restricted API category (HTTP 403 "This API is restricted,
expecting header ...", gRPC UNAVAILABLE) unless it carries the header ``HEADER`` with the key
(``--http-restricted-api=<apis>:<header>=<key>``; on gRPC the header is
``triton-grpc-protocol-<header>``). The key is made on the host (``key_command``), never leaves
it but into Triton, and never appears in a command line of the control machine or a log:

* Triton gets it on the container's stdin, which systemd opens from the key file
  (``StandardInput=file:``); a shell in the container reads it and starts tritonserver with the
  restriction flags (``unit_script``). Triton takes the restriction from its command line only,
  so the key is in tritonserver's own argv inside the container (see docs/security.md);
* the deploy's own calls on the host pipe the header into ``curl -H @-`` (``curl``), with the
  key read by the shell's ``printf`` builtin: no process gets it in its argv;
* ``tritonfleet tune`` reads it over SSH into memory (``read_command``) for its requests.

Shared by the deploy steps and the read side (status, rollout, tune).
"""

from __future__ import annotations

from ..core.shell import q

HEADER = "tritonfleet-api-key"

#: Triton's restricted API categories (docs/customization_guide/inference_protocols.md,
#: "Limit Endpoint Access").
CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)


def curl(key_file: str, args: str) -> str:
    """``curl <args>`` (already shell words) sending the key header read from ``key_file`` on
    the host (an empty header when the file is missing: APIs left open do not look at it)."""
    return f"{{ printf '%s: %s\\n' {HEADER} \"$(cat {q(key_file)} 2>/dev/null)\"; }} | curl -H @- {args}"


def read_command(key_file: str) -> str:
    """Prints the key (nothing when the file is missing)."""
    return f"cat {q(key_file)} 2>/dev/null || true"


def key_command(key_file: str) -> str:
    """Creates the key file on the host when it is missing (32 random bytes as hex, 0600 root,
    written under another name and renamed: never half-written), and puts its mode and owner
    right when they are not."""
    k = q(key_file)
    return (
        "set -e; umask 077; "
        f'mkdir -p "$(dirname {k})"; '
        f"if [ ! -s {k} ]; then t=$(mktemp {q(key_file + '.XXXXXX')}); "
        f'od -An -N32 -tx1 /dev/urandom | tr -d \' \\n\' > "$t"; echo >> "$t"; mv -f "$t" {k}; fi; '
        f"chown root:root {k}; chmod 0600 {k}"
    )


def flags(apis: list[str], key_ref: str) -> list[str]:
    """tritonserver's restriction flags for ``apis`` with the key ``key_ref`` (a shell reference
    to it, e.g. ``$k``)."""
    group = ",".join(apis)
    return [
        f"--http-restricted-api={group}:{HEADER}={key_ref}",
        f"--grpc-restricted-protocol={group}:{HEADER}={key_ref}",
    ]


def unit_script(apis: list[str]) -> str:
    """The container's command wrapper (a ``sh -c`` script, one systemd word with ``$``
    doubled): reads the key from stdin, then execs tritonserver ("$0" "$@") with the restriction
    flags appended."""
    restrict = " ".join(f'"{f}"' for f in flags(apis, "$k"))
    script = (
        'read -r k || true; [ -n "$k" ] || { echo "tritonfleet: no Triton API key on stdin" >&2; exit 2; }; '
        f'exec "$0" "$@" {restrict}'
    )
    # the script goes into the unit between single quotes, where systemd reads % and backslashes too: a
    # check that stays under `python -O` (an assert would not)
    bad = sorted({c for c in script if c in "'%\\"})
    if bad:
        raise ValueError(
            f"Triton's key wrapper would hold {' '.join(bad)}, which the unit's quoting cannot "
            f"carry: restricted APIs {apis!r} (unit.restricted_apis lets only Triton's names through)"
        )
    return "'" + script.replace("$", "$$") + "'"
