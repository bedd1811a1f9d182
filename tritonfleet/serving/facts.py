"""What a host runs of Triton: the image IDs Docker has, the Triton container, the per-GPU units,
and the deploy history (the healthy deployments a rollback returns to). Each reads, never fails
hard."""

from __future__ import annotations

import json

from pyinfra.api import FactBase

from ..core.report import HOST_RECORD as FAILURE_RECORD
from ..core.shell import q
from .per_gpu import list_units_command


class PerGpuUnits(FactBase):
    """The per-GPU Triton unit files on the host (tritonfleet.serving.per_gpu): the file names of
    ``<service>-gpu<N>.service`` in /etc/systemd/system, by index ([] when there are none)."""

    default = list

    def command(self, service: str) -> str:
        return list_units_command({"triton_service": service})

    def process(self, output):
        return [line.strip() for line in output if line.strip()]


class DockerImageId(FactBase):
    """The local image ID of a tag (None when the image or docker is missing)."""

    def command(self, image: str) -> str:
        return f"docker image inspect --format '{{{{.Id}}}}' {q(image)} 2>/dev/null || true"

    def process(self, output):
        for line in output:
            if line.startswith("sha256:"):
                return line.strip()
        return None


class TritonContainer(FactBase):
    """What the Triton container runs now, to find a run that stopped between changing the host
    and restarting Triton: ``{"running", "image_id", "started", "unit_mtime", "link_mtime"}``
    (times in seconds since the epoch, fractional; the link's own mtime is when the live model
    release was last switched). ``running`` False when there is no such container."""

    @staticmethod
    def default():
        return {"running": False, "image_id": None, "started": 0.0, "unit_mtime": 0.0, "link_mtime": 0.0}

    def command(self, container: str, unit: str, link: str) -> str:
        return (
            f"s=$(docker inspect --format '{{{{.State.Running}}}} {{{{.Image}}}} {{{{.State.StartedAt}}}}' "
            f'{q(container)} 2>/dev/null) && set -- $s && echo "running=$1" && echo "image=$2" && '
            'echo "started=$(date -d "$3" +%s.%N)"; '
            f"find {q(unit)} {q(link)} -maxdepth 0 -printf '%p=%T@\\n' 2>/dev/null; true"
        )

    def process(self, output):
        out = self.default()
        for line in output:
            key, _, value = line.strip().rpartition("=")
            try:
                if key == "running":
                    out["running"] = value == "true"
                elif key == "image":
                    out["image_id"] = value if value.startswith("sha256:") else None
                elif key == "started":
                    out["started"] = float(value)
                elif key.endswith(".service"):
                    out["unit_mtime"] = float(value)
                elif key:
                    out["link_mtime"] = float(value)
            except ValueError:
                continue
        return out


class DeployHistory(FactBase):
    """The host's record of healthy deployments (oldest first), the unit snapshots it keeps, and
    whether the report of a failed run is left on it (tritonfleet.core.report.HOST_RECORD):
    ``{"records": [{release, image, unit, time, action, ...}], "units": [digest, ...], "failure": bool}``."""

    @staticmethod
    def default():
        return {"records": [], "units": [], "failure": False}

    def command(self, base: str) -> str:
        b = q(base)
        return (
            f"cat {b}/history.jsonl 2>/dev/null; "
            f'for f in {b}/units/*.service; do [ -f "$f" ] && echo "unit=$(basename "$f" .service)"; '
            f"done 2>/dev/null; [ -e {FAILURE_RECORD} ] && echo failure-recorded; true"
        )

    def process(self, output):
        records, units, failure = [], [], False
        for line in output:
            line = line.strip()
            if line == "failure-recorded":
                failure = True
                continue
            if line.startswith("unit="):
                units.append(line[5:])
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn line from an interrupted write is not a record
            if isinstance(rec, dict) and rec.get("release"):
                records.append(rec)
        return {"records": records, "units": sorted(units), "failure": failure}
