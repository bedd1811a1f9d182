"""The speed switch against the replay oracle: the no-op deploy on the fake fleet
(bench/fakefleet.json, no testbed host) with the speed-only features on and with
``TRITONFLEET_SPEED=off`` sends the same commands, byte for byte, every one of them answered by the
recording."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tritonfleet import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
import scale  # noqa: E402


def test_the_no_op_deploy_sends_the_same_with_the_speed_switch_on_and_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONFLEET_LOCAL_CACHE", str(tmp_path / "cache"))  # the runs' own caches
    monkeypatch.delenv("TRITONFLEET_SPEED", raising=False)
    if "TRITONFLEET_TESTBED" not in os.environ:  # the fake hosts' loopback block, 127.<100 + n>.x.y: one
        # no other fake fleet here takes (the no-op deploy alone: the testbed CLI takes 0-9)
        monkeypatch.setenv("TRITONFLEET_TESTBED", "141")
    sent = {}
    for speed in (True, False, True):  # on a second time: read back what the first run cached
        out = tmp_path / f"{speed}-{len(sent)}"
        received = scale.WORK / f"test-speed-switch-{len(sent)}.jsonl"  # bench/.work: its log names it
        rc = scale.replay_check(1, received, checks=("no-op deploy",), commands=out,
                                speed=speed)
        assert rc == 0, f"the no-op deploy with the speed switch {'on' if speed else 'off'} sent a command " \
                        "the recording has no answer for, or failed (its log above)"
        sent[out.name] = (out / "no-op-deploy.commands").read_text()
    texts = list(sent.values())
    # the deploy lock, the one batched read of a converged host, the health gate's requests
    assert texts[0].count("\tssh ") >= 2 and texts[0].count("\thttp ") >= 5, texts[0]
    assert texts[0] == texts[1] == texts[2]
