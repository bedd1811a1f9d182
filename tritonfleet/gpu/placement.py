"""How many GPUs a host should have, and where model instances go on them.

Pure helpers shared by the GPU verification, the model repository rendering and the read side
(``tritonfleet status``):

* the host's GPU record (``/var/lib/tritonfleet/gpus``): the GPUs the first verified run found,
  one ``index, pci.bus_id, uuid, name`` line each (nvidia-smi's csv). It is what a later run
  compares with, so a GPU that fell off the bus after a reboot is named by index, bus id and UUID;
* ``count_problems``: the GPUs a host reports against ``gpu_count`` (or the record);
* ``place``: the instance-group placement policy applied to a config.pbtxt for a host with N GPUs.
"""

from __future__ import annotations

import re

from ..settings.access import Settings
from ..settings.table import whole_number

#: the GPUs the first verified run found, next to the GPU check's stamp (steps/verify.py)
RECORD = "/var/lib/tritonfleet/gpus"
RECORD_FIELDS = ("index", "pci.bus_id", "uuid", "name")
#: instance-group placement policies (gpu_placement, gpu_placement_models)
POLICIES = ("spread", "as-written")


def _attr(gpu, key: str):
    if isinstance(gpu, dict):
        return gpu.get(key)
    return getattr(gpu, key, None)


def record_lines(gpus) -> list[str]:
    """The record's lines for ``gpus`` (Gpu objects or dicts with index, pci_bus_id, uuid, name)."""
    return [
        f"{_attr(g, 'index')}, {_attr(g, 'pci_bus_id') or '-'}, {_attr(g, 'uuid') or '-'}, {_attr(g, 'name') or '-'}"
        for g in gpus
    ]


def parse_record(lines) -> list[dict]:
    """The record's GPUs: [{index, pci_bus_id, uuid, name}]; lines that are not a GPU are skipped."""
    out = []
    for line in lines or []:
        parts = [p.strip() for p in str(line).split(",", 3)]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        index, bus, uuid, name = parts
        out.append(
            {
                "index": int(index),
                "pci_bus_id": None if bus == "-" else bus,
                "uuid": None if uuid == "-" else uuid,
                "name": name,
            }
        )
    return out


def expected_count(gpu_count, recorded: list[dict]) -> int | None:
    """How many GPUs the host should report: ``gpu_count`` when set, else as many as the record
    holds (None: nothing expected yet, the first verified run records what it finds)."""
    if gpu_count not in (None, ""):
        return whole_number(gpu_count, "gpu_count", "inventory or group data")
    return len(recorded) if recorded else None


def describe(gpu) -> str:
    """'GPU 3 (bus 00000000:00:1E.0, GPU-..., Tesla T4)'."""
    extra = [x for x in (_attr(gpu, "pci_bus_id"), _attr(gpu, "uuid"), _attr(gpu, "name")) if x]
    return f"GPU {_attr(gpu, 'index')}" + (f" ({', '.join(extra)})" if extra else "")


def missing_gpus(found, recorded: list[dict], expected: int) -> list[dict]:
    """The GPUs the host should have but does not report: recorded ones whose UUID (else bus id)
    is not among ``found``; without a record, the indexes below ``expected`` it lacks."""
    if recorded:
        have_uuid = {_attr(g, "uuid") for g in found if _attr(g, "uuid")}
        have_bus = {_attr(g, "pci_bus_id") for g in found if _attr(g, "pci_bus_id")}
        gone = [
            r
            for r in recorded
            if not ((r["uuid"] and r["uuid"] in have_uuid) or (not r["uuid"] and r["pci_bus_id"] in have_bus))
        ]
        if gone:
            return gone
    have = {_attr(g, "index") for g in found}
    return [{"index": i, "pci_bus_id": None, "uuid": None, "name": None} for i in range(expected) if i not in have][
        : max(0, expected - len(list(found)))
    ]


def count_problems(
    where: str, found, expected: int | None, recorded: list[dict], source: str = "gpu_count"
) -> list[str]:
    """Why the GPUs ``found`` (Gpu objects or dicts) fall short of ``expected``: fewer GPUs (the
    missing ones named by index, bus id and UUID), or a recorded GPU reported as another model.
    [] when all is well (more GPUs than expected is well: the record grows)."""
    found = list(found or [])
    errors = []
    if expected is not None and len(found) < expected:
        gone = missing_gpus(found, recorded, expected)
        errors.append(
            f"{where}: reports {len(found)} GPU(s), expected {expected} ({source}); missing: "
            + ("; ".join(describe(g) for g in gone) if gone else "?")
        )
    by_uuid = {r["uuid"]: r for r in recorded if r.get("uuid")}
    for g in found:
        rec = by_uuid.get(_attr(g, "uuid"))
        if rec and rec.get("name") and _attr(g, "name") and rec["name"] != _attr(g, "name"):
            errors.append(f"{where}: {describe(g)} was recorded as {rec['name']!r}")
    return errors


def record_update(found, recorded: list[dict]) -> list[str] | None:
    """The record's new lines after a passing check, or None to keep it: written when there is
    none, or when the host reports at least as many GPUs as it holds and other ones (a GPU added
    or replaced). Never shrunk by a passing check (a smaller gpu_count lets fewer pass)."""
    found = list(found or [])
    if not found:
        return None
    new = record_lines(found)
    if not recorded:
        return new
    if len(found) >= len(recorded) and new != record_lines(recorded):
        return new
    return None


def placement_count(gpu_count, recorded: list[dict], live: int | None) -> int:
    """The number of GPUs instances are placed on: ``gpu_count`` when set, else the record's,
    else what nvidia-smi reports now, else 1 (nothing known: the configs as written)."""
    n = expected_count(gpu_count, recorded)
    if n:
        return n
    return live if live and live > 0 else 1


def policy_for(model: str, default: str, per_model: dict | None) -> str:
    policy = (per_model or {}).get(model, default) or "spread"
    if policy not in POLICIES:
        raise ValueError(
            f"placement policy {policy!r} for model {model!r} is not one of {', '.join(POLICIES)} "
            "(gpu_placement, gpu_placement_models in group data)"
        )
    return policy


def place(config_text: str, gpus: int, policy: str = "spread") -> str:
    """``config_text`` (a config.pbtxt) placed on a host with ``gpus`` GPUs.

    ``spread``: every KIND_GPU instance group written as the article writes it, ``gpus: [ 0 ]``,
    lists every GPU the host has instead (Triton starts ``count`` instances on each GPU listed:
    the same count per GPU). Groups with another list, or none (Triton then uses every GPU it
    sees), and CPU groups stay as written. ``as-written``: the text as it is.
    The text is returned byte for byte when nothing changes (a one-GPU host always)."""
    if policy not in POLICIES:
        raise ValueError(f"placement policy {policy!r} is not one of {', '.join(POLICIES)}")
    if policy == "as-written" or gpus <= 1 or not re.search(r"\bgpus\b", config_text):
        return config_text
    from google.protobuf import text_format

    from ..core.triton_schema import model_config

    model_config_pb2 = model_config()  # the schema alone (not tritonclient.grpc's client)

    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(config_text, cfg)
    changed = False
    for group in cfg.instance_group:
        gpu_kind = group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        if gpu_kind and list(group.gpus) == [0]:
            del group.gpus[:]
            group.gpus.extend(range(gpus))
            changed = True
    return text_format.MessageToString(cfg) if changed else config_text


def per_gpu_enabled(settings: Settings) -> bool:
    """triton_per_gpu is on: True (or "true", "yes", "1" as `--data` may give it). With it each
    Triton instance sees one GPU (tritonfleet.serving.per_gpu, which calls this ``enabled``)."""
    value = settings.get("triton_per_gpu")
    return value is True or str(value).strip().lower() in ("true", "yes", "1")
