"""The deploy history on each host: ``<triton_base_dir>/history.jsonl``, one healthy deployment
(release, image, unit digest, who, when) a line, the newest ``HISTORY_KEEP`` of them, and a
snapshot of each one's unit in ``<triton_base_dir>/units/``. What a rollback returns to, kept on
the host itself.

``append_record`` adds a record after the health gate passed (deploy and rollback alike); the fact
``tritonfleet.serving.facts.DeployHistory`` reads the file back, and ``tritonfleet status`` shows
its last line.
"""

from __future__ import annotations

import getpass
import json
import re
import socket

from pyinfra import host
from pyinfra.api import operation
from pyinfra.context import state

from ... import __version__
from ...core.report import HOST_RECORD as FAILURE_RECORD
from ...core.shell import q
from ...pyinfra_ext import memo
from ...settings import access
from ..facts import DeployHistory
from ..health import WARM_LATENCY
from ..unit import unit_path

# Healthy deployments remembered on each host for rollback.
HISTORY_KEEP = 20

RECORD_SCRIPT = """\
set -e
mkdir -p {b}/units
{snapshot}
id=$(docker image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null || true)
printf '%s\\n' {record} | sed "s/@TIME@/$(date -u +%Y-%m-%dT%H:%M:%SZ)/; s/@IMAGE_ID@/$id/" >> {b}/history.jsonl
tail -n {keep} {b}/history.jsonl > {b}/history.jsonl.tmp
mv {b}/history.jsonl.tmp {b}/history.jsonl
for f in {b}/units/*.service; do grep -qF "$(basename "$f" .service)" {b}/history.jsonl || rm -f "$f"; done
rm -f {failure}
"""


def append_record(
    base: str, release: str, unit: str, image: str, action: str, unit_files: list[str] | None = None
) -> None:
    """Record the deployment (``release``, ``unit`` digest, ``image``) the host now serves
    healthily, unless it is the last one recorded already. ``action``: "deploy" or "rollback".
    ``unit_files``: the per-GPU units (triton_per_gpu), snapshot one after the other."""
    facts = memo.fact(DeployHistory, base=base)
    history = facts["records"]
    last = history[-1] if history else {}
    if (last.get("release"), last.get("unit"), last.get("image")) == (release, unit, image):
        host.noop(f"deployment {release} / {image} already recorded")
        return
    record = {
        "time": "@TIME@",
        "action": action,
        "release": release,
        "image": image,
        "image_id": "@IMAGE_ID@",
        "unit": unit,
        "by": _operator(),
        "tritonfleet": __version__,
    }
    record_healthy(
        name=f"record healthy deployment (release {release}, {image})",
        base=base,
        unit=unit,
        image=image,
        record=record,
        **({"unit_files": unit_files} if unit_files else {}),
    )


@operation(is_idempotent=False)
def record_healthy(base: str, unit: str, image: str, record: dict, unit_files: list[str] | None = None):
    """Append ``record`` to the host's history; when it runs, with the times of the first inferences the
    health gate just sent (``first_inference_ms``, tritonfleet.serving.warmup).

    + base: the Triton base directory on the host
    + unit: the unit's path
    + image: the image reference
    + record: the deployment's record (release, image, unit digest)
    + unit_files: the units' paths with one Triton per GPU

    Changes: ``<base>/history.jsonl`` and the unit's snapshot in ``<base>/units/``.

    Tunables: none.

    **Example:**

    .. code:: python

        record_healthy(name="record the healthy deployment", base=base, unit=path, image=image, record=rec)
    """
    warm = WARM_LATENCY.get(host.name) if state.is_executing else None
    yield record_command(base, unit, image, {**record, **({"first_inference_ms": warm} if warm else {})}, unit_files)


def record_command(base: str, unit: str, image: str, record: dict, unit_files: list[str] | None = None) -> str:
    unit_file = q(f"{base}/units/{unit}.service")
    snapshot = (
        f"cat {' '.join(q(f) for f in unit_files)} > {unit_file} && chmod 644 {unit_file}"
        if unit_files
        else f"install -m 644 {q(unit_path(access.current()))} {unit_file}"
    )
    return RECORD_SCRIPT.format(
        b=q(base),
        snapshot=snapshot,
        unit_file=unit_file,
        image=q(image),
        record=q(json.dumps(record, sort_keys=True)),
        keep=HISTORY_KEEP,
        failure=FAILURE_RECORD,
    )


def _operator() -> str:
    try:
        who = f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):  # no user name (no passwd entry, no LOGNAME) is no reason to fail a deploy
        who = "unknown"
    return re.sub(r"[^A-Za-z0-9@._-]", "_", who)
