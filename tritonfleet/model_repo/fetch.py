"""The host-side fetch of a release's objects from the model origin: pure shell text and a parser
of what it prints (the operation: tritonfleet.model_repo.ops).

Where the push sends files in one tar stream, a host with a model origin fetches the objects its
release cache lacks itself (tritonfleet.model_repo.release decides which: the same plan, the same
incoming directory, the same completeness check and atomic switch afterwards)::

    releases/.tritonfleet-objects/<sha256>   an object being fetched, or fetched and verified
                                              (mode 0700; kept across runs, so a cut transfer
                                              resumes where it stopped)

The script reads its list on stdin (the URLs may be presigned: they are in no command line and
no log), fetches with curl (``--parallel``, ``--continue-at -`` on what a cut transfer left,
``--retry``), then checks every object's size and SHA-256: an object of the wrong content is
deleted and named (``corrupt``), one that is still short is named (``short``; it resumes on the
next run), and nothing of the release is placed unless every object verified. Verified objects
are hard linked into the incoming directory at each path that holds them. Nothing here touches
the live release.

stdin lines: ``o <sha256> <size> <url>`` per object, ``p <sha256> <path>`` per release path.
Output lines: ``resume <sha> <bytes>``, ``fetched <curl exit> <http code> <bytes> <file>``,
``curl <exit>``, ``curlerr <curl's own words>``, ``verified <sha> <size>``, ``short <sha> <have>``,
``corrupt <sha> <got sha256>``, ``error <words>``, ``placed <files>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.shell import q
from .release import OWN_PREFIX, incoming_dir

OBJECTS_DIR = f"{OWN_PREFIX}objects"
CREDENTIALS_FIX = (
    "write AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) there, or set "
    "model_origin_auth = 'presigned'"
)


def fetch_list(objects: dict[str, tuple[int, str]], paths: dict[str, str]) -> str:
    """The script's stdin: ``objects`` {sha: (size, url)}, ``paths`` {release path: sha}."""
    lines = [f"o {sha} {int(size)} {url}" for sha, (size, url) in sorted(objects.items())]
    lines += [f"p {sha} {path}" for path, sha in sorted(paths.items())]
    return "".join(f"{line}\n" for line in lines)


def _credentials(file: str, region: str) -> str:
    """Shell that adds the host's own S3 credentials to curl's config (never its command line):
    curl signs each request itself (``--aws-sigv4``)."""
    return "\n".join(
        [
            f"[ -r {q(file)} ] || {{ printf 'error the origin credentials file %s is missing on %s: %s\\n' "
            f'{q(file)} "$(hostname)" {q(CREDENTIALS_FIX)}; exit 2; }}',
            f". {q(file)}",
            f'printf \'aws-sigv4 = "aws:amz:%s:s3"\\n\' {q(region)} >> "$cfg"',
            'printf \'user = "%s:%s"\\n\' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >> "$cfg"',
            '[ -z "${AWS_SESSION_TOKEN:-}" ] || printf \'header = "x-amz-security-token: %s"\\n\' '
            '"$AWS_SESSION_TOKEN" >> "$cfg"',
        ]
    )


def fetch_script(
    base: str,
    release: str,
    run: str,
    parallel: int = 8,
    retries: int = 3,
    connect_timeout: int = 10,
    stall_seconds: int = 60,
    credentials: tuple[str, str] | None = None,
) -> str:
    """Shell (sh) that fetches, verifies and places the objects its stdin lists into the
    incoming directory ``run`` prepared for ``release`` below ``base``. ``credentials``: (file on
    the host, region) for an S3 origin the host signs for itself."""
    rel = f"{base}/releases"
    inc = f"{rel}/{incoming_dir(release, run)}"
    curl = " ".join(
        [
            "curl",
            "--parallel",
            f"--parallel-max {int(parallel)}",
            "--fail",
            "--silent",
            "--show-error",
            "--no-progress-meter",
            "--location",
            "--continue-at -",
            f"--retry {int(retries)}",
            "--retry-connrefused",
            f"--connect-timeout {int(connect_timeout)}",
            f"--speed-limit 1 --speed-time {int(stall_seconds)}",
            "-w 'fetched %{exitcode} %{http_code} %{size_download} %{filename_effective}\\n'",
            '-K "$cfg" 2> "$err"',
        ]
    )
    return (
        "\n".join(
            [
                "set -u",
                "umask 077",
                f"inc={q(inc)}",
                f"obj={q(rel + '/' + OBJECTS_DIR)}",
                'command -v curl >/dev/null 2>&1 || { echo "error curl is not installed on $(hostname): install it '
                '(apt-get install curl), or push releases over SSH (model_origin = None)"; exit 2; }',
                '[ -d "$inc" ] || { echo "error $inc is missing on $(hostname): the release was not prepared"; exit 2; }',
                'mkdir -p "$obj" && chmod 700 "$obj" || { echo "error cannot make $obj"; exit 2; }',
                # what a fetch killed by SIGKILL left (its list and curl config hold URLs and credentials):
                # removed when the process that wrote it is gone
                'for f in "$obj"/list.* "$obj"/curl.* "$obj"/err.*; do [ -e "$f" ] || continue; '
                'p=${f##*.}; kill -0 "$p" 2>/dev/null || rm -f "$f"; done',
                # no globbing from here on: a presigned URL's '?', '*' or '[' stays literal where
                # `set -- $line` splits a line
                "set -f",
                'list="$obj/list.$$"; cfg="$obj/curl.$$"; err="$obj/err.$$"',
                # removed on exit and on the signals that end a run (a lost SSH link: HUP; Ctrl-C; kill)
                'trap \'rm -f "$list" "$cfg" "$err"\' EXIT',
                "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 141' PIPE",
                'cat > "$list"',
                ': > "$cfg"',
                *([_credentials(*credentials)] if credentials else []),
                "want=0",
                # what is there already: a complete object is verified below, a part resumes
                "while IFS= read -r line; do",
                '  case "$line" in o\\ *) ;; *) continue;; esac',
                '  set -- $line; f="$obj/$2"',
                '  if [ "$3" = 0 ]; then : > "$f"; continue; fi',
                '  have=$(stat -c %s "$f" 2>/dev/null || echo -1)',
                '  if [ "$have" -gt "$3" ]; then rm -f "$f"; have=-1; fi',
                '  if [ "$have" != "$3" ]; then',
                '    [ "$have" -gt 0 ] && echo "resume $2 $have"',
                '    printf \'url = "%s"\\noutput = "%s"\\n\' "$4" "$f" >> "$cfg"; want=$((want + 1))',
                "  fi",
                'done < "$list"',
                'if [ "$want" -gt 0 ]; then',
                f"  {curl}",
                '  echo "curl $?"',
                "  sed 's/^/curlerr /' \"$err\" | head -n 20",
                "fi",
                # every object: its size, then its content
                "bad=0",
                "while IFS= read -r line; do",
                '  case "$line" in o\\ *) ;; *) continue;; esac',
                '  set -- $line; f="$obj/$2"',
                '  have=$(stat -c %s "$f" 2>/dev/null || echo -1)',
                '  if [ "$have" != "$3" ]; then echo "short $2 $have"; bad=1; continue; fi',
                '  got=$(sha256sum < "$f"); got=${got%% *}',
                '  if [ "$got" != "$2" ]; then echo "corrupt $2 $got"; rm -f "$f"; bad=1; continue; fi',
                '  echo "verified $2 $3"',
                'done < "$list"',
                '[ "$bad" = 0 ] || exit 1',
                # placed only once everything verified: hard links at every path of the release
                "n=0",
                "while IFS= read -r line; do",
                '  case "$line" in p\\ *) ;; *) continue;; esac',
                "  rest=${line#p }; sha=${rest%% *}; path=${rest#* }",
                '  ln -f -- "$obj/$sha" "$inc/$path" || { echo "error cannot place $path in $inc"; exit 1; }',
                "  n=$((n + 1))",
                'done < "$list"',
                'while IFS= read -r line; do case "$line" in o\\ *) set -- $line; rm -f "$obj/$2";; esac; '
                'done < "$list"',
                'echo "placed $n"',
            ]
        )
        + "\n"
    )


@dataclass
class FetchResult:
    ok: bool
    verified: dict[str, int] = field(default_factory=dict)  # sha -> size
    corrupt: dict[str, str] = field(default_factory=dict)  # sha -> sha256 of what arrived
    short: dict[str, int] = field(default_factory=dict)  # sha -> bytes there
    resumed: dict[str, int] = field(default_factory=dict)  # sha -> bytes there before this run
    fetched_bytes: int = 0  # what curl received in this run
    transfers: list[tuple[int, int, int, str]] = field(default_factory=list)  # (exit, http code, bytes, file)
    curl_said: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    placed: int = 0

    def failed_transfer(self, sha: str) -> tuple[int, int] | None:
        """(curl exit, HTTP code) of the transfer of ``sha`` when it failed."""
        for code, http, _, f in self.transfers:
            if f.rsplit("/", 1)[-1] == sha and code != 0:
                return code, http
        return None


def parse_fetch(lines) -> FetchResult:
    res = FetchResult(ok=False)
    for line in lines:
        line = line.rstrip("\n")
        kind, _, rest = line.partition(" ")
        parts = rest.split(" ")
        if kind == "verified" and len(parts) == 2 and parts[1].isdigit():
            res.verified[parts[0]] = int(parts[1])
        elif kind == "corrupt" and len(parts) == 2:
            res.corrupt[parts[0]] = parts[1]
        elif kind == "short" and len(parts) == 2:
            res.short[parts[0]] = int(parts[1]) if parts[1].lstrip("-").isdigit() else -1
        elif kind == "resume" and len(parts) == 2 and parts[1].isdigit():
            res.resumed[parts[0]] = int(parts[1])
        elif kind == "fetched" and len(parts) >= 4:
            try:
                t = (int(parts[0]), int(parts[1]), int(parts[2]), " ".join(parts[3:]))
            except ValueError:
                continue
            res.transfers.append(t)
            res.fetched_bytes += t[2]
        elif kind == "curlerr":
            res.curl_said.append(rest)
        elif kind == "error":
            res.errors.append(rest)
        elif kind == "placed" and rest.isdigit():
            res.placed = int(rest)
            res.ok = not (res.corrupt or res.short or res.errors)
    return res


def problems(res: FetchResult, paths: dict[str, str], origin_url: str, key_of) -> list[str]:
    """One line per object that did not arrive whole, naming the release paths it holds and the
    origin's object (``key_of(sha)``)."""
    by_sha: dict[str, list[str]] = {}
    for path, sha in sorted(paths.items()):
        by_sha.setdefault(sha, []).append(path)

    def where(sha: str) -> str:
        names = by_sha.get(sha, [])
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        return f"{', '.join(names[:3])}{more} (object {key_of(sha)} at {origin_url})"

    out = [
        f"corrupt: {where(sha)}: its content hashes to {got}, not {sha}; refused and deleted on the host"
        for sha, got in sorted(res.corrupt.items())
    ]
    for sha, have in sorted(res.short.items()):
        failed = res.failed_transfer(sha)
        how = (
            f"curl exit {failed[0]}, HTTP {failed[1] or '-'}"
            if failed
            else "the origin sent fewer bytes than the manifest says (a truncated object)"
        )
        out.append(f"incomplete: {where(sha)}: {max(have, 0)} bytes here ({how}); a part resumes on the next run")
    out += [f"error: {e}" for e in res.errors]
    return out
