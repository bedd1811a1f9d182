"""What filling the image mirror costs the upstream a blob, and how much of it any client could
avoid (`bench/run.py mirror-fill`; docs/scale.md). No test host: Debian's registry twice on
loopback, an upstream and a pull-through mirror of it, and a synthetic image pushed to the
upstream (bench/dataplane.py's, ``--fill-mb`` in ``--fill-layers`` layers).

Each run empties the mirror's store and fills it from the upstream, counting the blob bytes the
upstream's own log says it sent (tritonfleet_testbed.origin_servers.Registry.blob_bytes):

* ``the fill as deployed``: tritonfleet.serving.image_mirror.fill_script, one trickling curl a
  blob (``--limit-rate 1K``) held open until the blob is in the mirror's store;
* ``a client that never reads``: the same script with the request made by a client that sets a
  4 KB receive buffer before it connects and never reads a byte: the least a request through the
  mirror can cost, since the client side then buffers next to nothing.

What both pay above the image is the mirror's second fetch of the blob (Distribution 2.8's proxy
fetches once for the client and once for its store, registry/proxy/proxyblobstore.go) up to the
point where the kernel's buffers between mirror and upstream are full. Takes about a minute.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

# the request of a client that never reads (4 KB receive buffer), in place of the trickling curl
HOLD = r'''python3 -c '
import socket, sys, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect((u.hostname, u.port))
s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (u.path, u.netloc)).encode())
time.sleep(3600)
' "$2" & pid=$!'''
CURL = 'curl -s --limit-rate 1K -o /dev/null "$2" & pid=$!'


def run(results, args, log) -> int:
    import dataplane
    from run import WORK, Row

    from tritonfleet.serving import image_mirror
    from tritonfleet_testbed.origin_servers import Registry

    work = WORK / "mirror-fill"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    img = dataplane.synthetic_image(work / "image.tar.gz", args.fill_mb, layers=args.fill_layers)
    figures: dict[str, list[dict]] = {"the fill as deployed": [], "a client that never reads": []}
    results.meta["mirror_fill"] = figures
    with Registry(work / "upstream") as up:
        digest = up.push(img, "nvidia/bench:1")
        for i in range(args.fill_runs):
            for name, client in (("the fill as deployed", None), ("a client that never reads", HOLD)):
                shutil.rmtree(work / "mirror" / "data", ignore_errors=True)
                with Registry(work / "mirror", proxy=f"http://{up.host}") as mirror:
                    url = f"http://{mirror.host}"
                    manifest = subprocess.run(["sh", "-c", image_mirror.manifest_command(url, "nvidia/bench", digest)],
                                              capture_output=True, text=True, check=True).stdout
                    _, blobs = image_mirror.parse_manifest(manifest)
                    script = image_mirror.fill_script(url, "nvidia/bench", blobs, str(mirror.storage))
                    if client is not None:
                        if CURL not in script:
                            raise SystemExit("[bench] the fill script no longer makes its request with " + CURL)
                        script = script.replace(CURL, client)
                    mark, t0 = up.mark(), time.perf_counter()
                    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=600)
                    seconds = time.perf_counter() - t0
                    if res.returncode != 0:
                        raise SystemExit(f"[bench] the fill failed: {res.stdout[-2000:]}{res.stderr[-2000:]}")
                    sent = up.blob_bytes(mark)
                    size = sum(mirror.storage.joinpath("docker/registry/v2/blobs/sha256", b[7:9], b[7:], "data")
                               .stat().st_size for b in blobs)
                fig = {"run": i + 1, "blobs": len(blobs), "image_bytes": size, "upstream_bytes": sent,
                       "ratio": round(sent / size, 4), "over_per_blob_mb": round((sent - size) / len(blobs) / 1e6, 2),
                       "seconds": round(seconds, 1)}
                figures[name].append(fig)
                log(f"  run {i + 1}, {name}: {fig}")
    for name, figs in figures.items():
        row = Row(f"mirror fill, {name}: upstream bytes above the image a blob", unit="MB",
                  target="" if figs is figures["a client that never reads"] else "(goal 1.05x the image)")
        row.values = [f["over_per_blob_mb"] for f in figs]
        ratios = [f["ratio"] for f in figs]
        row.note = (f"{args.fill_mb} MB in {args.fill_layers} layers + config: {statistics.median(ratios):.3f}x the "
                    f"image (median of {len(figs)}), loopback")
        results.add(row)
    return 0


if __name__ == "__main__":
    sys.exit("run it as: .venv/bin/python bench/run.py mirror-fill")
