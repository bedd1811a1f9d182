"""A converged host's pre-flight and warm plans parse nothing the second time: the plan run twice in
interpreters of their own (the verdicts' rules: tests/unit/model_repo/test_verdicts.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.unit.model_repo.test_verdicts import NO_OP
from tritonfleet import ROOT
from tritonfleet.model_repo import render as models


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    r = tmp_path / "repo"
    shutil.copytree(ROOT / "files" / "model_repository", r)
    return r


def test_a_converged_hosts_pre_flight_and_warm_plans_parse_nothing_the_second_time(repo, tmp_path):
    """What pre-flight and the warm gate derive from the configs, in a new process each time (as
    every run is): the second imports neither protobuf's parser nor the validator, and gets the
    same answers."""
    env = {**__import__("os").environ, "TRITONFLEET_LOCAL_CACHE": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", NO_OP, str(repo)], capture_output=True, text=True, env=env,
                           timeout=120) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    first, second = (r.stdout.splitlines() for r in runs)
    assert "google.protobuf.text_format" in first[0] and "tritonfleet.model_repo.validate" in first[0]
    assert second[0] == "[]", second[0]
    assert second[1] == first[1]
    # entries that are not what was remembered (JSON of another shape, no JSON): derived again
    for kind, junk in (("warm", "[]"), ("plans", "[]"), ("overrides", ""), ("warm", "{not json")):
        for f in (tmp_path / "cache" / kind).iterdir():
            f.write_text(junk)
        again = subprocess.run([sys.executable, "-c", NO_OP, str(repo)], capture_output=True, text=True, env=env,
                               timeout=120)
        assert again.returncode == 0, again.stderr[-2000:]
        assert again.stdout.splitlines()[1] == first[1], kind
