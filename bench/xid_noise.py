"""The GPU fault collector under an Xid flood (`bench/run.py xid-noise`; docs/operations.md,
"Xid noise"). No test host: the collector (tritonfleet.gpu.telemetry) runs here, in a fresh
python3 of its own per run, following a kernel-message file of ``--xid-lines`` Xid 95 reports
(default 800,000) with ``--xid-distinct`` distinct texts (default 29: NVSentinel's issue 1120,
"over ~800K entries of XID 95 on a problematic node but only 29 distinct"), in two ways:

* ``follow``: the file grows by ``--xid-batch`` lines (default 50,000) and the collector reads
  what is new after each, as it does on a host (then writes its textfile);
* ``catch-up``: the whole file is there before the collector's first read (a collector started,
  or stalled, behind the flood).

Per run: the collector's CPU time (user + system, of its reads and textfile writes only; making
the file is not counted) per line, its resident memory after each batch and its peak while reading (the kernel's peak
counter reset before each read, /proc/self/clear_refs), the
lines it logged. ``--against TREE`` runs the same with another checkout's collector (the code
before a change) for comparison; its Collector takes the same arguments.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _rss_kb(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(tree: str, mode: str, lines: int, distinct: int, batch: int, work: str) -> dict:
    """One run in this process (a fresh interpreter): the figures as a dict."""
    sys.path.insert(0, tree)
    from tritonfleet.gpu import telemetry as t

    kmsg, out = Path(work) / "kmsg", Path(work) / "textfiles"
    out.mkdir(parents=True, exist_ok=True)
    kmsg.write_text("")
    texts = [f"NVRM: Xid (PCI:0000:{0x18 + i % 8:02x}:00): 95, pid={4000 + i}, name=tritonserver, "
             "Uncontained: FBHUB. RST: Yes, D-RST: No" for i in range(distinct)]
    c = t.Collector(str(out), "false", str(kmsg), 5, 10)
    cpu, rss, seq, peak = 0.0, [], 0, 0

    def read() -> None:
        nonlocal cpu, peak
        with open("/proc/self/clear_refs", "w") as f:  # the peak from here: the read's, not the file's making
            f.write("5")
        t0 = time.process_time()
        c.read_log()
        while getattr(c.log, "more", False):
            c.read_log()
        c.write()
        cpu += time.process_time() - t0
        peak = max(peak, _rss_kb("VmHWM"))

    rss.append(_rss_kb())
    while seq < lines:
        n = min(batch, lines - seq)
        with open(kmsg, "a") as f:
            f.write("".join(f"3,{seq + k},{1_000_000 + seq + k},-;{texts[(seq + k) % distinct]}\n" for k in range(n)))
        seq += n
        if mode == "follow":
            read()
            rss.append(_rss_kb())
    if mode == "catch-up":
        read()
        rss.append(_rss_kb())
    text = (out / t.TEXTFILE).read_text()
    counted = sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
                  if x.startswith("tritonfleet_gpu_xid_errors_total{"))
    return {"mode": mode, "lines": lines, "distinct": distinct, "counted": counted, "cpu_s": round(cpu, 3),
            "us_per_line": round(cpu / lines * 1e6, 3), "rss_kb": rss, "peak_kb": peak,
            "file_mb": round(kmsg.stat().st_size / 1e6, 1)}


def _one(tree: Path, mode: str, args, log) -> dict:
    work = Path(tempfile.mkdtemp(prefix="xid-noise-", dir=os.environ.get("TMPDIR")))
    try:
        err = work / "stderr"
        with open(err, "w") as e:
            res = subprocess.run([sys.executable, str(Path(__file__)), "child", str(tree), mode, str(args.xid_lines),
                                  str(args.xid_distinct), str(args.xid_batch), str(work)],
                                 stdout=subprocess.PIPE, stderr=e, text=True, timeout=1800)
        if res.returncode != 0:
            raise SystemExit(f"[bench] the collector run failed: {err.read_text()[-2000:]}")
        fig = json.loads(res.stdout)
        fig["logged_lines"] = sum(1 for _ in open(err))
        return fig
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(results, args, log) -> int:
    from run import Row

    trees = [("this checkout", ROOT)] + ([("--against", Path(args.against).resolve())] if args.against else [])
    figures: dict[str, list[dict]] = {}
    results.meta["xid_noise"] = figures
    for i in range(args.runs):
        for name, tree in trees:
            for mode in ("follow", "catch-up"):
                fig = _one(tree, mode, args, log)
                figures.setdefault(f"{name}, {mode}", []).append(fig)
                log(f"  run {i + 1}, {name}, {mode}: {json.dumps({k: v for k, v in fig.items() if k != 'rss_kb'})} "
                    f"rss_kb {fig['rss_kb'][0]}..{fig['rss_kb'][-1]}")
    for key, figs in figures.items():
        cpu = Row(f"xid-noise {key}: CPU per line", unit="us")
        cpu.values = [f["us_per_line"] for f in figs]
        cpu.note = (f"{figs[0]['lines']} lines, {figs[0]['distinct']} distinct, {figs[0]['file_mb']} MB; "
                    f"CPU {statistics.median(f['cpu_s'] for f in figs):.2f} s; logged "
                    f"{statistics.median(f['logged_lines'] for f in figs):g} lines; counted "
                    f"{statistics.median(f['counted'] for f in figs):g}")
        results.add(cpu)
        mem = Row(f"xid-noise {key}: resident memory, peak", unit="MB")
        mem.values = [round(f["peak_kb"] / 1024, 1) for f in figs]
        growth = [round((f["rss_kb"][-1] - f["rss_kb"][1 if len(f["rss_kb"]) > 2 else 0]) / 1024, 1) for f in figs]
        mem.note = (f"after the first read {statistics.median(f['rss_kb'][1] / 1024 for f in figs):.1f} MB, "
                    f"after the last {statistics.median(f['rss_kb'][-1] / 1024 for f in figs):.1f} MB "
                    f"(growth {statistics.median(growth):g} MB)")
        results.add(mem)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "child":
        _, _, tree, mode, lines, distinct, batch, work = sys.argv
        print(json.dumps(child(tree, mode, int(lines), int(distinct), int(batch), work)))
    else:
        raise SystemExit("run through bench/run.py xid-noise")
