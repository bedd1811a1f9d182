"""The unit template compiled once across runs, each run an interpreter of its own, and a bad
cache costing only a compile (the unit's rendering: tests/unit/serving/test_unit.py).
"""

from __future__ import annotations

from tests.unit.serving.test_unit import BASE, COMPILED
from tritonfleet.serving.unit import render_unit


def test_the_unit_template_is_compiled_once_across_runs_and_a_bad_cache_costs_only_a_compile(tmp_path):
    """jinja2's bytecode cache in the control machine's cache directory: a second run (a new
    process) compiles nothing and renders the same unit; an unreadable entry or a cache directory
    that cannot be written renders the same unit, compiled."""
    import json
    import os
    import subprocess
    import sys

    def run(cache):
        env = {**os.environ, "TRITONFLEET_LOCAL_CACHE": str(cache)}
        res = subprocess.run([sys.executable, "-c", COMPILED, json.dumps(BASE)], capture_output=True, text=True,
                             env=env, timeout=60)
        assert res.returncode == 0, res.stderr[-2000:]
        return json.loads(res.stdout)

    want = render_unit(BASE)
    assert run(tmp_path / "c") == [want, 1]
    assert run(tmp_path / "c") == [want, 0]
    from jinja2.bccache import bc_magic

    for f in (tmp_path / "c" / "jinja").iterdir():  # jinja2's header, then no checksum, no code
        f.write_bytes(bc_magic + b"\x00garbage")
    assert run(tmp_path / "c") == [want, 1]
    assert run(tmp_path / "c") == [want, 0]  # written anew
    for f in (tmp_path / "c" / "jinja").iterdir():  # its code cut in the middle
        f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
    assert run(tmp_path / "c") == [want, 1]
    assert run(tmp_path / "c") == [want, 0]
    (tmp_path / "file").write_text("not a directory")
    assert run(tmp_path / "file") == [want, 1]
