"""The rollout's table (tritonfleet.fleet.rollout.report): a long reason is never lost to the
column's width (newcomer-2 #32: the DETAIL column was cut at `...; rol`, the full reason only in
the journal); the one ending of the push and pull rollouts (``finish``, ``exit_status``)."""

from __future__ import annotations

import ast
import time

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_structure import ROOT
from tritonfleet.fleet.rollout.journal import Journal
from tritonfleet.fleet.rollout.report import (
    DETAIL_WIDTH,
    HostResult,
    Report,
    exit_status,
    finish,
    table,
)


@given(detail=st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs", "Zl", "Zp"]), max_size=400))
def test_every_detail_is_printed_whole(detail):
    rep = Report("inv", "deploys/triton.py", [["h1", "h2"]],
                 [HostResult("h1", 1, "rollback failed", 2.0, "a", "b", detail), HostResult("h2", 1, "updated")])
    out = table(rep)
    assert detail in out
    row = next(line for line in out.splitlines() if line.startswith("h1 "))
    assert len(row) < 200  # the row stays a row
    if len(detail) > DETAIL_WIDTH:
        assert row.endswith("... (below)") and f"h1: {detail}" in out.splitlines()


def test_the_ending_fills_in_times_the_halt_and_closes_the_journal(tmp_path):
    rep = Report("inv", "deploys/triton.py", [["h1"], ["h2", "h3"]],
                 [HostResult("h1", 1, "failed", 2.0, "v1", "v1", "gate"), HostResult("h2", before="v1"),
                  HostResult("h3", None, "unreachable", before="?")])
    rep.halted = "1 failure(s), more than --max-fail 0: halted after canary; 2 host(s) not touched"
    journal, said, order = Journal(tmp_path / "journal.jsonl"), [], []

    def wind_down(report):
        order.append(("wind down", len(journal.path.read_text().splitlines()) if journal.path.exists() else 0))

    out = finish(rep, journal, time.monotonic() - 3.0, said.append, wind_down, results={"h1": {"x": 1}})
    assert out is rep and rep.seconds >= 3.0
    assert [(r.host, r.after) for r in rep.hosts] == [("h1", "v1"), ("h2", "v1"), ("h3", "-")]
    assert said == [f"HALTED: {rep.halted}"]
    assert order == [("wind down", 0)]  # before the journal's end: --resume still sees it unfinished
    (end,) = journal.events()
    assert (end["event"], end["ok"], end["halted"], end["results"]) == ("end", False, rep.halted, {"h1": {"x": 1}})
    assert exit_status(rep) == 1 and exit_status(rep, plan_only=True) == 1


def test_exit_status_of_a_plan_and_of_a_clean_rollout():
    clean = Report("inv", "d.py", [["h1"]], [HostResult("h1", 1, "unchanged")])
    planned = Report("inv", "d.py", [["h1"]], [HostResult("h1")])
    assert exit_status(clean) == 0 and exit_status(planned) == 1 and exit_status(planned, plan_only=True) == 0


def test_push_and_pull_rollouts_end_through_the_one_finish():
    """Neither rollout writes its own journal ``end`` or HALTED line (the pull rollout repeated the
    push rollout's ending once); both call ``finish``; both commands take ``exit_status``."""
    for rel in ("tritonfleet/fleet/rollout/engine.py", "tritonfleet/fleet/pull/rollout.py"):
        text = (ROOT / rel).read_text()
        calls = {ast.unparse(n.func) for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)}
        assert "finish" in calls, rel
        assert 'write("end"' not in text and "HALTED" not in text and ".seconds = time.monotonic()" not in text, rel
    for rel in ("tritonfleet/cli/fleet.py", "tritonfleet/cli/bootstrap.py"):
        text = (ROOT / rel).read_text()
        assert "sys.exit(exit_status(report" in text and "report.ok" not in text, rel
