"""The warm inference gate: "ready" is not "serves".

A model can report ready and still fail its first inference (triton-inference-server/server#7014:
not-ready while an explicit load runs; #7588: ``/v2/health/ready`` stays 200 after an unload), and
the first requests after a load are the slow ones. After the health gate's endpoints pass, each
model gets one real inference, batch 1, with inputs built from its config.pbtxt (the one the deploy
sent: the control machine's rendered repository, so the restricted model-config API is not needed):
every input that is not optional, its data type, its dims with -1 as 1, a leading batch dimension
of 1 when ``max_batch_size`` > 0, zeros (empty strings for BYTES). The answer must be HTTP 200 and
every output the config declares must come back with a shape that fits its dims (the batch
dimension 1, -1 anything). A failure fails the host with Triton's own answer.

Not warmed (said in the log): sequence models (they need a correlation id and a start flag) and a
model without a config.pbtxt in the repository. Triton's own ``model_warmup`` in a model's
config.pbtxt runs requests inside the server while the model loads, before it reports ready: the way
to pre-warm a model (the validator checks the files it names).
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from . import triton_http

# ModelConfig.DataType -> the KServe v2 datatype of the HTTP/REST protocol
DATATYPES = {1: "BOOL", 2: "UINT8", 3: "UINT16", 4: "UINT32", 5: "UINT64", 6: "INT8", 7: "INT16", 8: "INT32",
             9: "INT64", 10: "FP16", 11: "FP32", 12: "FP64", 13: "BYTES", 14: "BF16"}


class Repeated(list):
    """``[value] * n`` that knows it is one value repeated (``encode`` writes it in one go). A
    list like any other for everything else (equal to the plain list, written as one); made by
    request_for and only read after that (``encode`` checks its length is still ``n``)."""

    def __init__(self, value: object, n: int):
        super().__init__([value] * n)
        self.value, self.n = value, n


def request_for(cfg) -> dict | None:
    """The inference request body (batch 1, zeros) for ``cfg``; None when the model cannot be warmed
    this way (sequence batching)."""
    if cfg.HasField("sequence_batching"):
        return None
    batch = cfg.max_batch_size > 0
    inputs = []
    for i in cfg.input:
        if i.optional:
            continue
        dtype = DATATYPES.get(i.data_type)
        if dtype is None:
            return None
        shape = ([1] if batch else []) + [d if d > 0 else 1 for d in i.dims]
        n = math.prod(shape)
        value: object = "" if dtype == "BYTES" else (False if dtype == "BOOL" else 0)
        inputs.append({"name": i.name, "shape": shape, "datatype": dtype, "data": Repeated(value, n)})
    return {"inputs": inputs}


def shape_problems(cfg, outputs: list[dict]) -> list[str]:
    """Declared outputs missing from the answer, or with a shape that does not fit their dims."""
    got = {o.get("name"): list(o.get("shape") or []) for o in outputs}
    batch = cfg.max_batch_size > 0
    out = []
    for o in cfg.output:
        if o.name not in got:
            out.append(f"output {o.name!r} missing")
            continue
        dims = list(o.reshape.shape) if o.HasField("reshape") else list(o.dims)
        want = ([1] if batch else []) + dims
        have = got[o.name]
        if len(have) != len(want) or any(w not in (-1, h) for w, h in zip(want, have, strict=True)):
            out.append(f"output {o.name!r} has shape {have}, its config says {want}")
    return out


@dataclass
class WarmResult:
    ok: bool
    latency_ms: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    model: str = ""      # the model that failed
    answer: str = ""     # Triton's answer to it
    cause: str = ""


def prepared(repo: Path, model: str):
    """(config, request body as bytes) for ``model`` in ``repo``: parsed and encoded once per
    config file, not once per host (a 224x224x3 image input is 150,528 numbers). Body None: not
    warmed this way (request_for); config None: no config.pbtxt. The bytes are what requests'
    ``json=`` sends (``encode``)."""
    path = Path(repo) / model / "config.pbtxt"
    try:
        st = path.stat()
    except OSError:
        return None, None
    return _prepared(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _prepared(path: str, _mtime_ns: int, _size: int):
    from ..model_repo.validate import parse_config

    cfg = parse_config(Path(path).read_text())
    body = request_for(cfg)
    return cfg, (None if body is None else encode(body))


def encode(body: dict) -> bytes:
    """``json.dumps(body, allow_nan=False).encode()`` byte for byte, faster for request_for's
    bodies: an input's data is one value repeated (``Repeated``), so it is encoded once and
    repeated (150,528 zeros: 2 ms instead of 13-17 ms, which a one-host run pays once). Anything
    else goes through json.dumps. tests/unit/serving/test_warmup.py compares the two on generated
    bodies."""
    inputs = body.get("inputs") if list(body) == ["inputs"] else None
    if not isinstance(inputs, list):
        return json.dumps(body, allow_nan=False).encode("utf-8")
    parts = []
    for i in inputs:
        data = i.get("data") if isinstance(i, dict) else None
        if not (type(data) is Repeated and len(data) == data.n > 0 and list(i)[-1] == "data" and len(i) > 1):
            return json.dumps(body, allow_nan=False).encode("utf-8")
        head = json.dumps({k: v for k, v in i.items() if k != "data"}, allow_nan=False)
        value = json.dumps(data.value, allow_nan=False)
        parts.append(head[:-1] + ', "data": [' + ", ".join([value] * len(data)) + "]}")
    return ('{"inputs": [' + ", ".join(parts) + "]}").encode("utf-8")


def warm(http_url: str, repo: Path, models: list[str], timeout: float = 30.0, session=None) -> WarmResult:
    """One inference per model in ``models``; stops at the first that fails."""
    res = WarmResult(True)
    s = session or triton_http.session()
    for m in models:
        cfg, body = prepared(repo, m)
        if cfg is None:
            res.skipped[m] = "no config.pbtxt in the repository"
            continue
        if body is None:
            res.skipped[m] = "sequence model (needs a correlation id)"
            continue
        t0 = time.monotonic()
        try:
            r = s.post(f"{http_url}/v2/models/{m}/infer", data=body, timeout=timeout,
                       headers={"Content-Type": "application/json"})
        except requests.RequestException as e:
            return WarmResult(False, res.latency_ms, res.skipped, m, f"no answer ({type(e).__name__}: {e})",
                              "no answer to its first inference")
        ms = (time.monotonic() - t0) * 1000
        text = r.text.strip().replace("\n", " ")[:500]
        if r.status_code != 200:
            return WarmResult(False, res.latency_ms, res.skipped, m, f"HTTP {r.status_code} {text}",
                              "its first inference failed")
        try:
            problems = shape_problems(cfg, r.json().get("outputs") or [])
        except ValueError:
            problems = ["the answer is not JSON"]
        if problems:
            return WarmResult(False, res.latency_ms, res.skipped, m, "; ".join(problems), "its first inference "
                              "answered outputs that do not fit its config")
        res.latency_ms[m] = round(ms, 1)
    return res
