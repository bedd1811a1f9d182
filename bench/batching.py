"""The article's dynamic-batching result, reproduced on this machine: the runbook's
resnet50_onnx with its dynamic_batching settings (preferred 8/16/32/64, 5000 us queue delay,
2 instances) against the same model with batching off (the dynamic_batching block removed),
each served by the real tritonserver of the nvidia-pytriton wheel on loopback, under the same
closed-loop load sweep as ``tritonfleet loadtest``.

    .venv/bin/python bench/batching.py [--duration 5] [--concurrency 1,4,16,64] [--protocol http]
        [--plot docs/performance-serving.png] [--runs 1]

What differs from the article's L4 figures: no GPU (instances on KIND_CPU; the stand-in
"onnxruntime" backend runs ONNX Runtime inside Triton's Python backend), the stand-in model
(a pooling + one matrix product, not ResNet-50's 4 GFLOPs), and the load generator sharing this
machine's cores with the server. Prints a table and writes bench/results/batching-<time>.{md,json};
asserts nothing (a report, not a test). Bounded: 2 variants x runs x concurrencies x duration
plus about 10 s of start-up per server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from google.protobuf import text_format  # noqa: E402
from tritonclient.grpc import model_config_pb2  # noqa: E402

from tritonfleet.observability import loadtest  # noqa: E402
from tritonfleet_testbed import standin_images as images  # noqa: E402
from tritonfleet_testbed.localtriton import LocalTriton  # noqa: E402

MODELS = ("resnet50_onnx", "text_classifier_onnx")
#: the article's L4 figures (Uvicorn/FastAPI -> Triton with dynamic batching)
ARTICLE = {"before_qps": 120, "after_qps": 980, "p95_cut": 0.65}


def repository(dest: Path, model: str, batching: bool) -> Path:
    """The runbook's ``model`` alone, instances on KIND_CPU; without its dynamic_batching block
    when ``batching`` is off (max_batch_size stays: the model still takes batches)."""
    src = ROOT / "files" / "model_repository" / model
    shutil.copytree(src, dest / model)
    cfg = model_config_pb2.ModelConfig()
    text_format.Parse((src / "config.pbtxt").read_text(), cfg)
    for g in cfg.instance_group:
        g.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
        g.ClearField("gpus")
    if not batching:
        cfg.ClearField("dynamic_batching")
    (dest / model / "config.pbtxt").write_text(text_format.MessageToString(cfg))
    return dest


def measure(model: str, batching: bool, concurrencies: list[int], duration: float, protocol: str,
            label: str) -> list[loadtest.Step]:
    with tempfile.TemporaryDirectory(prefix="tf-batching-") as tmp:
        repo = repository(Path(tmp) / "repo", model, batching)
        with LocalTriton(repo, python_based_backends={"onnxruntime": images.backend_model_py()}) as t:
            tg = loadtest.Target(label, t.http_url, f"127.0.0.1:{t.grpc_port}",
                                 t.metrics_url.removesuffix("/metrics"))
            return loadtest.run_target(tg, [model], concurrencies, duration, protocol,
                                       echo=loadtest.stderr_echo, warmup=16, label=label)


def median_steps(runs: list[list[loadtest.Step]]) -> list[loadtest.Step]:
    """Per concurrency, the run with the median throughput (a whole step, so its figures agree)."""
    out = []
    for i in range(len(runs[0])):
        same = sorted((r[i] for r in runs), key=lambda s: s.throughput)
        out.append(same[(len(same) - 1) // 2])
    return out


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(on: list[loadtest.Step], off: list[loadtest.Step]) -> str:
    lines = ["| concurrency | inf/s, batching off | inf/s, batching on | throughput x | p95 ms off | "
             "p95 ms on | p95 change | mean batch on | queue / compute us on | queue / compute us off | "
             "client CPU (on) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a, b in zip(off, on, strict=True):
        ratio = b.throughput / a.throughput if a.throughput else float("nan")
        p95 = (b.p95_ms / a.p95_ms - 1) * 100 if a.p95_ms and b.p95_ms else float("nan")
        lines.append(
            f"| {a.concurrency} | {a.throughput:.0f} | {b.throughput:.0f} | {ratio:.2f} | "
            f"{_f(a.p95_ms, '.1f')} | {_f(b.p95_ms, '.1f')} | {p95:+.0f}% | {_f(b.batch_avg, '.1f')} | "
            f"{_f(b.queue_us_avg, '.0f')} / {_f(b.compute_us_avg, '.0f')} | "
            f"{_f(a.queue_us_avg, '.0f')} / {_f(a.compute_us_avg, '.0f')} | "
            f"{(b.client_busy or 0) * 100:.0f}% |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", choices=MODELS, help="default: both of the runbook's models")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of load per step")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--protocol", choices=loadtest.PROTOCOLS, default="http")
    ap.add_argument("--runs", type=int, default=1, help="runs per variant (alternating); the median is shown")
    ap.add_argument("--plot", default=None, help="PNG: throughput and p95 against concurrency")
    args = ap.parse_args()
    conc = loadtest.parse_concurrency(args.concurrency)
    models = args.model or list(MODELS)
    t0 = time.monotonic()
    runs: dict[str, dict[str, list[list[loadtest.Step]]]] = {}
    for model in models:
        runs[model] = {"batching off": [], "batching on": []}
        for _ in range(args.runs):
            for label, batching in (("batching off", False), ("batching on", True)):
                runs[model][label].append(measure(model, batching, conc, args.duration, args.protocol, label))
    head = (f"{args.protocol}, {args.duration:g} s a step, {args.runs} run(s) a variant, "
            f"{os.cpu_count()} CPU core(s), load average {os.getloadavg()[0]:.1f} at the end, "
            f"{time.monotonic() - t0:.0f} s in all")
    text = [head]
    steps = []
    for model in models:
        off, on = median_steps(runs[model]["batching off"]), median_steps(runs[model]["batching on"])
        steps += off + on
        ratio = statistics.mean(b.throughput / a.throughput for a, b in zip(off, on, strict=True))
        text += ["", f"{model} (mean throughput ratio on/off over the sweep: {ratio:.2f})", "",
                 markdown(on, off)]
    print("\n".join(text))
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"batching-{stamp}.md").write_text("\n".join(text) + "\n")
    (out / f"batching-{stamp}.json").write_text(json.dumps(
        {"head": head, "article": ARTICLE,
         "runs": {m: {k: [[s.as_dict() for s in r] for r in v] for k, v in rv.items()}
                  for m, rv in runs.items()}}, indent=2))
    if args.plot:
        loadtest.plot(steps, args.plot, "bundled tritonserver, CPU stand-in backend: dynamic batching off vs on")
        print(f"plot: {args.plot}", file=sys.stderr)
    print(f"results: bench/results/batching-{stamp}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
