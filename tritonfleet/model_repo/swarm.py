"""The host side of the fan-out: a release's objects taken from the wave's other hosts (BitTorrent,
aria2c) before the origin is asked for what is still missing (pure shell text and a parser; the
torrent: tritonfleet.model_repo.torrent; the operation: tritonfleet.model_repo.ops).

::

    releases/.tritonfleet-swarm/<info hash>/sha256/<sha256>   what the swarm brought (and serves)
    releases/.tritonfleet-swarm/<info hash>/pid, done, log      its aria2c, the end of its download

The script writes the torrent it reads on stdin (base64), starts aria2c on its own session (it
outlives the SSH command: after its download it seeds the rest of the wave for
``model_fanout_seed_minutes``, then ends; ``timeout`` ends it in any case), and waits until the
download is complete, or aria2c gave up (no byte for ``model_fanout_stall_seconds``: its peers
and seeds are gone), or ``model_fanout_wait_seconds`` passed (then it is stopped). Only then, with
nothing writing the files any more, every object the list names is checked against its SHA-256
and hard linked into the fetch's objects directory (tritonfleet.model_repo.fetch), which fetches
from the origin whatever is not there and checks every object again before placing any.

aria2c keeps and serves a piece only once it matches the torrent's SHA-1 (``--bt-seed-unverified``
stays false, ``--check-integrity`` checks what a restarted swarm finds on disk); a corrupt piece from
a peer is dropped and asked for again elsewhere. The swarm never changes the release: an object
that does not hash to its name is left out and fetched from the origin.

stdin: the torrent, base64, then a line ``--``, then ``o <sha256> <size>`` per object wanted.
Output lines: ``swarm-skip <why>``, ``swarm-end <done|stalled|timeout>``, ``swarm <sha> <size>``
(verified, linked), ``swarm-miss <sha>`` (left to the origin).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from ..core.shell import q
from .fetch import OBJECTS_DIR
from .release import OWN_PREFIX
from .torrent import NAME, seeds

SWARM_DIR = f"{OWN_PREFIX}swarm"
# aria2c's options that never change: no DHT or local discovery (the tracker names the peers), no
# preallocation (a file's size says nothing of its content anyway), peer exchange on
FIXED = (
    "--enable-dht=false --enable-dht6=false --bt-enable-lpd=false --enable-peer-exchange=true "
    "--file-allocation=none --check-integrity=true --bt-hash-check-seed=true --bt-seed-unverified=false "
    "--follow-torrent=mem --auto-file-renaming=false --allow-overwrite=true --summary-interval=0 "
    "--console-log-level=warn --bt-tracker-interval=5 --seed-ratio=0.0"
)


def swarm_input(torrent: bytes, objects: dict[str, int]) -> str:
    """The script's stdin: the torrent and ``objects`` {sha256: size} this host wants."""
    lines = base64.encodebytes(torrent).decode() + "--\n"
    return lines + "".join(f"o {sha} {int(size)}\n" for sha, size in sorted(objects.items()))


def swarm_script(
    base: str,
    info_hash: str,
    select: list[int],
    *,
    port: int,
    seed_minutes: float,
    stall_seconds: int,
    wait_seconds: int,
    log_level: str = "notice",
    layout: str = f"{NAME}/",
    web_user: str | None = None,
    ca: str | None = None,
) -> str:
    """Shell (sh) that takes what it can of the objects its stdin lists from the swarm
    ``info_hash`` (``select``: their 1-based indices in the torrent) into the objects directory
    of the fetch below ``base``. ``layout``: where the torrent puts an object, before its sha256
    (tritonfleet.model_repo.torrent.make's name and prefix). ``web_user``: the torrent's web seed
    asks for a login: the password is stdin's first line, kept for aria2c in a 0600 file until
    its download ends (never a command line); ``ca``: the CA file that signed the web seed's
    certificate."""
    rel = f"{base}/releases"
    sw = f"{rel}/{SWARM_DIR}/{info_hash}"
    life = int(wait_seconds + seed_minutes * 60 + 60)
    files = ",".join(str(i) for i in sorted(select))
    login = ' --conf-path="$sw/login.conf"' if web_user else ""
    login += f" --ca-certificate={q(ca)}" if ca else ""
    aria = (
        f'aria2c --dir="$sw" {FIXED} --listen-port={int(port)} --seed-time={float(seed_minutes)}{login} '
        f"--bt-stop-timeout={int(stall_seconds)} --select-file={files} "
        f'--on-bt-download-complete="$sw/hook" --log="$sw/log" --log-level={log_level} "$sw/t.torrent"'
    )
    return (
        "\n".join(
            [
                "set -u",
                "umask 022",
                f"sw={q(sw)}",
                f"obj={q(rel + '/' + OBJECTS_DIR)}",
                "command -v aria2c >/dev/null 2>&1 || { echo 'swarm-skip aria2c is not installed'; cat > /dev/null; exit 0; }",
                'mkdir -p "$sw" "$obj" && chmod 700 "$obj" || { echo "swarm-skip cannot make $sw"; exit 0; }',
                *(
                    [
                        # the web seed's login for aria2c (its conf file: option=value lines), 0600
                        "IFS= read -r s || [ -n \"$s\" ] || { echo 'swarm-skip no web seed login on stdin'; exit 0; }",
                        f'(umask 077; printf \'http-user=%s\\nhttp-passwd=%s\\n\' {q(web_user)} "$s" > "$sw/login.conf")',
                        "s=",
                    ]
                    if web_user
                    else []
                ),
                # a process that is there and not a zombie (this shell reaps its child only now and then)
                'alive() { kill -0 "$1" 2>/dev/null && ! grep -q \'^State:.*Z\' "/proc/$1/status" 2>/dev/null; }',
                # a swarm stopped: its process group (aria2c with it), TERM then KILL after 5 s
                'stop() { kill -s TERM -- "-$1" 2>/dev/null || return 0; n=0; '
                'while kill -0 -- "-$1" 2>/dev/null && [ $n -lt 10 ]; do sleep 0.5; n=$((n + 1)); done; '
                'kill -s KILL -- "-$1" 2>/dev/null; return 0; }',
                # the swarms of earlier releases: one still seeding holds the port, and this wave is the
                # one its peers wait for, so it is stopped, then removed
                f'for d in {q(rel + "/" + SWARM_DIR)}/*; do [ -d "$d" ] && [ "$d" != "$sw" ] || continue; '
                'p=$(cat "$d/pid" 2>/dev/null); [ -n "$p" ] && [ ! -e "$d/exit" ] && stop "$p"; rm -rf "$d"; done',
                "set -f",
                'list="$sw/list"; : > "$sw/t.b64"',
                'while IFS= read -r line; do [ "$line" = -- ] && break; printf \'%s\\n\' "$line" >> "$sw/t.b64"; done',
                'cat > "$list"',
                'base64 -d "$sw/t.b64" > "$sw/t.torrent" || { echo \'swarm-skip the torrent did not decode\'; exit 0; }',
                'printf \'#!/bin/sh\\n: > "%s/done"; rm -f "%s/login.conf"\\n\' "$sw" "$sw" > "$sw/hook"; chmod 755 "$sw/hook"',
                # a swarm of this release still running (a run again while it seeds) is used as it is
                'p=$(cat "$sw/pid" 2>/dev/null)',
                'if [ -n "$p" ] && [ ! -e "$sw/exit" ] && kill -0 "$p" 2>/dev/null; then :; else',
                '  rm -f "$sw/done" "$sw/exit"',
                '  cat > "$sw/run" <<EOF',
                f"timeout --foreground {life} {aria}",
                'echo \\$? > "$sw/exit"; rm -f "$sw/login.conf"',
                "EOF",
                # its own session: it outlives this command, and the group is stopped as one
                '  setsid sh "$sw/run" < /dev/null > "$sw/out" 2>&1 &',
                '  p=$!; echo "$p" > "$sw/pid"',
                "fi",
                "end=timeout; waited=0",
                f'while [ "$waited" -lt {int(wait_seconds)} ]; do',
                '  [ -e "$sw/done" ] && { end=done; break; }',
                # ended by itself (no byte for the stall time), or killed (nothing wrote its exit)
                '  [ -e "$sw/exit" ] && { end=stalled; break; }',
                '  alive "$p" || { end=stalled; break; }',
                "  sleep 1; waited=$((waited + 1))",
                "done",
                # an unfinished download is stopped before its files are read: nothing writes them then,
                # and a host serves nothing but complete, checked pieces of a finished one
                'if [ "$end" != done ] && [ ! -e "$sw/exit" ]; then',
                '  stop "$p"; echo 143 > "$sw/exit"',
                "fi",
                'echo "swarm-end $end"',
                "while IFS= read -r line; do",
                '  case "$line" in o\\ *) ;; *) continue;; esac',
                f'  set -- $line; f="$sw/{layout}$2"',
                '  have=$(stat -c %s "$f" 2>/dev/null || echo -1)',
                '  if [ "$have" = "$3" ] && [ "$(sha256sum < "$f" | cut -d\' \' -f1)" = "$2" ]; then',
                '    ln -f "$f" "$obj/$2" && echo "swarm $2 $3" && continue',
                "  fi",
                '  echo "swarm-miss $2"',
                'done < "$list"',
            ]
        )
        + "\n"
    )


@dataclass
class SwarmResult:
    skipped: str = ""
    end: str = ""
    got: dict[str, int] = field(default_factory=dict)  # sha -> size, verified
    missed: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(self.got.values())


def parse_swarm(lines) -> SwarmResult:
    res = SwarmResult()
    for line in lines:
        kind, _, rest = line.rstrip("\n").partition(" ")
        parts = rest.split(" ")
        if kind == "swarm-skip":
            res.skipped = rest
        elif kind == "swarm-end":
            res.end = rest
        elif kind == "swarm" and len(parts) == 2 and parts[1].isdigit():
            res.got[parts[0]] = int(parts[1])
        elif kind == "swarm-miss" and parts[0]:
            res.missed.append(parts[0])
    return res


# --- the wave: who is in it, who seeds, where the tracker is --------------------------------------

TRACKER_WHITELIST = "/etc/opentracker/whitelist.txt"  # Debian's opentracker.conf: access.whitelist
TRACKER_PORT = 6969  # opentracker's own default, which Debian's configuration keeps


def announce_url(address: str) -> str:
    """The announce URL of the opentracker a fan-out runs on the host at ``address``."""
    return f"http://{address}:{TRACKER_PORT}/announce"


@dataclass
class Wave:
    """The hosts of one staging run, filled while the deploy's operations are made (one entry a
    host: its release's info hash, zone and seed wish) and read when they run, by then complete."""

    members: dict[str, tuple[str, str | None, bool | None]] = field(default_factory=dict)

    def add(self, name: str, info_hash: str, zone: str | None, seed: bool | None) -> None:
        self.members[name] = (info_hash, zone, seed)

    def info_hashes(self) -> set[str]:
        return {ih for ih, _, _ in self.members.values()}

    def seeds(self) -> set[str]:
        """The seeds of each swarm (hosts of another release are another swarm): one per zone
        unless the inventory names them (tritonfleet.model_repo.torrent.seeds)."""
        out: set[str] = set()
        for ih in self.info_hashes():
            out |= seeds([(n, z, s) for n, (h, z, s) in self.members.items() if h == ih])
        return out


@dataclass
class Fanout:
    """What a host's staging needs of the fan-out (tritonfleet.model_repo.ops.model_release)."""

    torrent: object  # tritonfleet.model_repo.torrent.Torrent
    origin: object  # tritonfleet.model_repo.origin_store.Origin
    web_seed: str  # the origin's objects/ URL
    tracker: str  # announce URL
    tracker_host: str | None  # the host that runs the tracker for this run (None: the operator's)
    wave: Wave
    port: int
    seed_minutes: float
    stall_seconds: int
    wait_seconds: int


def tracker_script(info_hashes: set[str]) -> str:
    """Shell that makes Debian's opentracker on this host answer for ``info_hashes`` (its
    whitelist, read at its start)."""
    lines = "".join(f"{h}\\n" for h in sorted(info_hashes))
    return (
        f"command -v opentracker >/dev/null 2>&1 || {{ echo 'opentracker is not installed'; exit 1; }}\n"
        f"printf '{lines}' > {TRACKER_WHITELIST}.new && mv {TRACKER_WHITELIST}.new {TRACKER_WHITELIST} "
        "&& systemctl restart opentracker\n"
    )
