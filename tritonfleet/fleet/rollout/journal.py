"""The rollout's journal: what it did, one JSON line a step, on disk before it acts on it, so
``tritonfleet rollout --resume`` can go on (or roll back) after the control process died."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .plan import RolloutError


def log_dir() -> Path:
    base = Path(os.environ.get("TRITONFLEET_LOG_DIR", ".tritonfleet/rollouts"))
    d = base / time.strftime("%Y%m%d-%H%M%S")
    if d.exists():  # two rollouts started in the same second: each keeps its own directory
        d = base / f"{d.name}-{os.getpid()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


JOURNAL = "journal.jsonl"


class Journal:
    """What a rollout did, as it goes: one JSON object a line, each written and flushed to disk
    before the rollout acts on it (``start``: the plan and its parameters; ``before``: what every
    host served; ``batch``: a batch started, with its pyinfra's pid; ``batch-done``: its results
    and rollbacks; ``end``). ``tritonfleet rollout --resume`` reads it after a crash."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "time": time.time(), **fields}, sort_keys=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def events(self) -> list[dict]:
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                break  # a line torn by the crash: what came before it is the record
        return out


def latest_journal(base: Path | None = None) -> Path:
    """The newest rollout journal that has no end (a rollout that died)."""
    base = base or Path(os.environ.get("TRITONFLEET_LOG_DIR", ".tritonfleet/rollouts"))
    journals = sorted(base.glob(f"*/{JOURNAL}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for j in journals:
        if not any(e["event"] == "end" for e in Journal(j).events()):
            return j
    raise RolloutError(f"no unfinished rollout under {base}/ (every journal there has an end): nothing to resume")
