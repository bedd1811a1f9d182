"""The continuous inference probe on a host: "ready" is not "serves" (runs ON the GPU host).

Triton can keep answering ``/v2/health/ready`` with 200 while every inference fails
(triton-inference-server/server#3627, #5765, #7164), so a load balancer's health check keeps
sending traffic to a host that only returns errors. This probe sends each model one real
inference every ``interval`` seconds, on the host itself, and writes the outcome into
``<textfile dir>/tritonfleet-inference-probe.prom`` for the node exporter's textfile collector:

* the models: Triton's repository index (``POST /v2/repository/index``), the ones it reports
  ``READY`` (a model that is not ready is TritonModelNotReady's business, and a model loading
  after a restart is not failed);
* the request: built from Triton's own configuration of the model (``GET
  /v2/models/<m>/config``, the JSON form of its ModelConfig) the way the deploy's warm inference
  gate builds it from config.pbtxt (tritonfleet.serving.warmup; a test compares the two): every input that
  is not optional, its data type, its dims with -1 as 1, a leading batch dimension of 1 when
  ``max_batch_size`` > 0, zeros (empty strings for BYTES); sequence models are not probed (they
  need a correlation id);
* success: HTTP 200 and every output the configuration declares, with a shape that fits its dims.

The repository index and the configuration are restricted APIs on a tritonfleet host
(``triton_restricted_apis``): the probe sends the host's key (``--key-file``, root-only) in the
header Triton expects (tritonfleet.serving.apikey.HEADER). It runs ``python3`` with the standard library
only (steps/telemetry.py copies this file to the host as it is, and next to it the health-signal
spec, tritonfleet.gpu.signals, whose metric names it writes).

Metrics (labels ``triton_port``, the instance's HTTP port, and ``model``):
``tritonfleet_inference_probe_success`` (1/0), ``..._latency_seconds``,
``..._consecutive_failures`` (what the quarantine alert counts), ``..._last_success_timestamp_seconds``,
and per instance ``tritonfleet_inference_probe_up`` (Triton answered its repository index) and
``..._models`` (models probed). A probe is one request per model: it shows in Triton's own request
counters (nv_inference_request_success) like any client's.
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import importlib.util
import json
import math
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def _spec():
    """The health-signal spec (tritonfleet.gpu.signals): the package's module; run as a script, its
    copy next to this file (on the host, where tritonfleet is not installed) or the package's file."""
    if __package__:
        return importlib.import_module("tritonfleet.gpu.signals")
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "gpu_signals.py"), os.path.join(here, os.pardir, "gpu", "signals.py")]
    path = next((p for p in paths if os.path.exists(p)), paths[0])
    spec = importlib.util.spec_from_file_location("gpu_signals", path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        raise ImportError(f"{path}: the health-signal spec is missing (the GPU telemetry step puts it there)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


S = _spec()

TEXTFILE = "tritonfleet-inference-probe.prom"
HEADER = "tritonfleet-api-key"  # tritonfleet.serving.apikey.HEADER (not imported: a host script)
PREFIX = S.PROBE_PREFIX

# ModelConfig.DataType names (Triton's JSON config) -> the KServe v2 datatype of the HTTP protocol
DATATYPES = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}


def _dims(values) -> list[int]:
    return [int(d) for d in values or []]


def request_for(cfg: dict) -> dict | None:
    """The inference request body (batch 1, zeros) for Triton's JSON configuration ``cfg``; None
    when the model cannot be probed this way (sequence batching, an unknown data type)."""
    if "sequence_batching" in cfg:  # present, even empty: a sequence model (warmup: HasField)
        return None
    batch = int(cfg.get("max_batch_size") or 0) > 0
    inputs = []
    for i in cfg.get("input") or []:
        if i.get("optional"):
            continue
        dtype = DATATYPES.get(str(i.get("data_type")))
        if dtype is None:
            return None
        shape = ([1] if batch else []) + [d if d > 0 else 1 for d in _dims(i.get("dims"))]
        value: object = "" if dtype == "BYTES" else (False if dtype == "BOOL" else 0)
        inputs.append({"name": i["name"], "shape": shape, "datatype": dtype, "data": [value] * math.prod(shape)})
    return {"inputs": inputs}


def shape_problems(cfg: dict, outputs: list[dict]) -> list[str]:
    """Declared outputs missing from the answer, or with a shape that does not fit their dims."""
    got = {o.get("name"): list(o.get("shape") or []) for o in outputs}
    batch = int(cfg.get("max_batch_size") or 0) > 0
    out = []
    for o in cfg.get("output") or []:
        name = o.get("name")
        if name not in got:
            out.append(f"output {name!r} missing")
            continue
        reshape = o.get("reshape")
        dims = _dims(reshape.get("shape")) if isinstance(reshape, dict) and "shape" in reshape else _dims(o.get("dims"))
        want = ([1] if batch else []) + dims
        have = got[name]
        if len(have) != len(want) or any(w not in (-1, h) for w, h in zip(want, have, strict=True)):
            out.append(f"output {name!r} has shape {have}, its config says {want}")
    return out


class Triton:
    """One Triton instance's HTTP endpoint on this host."""

    def __init__(self, url: str, key: str, timeout: float):
        self.url, self.key, self.timeout = url.rstrip("/"), key, timeout

    def call(self, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {HEADER: self.key} if self.key else {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(
            self.url + path, data=body, headers=headers, method="POST" if body is not None else "GET"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def ready_models(self) -> list[str]:
        status, body = self.call("/v2/repository/index", b"{}")
        if status != 200:
            raise ValueError(f"repository index: HTTP {status} {body[:200].decode('utf-8', 'replace')}")
        return sorted({m["name"] for m in json.loads(body) if m.get("state") == "READY" and m.get("name")})

    def probe(self, model: str) -> tuple[bool, float, str]:
        """(success, seconds the inference took, why it failed)."""
        quoted = urllib.parse.quote(model, safe="")
        status, body = self.call(f"/v2/models/{quoted}/config")
        if status != 200:
            return False, 0.0, f"config: HTTP {status} {body[:200].decode('utf-8', 'replace')}"
        cfg = json.loads(body)
        request = request_for(cfg)
        if request is None:
            return True, 0.0, "not probed (sequence model or unknown data type)"
        t0 = time.monotonic()
        status, body = self.call(f"/v2/models/{quoted}/infer", json.dumps(request).encode())
        seconds = time.monotonic() - t0
        if status != 200:
            return False, seconds, f"HTTP {status} {body[:300].decode('utf-8', 'replace')}"
        try:
            problems = shape_problems(cfg, json.loads(body).get("outputs") or [])
        except ValueError:
            problems = ["the answer is not JSON"]
        return (not problems), seconds, "; ".join(problems)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(metric: str, labels: dict, v: float) -> str:
    inner = ",".join(f'{k}="{_escape(str(val))}"' for k, val in sorted(labels.items()))
    num = str(int(v)) if float(v).is_integer() else repr(float(v))
    return f"{metric}{{{inner}}} {num}" if inner else f"{metric} {num}"


HELP = {
    S.PROBE_UP: ("gauge", "1 when Triton answered its repository index on this port, 0 when not."),
    S.PROBE_MODELS: ("gauge", "Models the last round probed on this port (those Triton reports READY)."),
    S.PROBE_SUCCESS: ("gauge", "1 when the model's last probe inference succeeded (HTTP 200, outputs as configured)."),
    S.PROBE_LATENCY: ("gauge", "Seconds the model's last probe inference took."),
    S.PROBE_FAILURES: ("gauge", "Probe inferences of the model that failed in a row, up to now."),
    S.PROBE_LAST_SUCCESS: ("gauge", "When the model last answered a probe (seconds since the epoch)."),
}


class Prober:
    def __init__(self, instances: list[tuple[str, str]], key_file: str, timeout: float):
        self.instances, self.key_file, self.timeout = instances, key_file, timeout
        self.failures: dict[tuple[str, str], int] = {}
        self.last_ok: dict[tuple[str, str], float] = {}
        self.said: dict[tuple[str, str], str] = {}

    def key(self) -> str:
        try:
            with open(self.key_file) as f:
                return f.read().strip()
        except OSError:
            return ""  # no key file: Triton's APIs are not restricted on this host

    def round(self) -> str:
        """Probe every READY model of every instance once; the textfile's text."""
        key = self.key()
        rows: dict[str, list[str]] = {m: [] for m in HELP}
        seen = set()
        for port, url in self.instances:
            triton = Triton(url, key, self.timeout)
            try:
                models = triton.ready_models()
                up = 1
            except (OSError, ValueError, http.client.HTTPException) as e:
                self._say((port, ""), f"Triton on port {port} does not answer its repository index: {e}")
                models, up = [], 0
            rows[S.PROBE_UP].append(_sample(S.PROBE_UP, {"triton_port": port}, up))
            rows[S.PROBE_MODELS].append(_sample(S.PROBE_MODELS, {"triton_port": port}, len(models)))
            for m in models:
                k = (port, m)
                seen.add(k)
                try:
                    ok, seconds, why = triton.probe(m)
                except (OSError, ValueError, http.client.HTTPException) as e:
                    ok, seconds, why = False, 0.0, f"no answer ({type(e).__name__}: {e})"
                labels = {"triton_port": port, "model": m}
                if ok:
                    self.failures[k] = 0
                    self.last_ok[k] = time.time()
                else:
                    self.failures[k] = self.failures.get(k, 0) + 1
                self._say(k, "" if ok else f"{m} on port {port}: probe inference failed: {why}")
                rows[S.PROBE_SUCCESS].append(_sample(S.PROBE_SUCCESS, labels, 1 if ok else 0))
                rows[S.PROBE_LATENCY].append(_sample(S.PROBE_LATENCY, labels, round(seconds, 4)))
                rows[S.PROBE_FAILURES].append(_sample(S.PROBE_FAILURES, labels, self.failures[k]))
                if k in self.last_ok:
                    rows[S.PROBE_LAST_SUCCESS].append(_sample(S.PROBE_LAST_SUCCESS, labels, round(self.last_ok[k], 3)))
        for k in [k for k in self.failures if k not in seen]:  # models gone: their series go too
            del self.failures[k]
            self.last_ok.pop(k, None)
        out = []
        for metric, lines in rows.items():
            if lines:
                kind, text = HELP[metric]
                out += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}", *lines]
        return "\n".join(out) + "\n"

    def _say(self, k: tuple[str, str], text: str) -> None:
        """Log a failure once, and that it is over (not every round)."""
        before = self.said.get(k, "")
        if text and text != before:
            say(text)
        elif not text and before:
            say(f"{k[1] or 'Triton'} on port {k[0]}: answers again")
        self.said[k] = text


def write_atomically(directory: str, name: str, text: str) -> None:
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(directory, name))


def say(text: str) -> None:
    print(f"tritonfleet-inference-probe: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="One real inference per model on an interval, as textfile metrics")
    p.add_argument("--textfile-dir", required=True, help="the node exporter's --collector.textfile.directory")
    p.add_argument(
        "--triton",
        action="append",
        required=True,
        metavar="PORT=URL",
        help="a Triton instance: its HTTP port (the label) and base URL, e.g. 8000=http://127.0.0.1:8000",
    )
    p.add_argument("--key-file", default="", help="the host's key for Triton's restricted APIs")
    p.add_argument("--interval", type=float, default=5.0, help="seconds from one round to the next")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds each request may take")
    p.add_argument("--once", action="store_true", help="one round, then exit")
    args = p.parse_args(argv)
    instances = []
    for item in args.triton:
        port, sep, url = item.partition("=")
        if not sep or not port.isdigit() or not url.startswith("http"):
            p.error(f"--triton {item!r}: expected PORT=URL")
        instances.append((port, url))
    if args.interval <= 0 or args.timeout <= 0:
        p.error("--interval and --timeout must be > 0")
    if not os.path.isdir(args.textfile_dir):
        p.error(f"--textfile-dir {args.textfile_dir} is not a directory")
    prober = Prober(instances, args.key_file, args.timeout)
    while True:
        t0 = time.monotonic()
        text = prober.round()
        try:
            write_atomically(args.textfile_dir, TEXTFILE, text)
        except OSError as e:
            say(f"cannot write {os.path.join(args.textfile_dir, TEXTFILE)}: {e}")
        if args.once:
            return 0
        try:
            time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
