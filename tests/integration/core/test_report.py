"""The failure report against the real tritonserver: a model failing at initialize, twice, gives
the report its own words (the report's parts and rules: tests/unit/core/test_report.py).
"""

from __future__ import annotations

from tests.unit.core.test_report import watch_text
from tritonfleet.serving import unit_watch


def test_the_real_tritonserver_failing_at_initialize_twice(tmp_path):
    """Differential: the real tritonserver's own log of a python model whose initialize raises,
    started twice as systemd would, read the way the gate reads the unit's journal."""
    from tests.support.testbed import BROKEN_INIT_ERROR, add_model_failing_at_initialize
    from tests.support.tritonproc import local_server

    repo = add_model_failing_at_initialize(tmp_path / "repo")
    logs = []
    for i in range(2):
        with local_server(repo, tmp_path / f"run{i}", wait=False) as srv:
            assert srv.wait_exit(120) != 0
            logs.append(srv.log().splitlines())
    show = {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": 1, "InvocationID": "b"}
    snap = unit_watch.parse_watch(watch_text(show, [("a", logs[0]), ("b", logs[1])]))
    # after the first start alone (the second one still running), nothing is definitive
    first = unit_watch.parse_watch(watch_text({**show, "ActiveState": "active", "SubState": "running"},
                                          [("a", logs[0]), ("b", [])]))
    assert unit_watch.assess(first) is None
    verdict = unit_watch.assess(snap)
    assert verdict is not None
    assert "same error on two consecutive starts" in verdict.cause
    assert f"failed to load 'broken_init' version 1: Internal: RuntimeError: {BROKEN_INIT_ERROR}" in verdict.cause
    assert "\\n" not in verdict.cause
    # Triton's words on real lines: the error, then its Python traceback
    assert any("failed to load 'broken_init'" in w for w in verdict.words)
    assert "At:" in verdict.words and any(w.strip().endswith("model.py(3): initialize") for w in verdict.words)
    assert not any("\\n" in w for w in verdict.words)
