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

from ..core import local_cache, speed
from ..model_repo import render
from ..model_repo.derived import remembered_key
from . import triton_http

# ModelConfig.DataType -> the KServe v2 datatype of the HTTP/REST protocol
DATATYPES = {
    1: "BOOL",
    2: "UINT8",
    3: "UINT16",
    4: "UINT32",
    5: "UINT64",
    6: "INT8",
    7: "INT16",
    8: "INT32",
    9: "INT64",
    10: "FP16",
    11: "FP32",
    12: "FP64",
    13: "BYTES",
    14: "BF16",
}


class Repeated(list):
    """``[value] * n`` that knows it is one value repeated (``encode`` writes it in one go). A
    list like any other for everything else (equal to the plain list, written as one); made by
    request_for and only read after that (``encode`` checks its length is still ``n``)."""

    def __init__(self, value: object, n: int):
        super().__init__([value] * n)
        self.value, self.n = value, n


def plan_for(cfg) -> dict:
    """What the warm gate reads of a config (a ModelConfig), as JSON: ``batch`` (max_batch_size >
    0), ``inputs`` (each input that is not optional: name, shape with the batch dimension and -1
    as 1, KServe data type; None when the model cannot be warmed this way: sequence batching, a
    data type without a KServe name) and ``outputs`` (name, dims after a reshape). Remembered on
    disk per config text (:func:`prepared`): the gate of a converged host parses nothing."""
    batch = cfg.max_batch_size > 0
    inputs: list | None = None if cfg.HasField("sequence_batching") else []
    for i in cfg.input if inputs is not None else []:
        if i.optional:
            continue
        dtype = DATATYPES.get(i.data_type)
        if dtype is None:
            inputs = None
            break
        inputs.append([i.name, ([1] if batch else []) + [d if d > 0 else 1 for d in i.dims], dtype])
    outputs = [[o.name, list(o.reshape.shape) if o.HasField("reshape") else list(o.dims)] for o in cfg.output]
    return {"batch": batch, "inputs": inputs, "outputs": outputs}


def request_from(plan: dict) -> dict | None:
    """The inference request body (batch 1, zeros) of a :func:`plan_for`; None when the model
    cannot be warmed this way."""
    if plan["inputs"] is None:
        return None
    inputs = []
    for name, shape, dtype in plan["inputs"]:
        value: object = "" if dtype == "BYTES" else (False if dtype == "BOOL" else 0)
        inputs.append({"name": name, "shape": shape, "datatype": dtype, "data": Repeated(value, math.prod(shape))})
    return {"inputs": inputs}


def request_for(cfg) -> dict | None:
    """The inference request body (batch 1, zeros) for ``cfg``; None when the model cannot be warmed
    this way (sequence batching)."""
    return request_from(plan_for(cfg))


def problems_in(plan: dict, outputs: list[dict]) -> list[str]:
    """Declared outputs (of a :func:`plan_for`) missing from the answer, or with a shape that does
    not fit their dims."""
    got = {o.get("name"): list(o.get("shape") or []) for o in outputs}
    out = []
    for name, dims in plan["outputs"]:
        if name not in got:
            out.append(f"output {name!r} missing")
            continue
        want = ([1] if plan["batch"] else []) + dims
        have = got[name]
        if len(have) != len(want) or any(w not in (-1, h) for w, h in zip(want, have, strict=True)):
            out.append(f"output {name!r} has shape {have}, its config says {want}")
    return out


def shape_problems(cfg, outputs: list[dict]) -> list[str]:
    """Declared outputs missing from the answer, or with a shape that does not fit their dims."""
    return problems_in(plan_for(cfg), outputs)


@dataclass
class WarmResult:
    ok: bool
    latency_ms: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    model: str = ""  # the model that failed
    answer: str = ""  # Triton's answer to it
    cause: str = ""


def prepared(repo: Path, model: str):
    """(the config's :func:`plan_for`, request body as bytes) for ``model`` in ``repo``: read and
    encoded once per config file, not once per host (a 224x224x3 image input is 150,528 numbers),
    the plan parsed once per config text on this machine (remembered as verdicts are,
    tritonfleet.model_repo.verdicts). Body None: not warmed this way (request_for); plan None: no
    config.pbtxt. The bytes are what requests' ``json=`` sends (``encode``)."""
    path = Path(repo) / model / "config.pbtxt"
    try:
        st = path.stat()
    except OSError:
        return None, None
    return _prepared(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _prepared(path: str, _mtime_ns: int, _size: int):
    text = Path(path).read_text()
    where = render.CACHE_DIR / "warm" / f"{remembered_key('warm', text, Path(__file__).read_bytes())}.json"
    remembered = local_cache.read(where)
    plan = None if remembered is None else json.loads(remembered)
    if plan is None:
        from ..model_repo.validate import parse_config

        plan = plan_for(parse_config(text))
        local_cache.write(where, json.dumps(plan))
    body = request_from(plan)
    return plan, (None if body is None else encode(body))


def encode(body: dict) -> bytes:
    """``json.dumps(body, allow_nan=False).encode()`` byte for byte, faster for request_for's
    bodies: an input's data is one value repeated (``Repeated``), so it is encoded once and
    repeated (speed-only ``json_repeated``: docs/scale.md, "Speed-only features"). Anything else,
    or everything with the speed switch off, goes through json.dumps.
    tests/unit/serving/test_warmup.py compares the two on generated bodies."""
    inputs = body.get("inputs") if list(body) == ["inputs"] and speed.on("json_repeated") else None
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
        plan, body = prepared(repo, m)
        if plan is None:
            res.skipped[m] = "no config.pbtxt in the repository"
            continue
        if body is None:
            res.skipped[m] = "sequence model (needs a correlation id)"
            continue
        t0 = time.monotonic()
        try:
            r = s.post(
                f"{http_url}/v2/models/{m}/infer",
                data=body,
                timeout=timeout,
                headers={"Content-Type": "application/json"},
            )
        except requests.RequestException as e:
            return WarmResult(
                False,
                res.latency_ms,
                res.skipped,
                m,
                f"no answer ({type(e).__name__}: {e})",
                "no answer to its first inference",
            )
        ms = (time.monotonic() - t0) * 1000
        text = r.text.strip().replace("\n", " ")[:500]
        if r.status_code != 200:
            return WarmResult(
                False, res.latency_ms, res.skipped, m, f"HTTP {r.status_code} {text}", "its first inference failed"
            )
        try:
            problems = problems_in(plan, r.json().get("outputs") or [])
        except ValueError:
            problems = ["the answer is not JSON"]
        if problems:
            return WarmResult(
                False,
                res.latency_ms,
                res.skipped,
                m,
                "; ".join(problems),
                "its first inference answered outputs that do not fit its config",
            )
        res.latency_ms[m] = round(ms, 1)
    return res
