"""The Triton image's layers shared between a wave's hosts (BitTorrent, the image mirror's registry
the web seed of one host a zone), then loaded into Docker by digest: pure shell text and parsers
(the operations: tritonfleet.serving.ops.image_fanout; why and the measurements:
docs/model-origin.md#the-image).

**On the mirror host** (:func:`seed_script`): the pinned manifest is read from the mirror's own
store (the fill put it and every blob there) and checked against the pinned digest; every blob it
names is checked against its own digest; the torrent of those blobs is made from the store
(tritonfleet.model_repo.torrent's own code, sent with the script), laid out as the registry's blob
URLs (``blobs/sha256:<hex>``) so that BEP 19's web seed ``<mirror>/v2/<path>/`` is the registry
itself; Debian's opentracker on the mirror host names the peers. The mirror uploads nothing but
what its registry serves: to each zone's seed host once (its web seed), and to a host that falls
back to a pull.

**On each GPU host** whose image is missing: the swarm (tritonfleet.model_repo.swarm's script,
its own directory) brings the blobs, each checked against its sha256 before use; the seed hosts
(one a zone, as the release's: tritonfleet.model_repo.torrent.seeds) read the registry through the
web seed as the mirror's client (aria2c's ``http-user``/``http-passwd`` in a 0600 file, removed
when the download ends; the mirror's CA), the others only their peers. Then
:func:`load_script` lays them out as a throwaway Distribution registry on 127.0.0.1 (Debian's
``docker-registry`` binary, unpacked, no service), with the manifest the control machine read on
the mirror host and checked again here, and ``docker pull 127.0.0.1:<port>/<path>@<digest>``:
Docker checks each blob against its digest and records which layer it is. Then ``docker pull
<mirror ref>`` finds the image there (moby ``distribution/pull_v2.go``, ``pullSchema2``: "If the
image already exists locally, no need to pull anything", keyed by the config's digest; a layer is
found by its blob digest whatever the registry: ``v2LayerDescriptor`` asks the V2 metadata
service, which maps a blob digest to a layer for every registry), so the mirror sends the
manifest only, and the image carries the mirror's RepoDigest as a plain pull leaves it; the
127.0.0.1 reference is removed. Anything short of that is a line of output, never a failure: the
staging's normal pull through the mirror follows and takes what is missing.
"""

from __future__ import annotations

import base64
from pathlib import Path

from ..core.shell import q
from ..model_repo import torrent
from ..model_repo.swarm import TRACKER_WHITELIST as WHITELIST

SEED_DIR = "tritonfleet-image-seed"  # below the mirror's storage: what an earlier version seeded from (removed)
# where a blob is in the image's torrent (its name, then each file's prefix before the blob's hex):
# the registry's blob URL below /v2/<path>/, so the registry is the torrent's web seed
SWARM_NAME, SWARM_PREFIX = "blobs", "sha256:"
SWARM_LAYOUT = f"{SWARM_NAME}/{SWARM_PREFIX}"
HOST_BASE = "/var/lib/tritonfleet-image-fanout"  # on the GPU hosts: the swarm, the registry binary
REGISTRY_BIN = f"{HOST_BASE}/registry/usr/bin/docker-registry"

# the mirror host's program: tritonfleet.model_repo.torrent's source, then this
_SEED_MAIN = r"""
import base64 as _b64, hashlib as _h, json as _j, os as _os, sys as _sys

def _main(store, path, digest, tracker, piece, web_seed, os_name="linux", arch="amd64"):
    def blob(d):
        return _os.path.join(store, "docker/registry/v2/blobs/sha256", d[7:9], d[7:], "data")

    def checked(d, keep=False):
        h, size, data = _h.sha256(), 0, []
        try:
            with open(blob(d), "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
                    if keep:
                        data.append(chunk)
        except OSError:
            print(f"imgfan-skip the mirror's store has no {d} (is the image filled?)")
            raise SystemExit(0)
        if "sha256:" + h.hexdigest() != d:
            print(f"imgfan-skip the mirror's copy of {d} does not hash to its digest")
            raise SystemExit(0)
        return size, b"".join(data)

    manifests, d = [], digest
    while True:
        _, text = checked(d, keep=True)
        manifests.append((d, text))
        doc = _j.loads(text)
        if isinstance(doc.get("manifests"), list):
            d = next((m["digest"] for m in doc["manifests"] if (m.get("platform") or {}).get("os") == os_name
                      and (m.get("platform") or {}).get("architecture") == arch), None)
            if d is None or len(manifests) > 1:
                print(f"imgfan-skip no single {os_name}/{arch} image in {digest}")
                raise SystemExit(0)
            continue
        break
    blobs = [doc["config"]["digest"]] + [layer["digest"] for layer in doc["layers"]]
    sizes = {b[7:]: checked(b)[0] for b in dict.fromkeys(blobs)}
    # laid out as the registry's blob URLs: <web seed>blobs/sha256:<hex>, the web seed the
    # registry's /v2/<path>/ (BEP 19), so the wave's seeds read the mirror's own blobs
    t = make(sizes, lambda s: open(blob("sha256:" + s), "rb"), piece, name=_NAME, prefix=_PREFIX)
    meta = t.metainfo(tracker)
    for md, text in manifests:
        print("imgfan-manifest", md, _b64.b64encode(text).decode())
    for s in t.files:
        print("imgfan-blob", s, sizes[s])
    print("imgfan-torrent", t.info_hash, _b64.b64encode(meta).decode())
    print("imgfan-seed-torrent", _b64.b64encode(t.metainfo(tracker, web_seed)).decode())

_main(*_sys.argv[1:5], int(_sys.argv[5]), _sys.argv[6])
"""


def seed_program() -> str:
    """The Python program the mirror host runs (its python3, the standard library only)."""
    layout = f"\n_NAME, _PREFIX = {SWARM_NAME!r}, {SWARM_PREFIX!r}\n"  # SWARM_LAYOUT's two halves
    return Path(torrent.__file__).read_text() + layout + _SEED_MAIN


def seed_script(storage: str, path: str, digest: str, tracker: str, web_seed: str, *, piece: int) -> str:
    """Shell on the mirror host: the image ``path@digest``'s torrent made from the store (every
    blob checked against its digest first), the tracker (opentracker on this host) told of this
    swarm. The mirror uploads nothing itself: each zone's seed host reads the blobs from its
    registry through ``web_seed`` (``<mirror>/v2/<path>/``), once a wave, and the rest of the wave
    from each other. Output: :func:`parse_seed`'s lines."""
    legacy = f"{storage}/{SEED_DIR}"
    return (
        "\n".join(
            [
                "set -u",
                "umask 022",
                "for p in python3 opentracker; do command -v $p >/dev/null 2>&1 || "
                '{ echo "imgfan-skip $p is not installed on the mirror host"; exit 0; }; done',
                # an earlier version seeded from here with aria2c: its seeds stopped, its links removed
                f'for d in {q(legacy)}/*; do [ -d "$d" ] || continue; p=$(cat "$d/pid" 2>/dev/null); '
                '[ -n "$p" ] && kill -s TERM -- "-$p" 2>/dev/null; rm -rf "$d"; done',
                f"out=$(python3 -c {q(seed_program())} {q(storage)} {q(path)} {q(digest)} {q(tracker)} "
                f"{int(piece)} {q(web_seed)}) || {{ echo 'imgfan-skip the torrent could not be made'; exit 0; }}",
                "printf '%s\\n' \"$out\"",
                'case "$out" in *imgfan-skip*) exit 0;; esac',
                "ih=$(printf '%s\\n' \"$out\" | sed -n 's/^imgfan-torrent \\([0-9a-f]*\\) .*/\\1/p')",
                f"printf '%s\\n' \"$ih\" > {WHITELIST}.new && mv {WHITELIST}.new {WHITELIST} "
                "&& systemctl restart opentracker || { echo 'imgfan-skip the tracker did not start'; exit 0; }",
                "echo imgfan-ready",
            ]
        )
        + "\n"
    )


def parse_seed(lines) -> dict:
    """{"skip": why} or {"manifests": [(digest, bytes)...], "blobs": {hex: size}, "info_hash": ...,
    "torrent": bytes, "seed_torrent": bytes (the same swarm, with the registry as its web seed)}
    from :func:`seed_script`'s output."""
    out: dict = {"manifests": [], "blobs": {}}
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        parts = rest.split(" ")
        if kind == "imgfan-skip":
            return {"skip": rest}
        if kind == "imgfan-manifest" and len(parts) == 2:
            out["manifests"].append((parts[0], base64.b64decode(parts[1])))
        elif kind == "imgfan-blob" and len(parts) == 2 and parts[1].isdigit():
            out["blobs"][parts[0]] = int(parts[1])
        elif kind == "imgfan-torrent" and len(parts) == 2:
            out["info_hash"], out["torrent"] = parts[0], base64.b64decode(parts[1])
        elif kind == "imgfan-seed-torrent" and len(parts) == 1:
            out["seed_torrent"] = base64.b64decode(parts[0])
    if "torrent" not in out or "seed_torrent" not in out or not out["manifests"] or not out["blobs"]:
        return {"skip": "the mirror host's answer was incomplete"}
    return out


def load_input(manifests: list[tuple[str, bytes]], blobs: dict[str, int]) -> str:
    """:func:`load_script`'s stdin: ``m <digest> <base64>`` per manifest, ``b <hex>`` per blob."""
    return "".join(f"m {d} {base64.b64encode(t).decode()}\n" for d, t in manifests) + "".join(
        f"b {h}\n" for h in sorted(blobs)
    )


def load_script(objects: str, path: str, digest: str, mirror_ref: str, port: int) -> str:
    """Shell on a GPU host: the blobs the swarm brought (``objects``/<hex>, each checked already)
    and the manifests on stdin (checked here against their digests) served by a throwaway registry
    on 127.0.0.1:``port``; Docker pulls the image by digest from it, then ``mirror_ref`` (the mirror
    then sends the manifest only), then forgets the 127.0.0.1 reference. Prints ``imgfan-loaded``
    or ``imgfan-skip <why>``; exits 0 either way."""
    local = f"127.0.0.1:{int(port)}/{path}@{digest}"
    return (
        "\n".join(
            [
                "set -u",
                "umask 077",
                f"reg={q(REGISTRY_BIN)}",
                '[ -x "$reg" ] || { echo "imgfan-skip no registry binary at $reg"; cat >/dev/null; exit 0; }',
                f"st=$(mktemp -d {q(HOST_BASE + '/store.XXXXXX')}) || {{ echo 'imgfan-skip no scratch directory'; exit 0; }}",
                "rp=",
                'trap \'[ -n "$rp" ] && kill "$rp" 2>/dev/null; rm -rf "$st"\' EXIT',
                'S="$st/docker/registry/v2"',
                f'R="$S/repositories/{path}"',
                'put() { h=$1; two=$(printf %.2s "$h"); mkdir -p "$S/blobs/sha256/$two/$h" && ln -f "$2" "$S/blobs/sha256/$two/$h/data"; }',
                "while read -r kind d rest; do",
                '  case "$kind" in',
                '  m) h=${d#sha256:}; printf %s "$rest" | base64 -d > "$st/m.$h" || exit 0',
                '     [ "$(sha256sum < "$st/m.$h" | cut -d" " -f1)" = "$h" ] || { echo "imgfan-skip manifest $d does not hash to its digest"; exit 0; }',
                '     put "$h" "$st/m.$h" && mkdir -p "$R/_manifests/revisions/sha256/$h" && printf "sha256:%s" "$h" > "$R/_manifests/revisions/sha256/$h/link" || exit 0;;',
                f'  b) [ -f {q(objects)}/"$d" ] || {{ echo "imgfan-skip blob $d did not arrive"; exit 0; }}',
                f'     put "$d" {q(objects)}/"$d" && mkdir -p "$R/_layers/sha256/$d" && printf "sha256:%s" "$d" > "$R/_layers/sha256/$d/link" || exit 0;;',
                "  esac",
                "done",
                'chmod -R go+rX "$st"',
                "printf 'version: 0.1\\nlog: {level: error}\\nstorage: {filesystem: {rootdirectory: %s}, maintenance: "
                "{uploadpurging: {enabled: false}, readonly: {enabled: true}}}\\nhttp: {addr: 127.0.0.1:%s, secret: %s}\\n' "
                f'"$st" {int(port)} "$(head -c 12 /dev/urandom | base64)" > "$st/config.yml"',
                '"$reg" serve "$st/config.yml" > "$st/log" 2>&1 &',
                "rp=$!",
                "n=0; until curl -fsS -o /dev/null " + q(f"http://127.0.0.1:{int(port)}/v2/") + "; do",
                '  n=$((n + 1)); [ $n -lt 60 ] && kill -0 "$rp" 2>/dev/null || '
                '{ echo "imgfan-skip the local registry did not start: $(tail -c 300 "$st/log")"; exit 0; }; sleep 0.5',
                "done",
                f'docker pull -q {q(local)} > "$st/pull" 2>&1 || '
                '{ echo "imgfan-skip docker refused the local copy: $(tail -c 300 "$st/pull")"; exit 0; }',
                f'docker pull -q {q(mirror_ref)} > "$st/pull" 2>&1; ok=$?',
                f"docker rmi {q(local)} > /dev/null 2>&1",
                '[ $ok = 0 ] || { echo "imgfan-skip the pull through the mirror failed: $(tail -c 300 "$st/pull")"; exit 0; }',
                # what was loaded is in Docker now: the objects' links go (the swarm's own files keep seeding)
                f"rm -f {q(objects)}/*",
                "echo imgfan-loaded",
            ]
        )
        + "\n"
    )


def registry_install() -> str:
    """Shell on a GPU host: Debian's ``docker-registry`` binary unpacked below HOST_BASE (no
    package installed, so no registry service on the GPU hosts)."""
    return (
        f'[ -x {q(REGISTRY_BIN)} ] || {{ t=$(mktemp -d) && cd "$t" && apt-get download -q docker-registry '
        f"&& mkdir -p {q(HOST_BASE + '/registry')} && dpkg-deb -x docker-registry_*.deb {q(HOST_BASE + '/registry')}; "
        'rc=$?; cd / && rm -rf "$t"; exit $rc; }'
    )
