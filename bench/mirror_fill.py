"""What filling the image mirror costs the upstream a blob (`bench/run.py mirror-fill`;
docs/scale.md). No test host: Debian's registry twice on loopback, an upstream and a pull-through
mirror of it, and a synthetic image pushed to the upstream (tritonfleet_testbed.origin_servers's, ``--fill-mb`` in
``--fill-layers`` layers).

Each run empties the mirror's store and fills it from the upstream, counting the blob bytes the
upstream's own log says it sent (tritonfleet_testbed.origin_servers.Registry.blob_bytes):

* ``the fill as deployed``: tritonfleet.serving.image_mirror.fill_script, one request a blob cut
  at its headers (``curl --max-filesize 1``), then a wait until the blob is in the mirror's store;
* ``a trickling request held open``: the same script with the request the fill made before,
  ``curl --limit-rate 1K`` kept open until the blob is in the store.

What either pays above the image is the mirror's second fetch of the blob (Distribution 2.8's
proxy fetches once for the client and once for its store, registry/proxy/proxyblobstore.go): held
open, up to the point where the kernel's buffers between mirror and upstream are full; cut, up to
the mirror's next write to the closed connection. Takes about a minute.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

# the fill's request (image_mirror.fill_script), and the one it made before: a trickle held open
CUT = 'curl -s --max-filesize 1 --max-time 60 -o /dev/null "$2"'
HELD = ('curl -s --limit-rate 1K -o /dev/null "$2" & pid=$!; while [ ! -f "$1" ]; do sleep 0.1; done; '
        'kill $pid; wait $pid')


def run(results, args, log) -> int:
    from run import WORK, Row

    from tritonfleet.serving import image_mirror
    from tritonfleet_testbed.origin_servers import Registry

    work = WORK / "mirror-fill"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    from tritonfleet_testbed.origin_servers import synthetic_image

    img = synthetic_image(work / "image.tar.gz", args.fill_mb, layers=args.fill_layers)
    figures: dict[str, list[dict]] = {"the fill as deployed": [], "a trickling request held open": []}
    results.meta["mirror_fill"] = figures
    with Registry(work / "upstream") as up:
        digest = up.push(img, "nvidia/bench:1")
        for i in range(args.fill_runs):
            for name, client in (("the fill as deployed", None), ("a trickling request held open", HELD)):
                shutil.rmtree(work / "mirror" / "data", ignore_errors=True)
                with Registry(work / "mirror", proxy=f"http://{up.host}") as mirror:
                    url = f"http://{mirror.host}"
                    manifest = subprocess.run(["sh", "-c", image_mirror.manifest_command(url, "nvidia/bench", digest)],
                                              capture_output=True, text=True, check=True).stdout
                    _, blobs = image_mirror.parse_manifest(manifest)
                    script = image_mirror.fill_script(url, "nvidia/bench", blobs, str(mirror.storage))
                    if client is not None:
                        if CUT not in script:
                            raise SystemExit("[bench] the fill script no longer makes its request with " + CUT)
                        script = script.replace(CUT, client)
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
                  target="" if figs is figures["a trickling request held open"] else "(goal 1.05x the image)")
        row.values = [f["over_per_blob_mb"] for f in figs]
        ratios = [f["ratio"] for f in figs]
        row.note = (f"{args.fill_mb} MB in {args.fill_layers} layers + config: {statistics.median(ratios):.3f}x the "
                    f"image (median of {len(figs)}), loopback")
        results.add(row)
    return 0


if __name__ == "__main__":
    sys.exit("run it as: .venv/bin/python bench/run.py mirror-fill")
