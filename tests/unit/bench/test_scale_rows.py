"""bench/scale.py's verdict on a `status --json` row: the whole JSON is read (a 500-host answer is
over a megabyte), and a FAILED row says which hosts were not as asked, and why."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tritonfleet import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
import scale  # noqa: E402


def _rows(n: int, drift_at: int | None = None, unreachable_at: int | None = None) -> str:
    rows = [{"host": f"fake-{i:04d}", "reachable": i != unreachable_at, "error": "timed out" if i == unreachable_at else "",
             "drift": ["models unknown: no answer"] if i == drift_at else [], "padding": "x" * 2000} for i in range(n)]
    return json.dumps(rows)


def test_a_large_status_answer_is_read_whole():
    out = _rows(500, drift_at=7)
    assert len(out) > 1_000_000
    assert scale._all_reachable(out, 500)
    assert not scale._all_reachable(_rows(500, unreachable_at=3), 500)
    assert not scale._all_reachable(out, 501)


def test_a_failed_status_row_names_the_hosts_and_why():
    said = scale._status_drift(_rows(20, drift_at=7, unreachable_at=3))
    assert said.startswith("2 host(s) not as asked:")
    assert "fake-0003: unreachable timed out" in said and "fake-0007: ['models unknown: no answer']" in said
    assert scale._status_drift(_rows(5)) == ""
    assert scale._status_drift("not json") == "(no JSON on stdout) "

