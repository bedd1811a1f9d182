"""What a host holds of the model repository: its releases, the live one, and each release's
manifest (the layout: tritonfleet.model_repo.release). Each reads, never fails hard."""

from __future__ import annotations

import json

from pyinfra.api import FactBase

from ..core.shell import q
from .release import parse_state, state_command


class ReleaseState(FactBase):
    """The live model release, the complete ones, and the live release's files whose size or
    mtime differ from the stat record taken when it completed (tritonfleet.model_repo.release). Reads no
    file: a no-op run costs one `find` of the live release."""

    @staticmethod
    def default():
        return {"current": None, "releases": [], "verified": False, "drift": [], "incoming": []}

    def command(self, base: str) -> str:
        return state_command(base)

    def process(self, output):
        return parse_state(output)


class ReleaseManifest(FactBase):
    """The manifest (path -> [size, sha256]) a release was built from ({} if none)."""

    default = dict

    def command(self, base: str, release: str) -> str:
        return f"cat {q(base)}/releases/{q(release)}/.tritonfleet-release 2>/dev/null || true"

    def process(self, output):
        try:
            return json.loads("\n".join(output)).get("files", {})
        except ValueError:
            return {}
