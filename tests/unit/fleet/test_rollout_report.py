"""The rollout's table (tritonfleet.fleet.rollout.report): a long reason is never lost to the
column's width (newcomer-2 #32: the DETAIL column was cut at `...; rol`, the full reason only in
the journal)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tritonfleet.fleet.rollout.report import DETAIL_WIDTH, HostResult, Report, table


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
