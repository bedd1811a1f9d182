"""The one speed switch (tritonfleet.core.speed): ``TRITONFLEET_SPEED=off`` turns every
speed-only feature off, so pyinfra's own paths, plain jinja2, json.dumps and no caches run; the
same answers either way."""

from __future__ import annotations

import importlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet.core import local_cache, speed
from tritonfleet.pyinfra_ext import compat, probes


@pytest.fixture
def off(monkeypatch):
    monkeypatch.setenv(speed.ENV, "off")


def test_every_speed_only_pyinfra_patch_is_in_the_table():
    """compat's speed-only features (off when pyinfra changed) are all switched by the one switch."""
    assert {f for f, (kind, _) in compat.FEATURES.items() if kind == compat.SPEED} <= set(speed.FEATURES)
    with pytest.raises(KeyError):
        speed.on("no such feature")


@pytest.mark.parametrize("value", ["off", "OFF", " 0", "no", "false"])
def test_the_switch_turns_every_feature_off(monkeypatch, value):
    monkeypatch.setenv(speed.ENV, value)
    assert not any(speed.on(name) for name in speed.FEATURES)


@pytest.mark.parametrize("value", [None, "", "on", "1"])
def test_the_features_are_on_unless_switched_off(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(speed.ENV, raising=False)
    else:
        monkeypatch.setenv(speed.ENV, value)
    assert all(speed.on(name) for name in speed.FEATURES)


def test_install_leaves_every_speed_patch_off(off, monkeypatch):
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    from tritonfleet.pyinfra_ext import argcache, connection, hostlock, oporder, quick_exit
    from tritonfleet.pyinfra_ext import install as pyinfra_patches

    calls, exits = [], []
    monkeypatch.setattr(hostlock, "enabled", lambda: True)
    monkeypatch.setattr(hostlock, "acquire_all", lambda wait=True: calls.append(wait))
    monkeypatch.setattr(hostlock, "gate_host_io", lambda: calls.append("gate"))
    monkeypatch.setattr(quick_exit, "install", lambda: exits.append("quick_exit"))
    monkeypatch.setitem(connection._idle_poll, "on", True)
    state = State()
    state.callback_handlers = []
    try:
        with ctx_state.use(state):
            pyinfra_patches.install()
        assert importlib.import_module("pyinfra.api.arguments").all_global_arguments is argcache._original
        assert importlib.import_module("pyinfra.api.operation").get_operation_order_from_stack is not \
            oporder._fast_order
        assert connection._idle_poll["on"] is False
        assert calls == [True]  # install() waits for the locks itself: pyinfra's Host left alone
        assert exits == []
    finally:
        oporder.uninstall()
        argcache.uninstall()


def test_the_local_cache_is_neither_read_nor_written(off, tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    monkeypatch.delenv(speed.ENV)
    local_cache.write(path, "remembered")
    assert local_cache.read(path) == "remembered"
    monkeypatch.setenv(speed.ENV, "off")
    assert local_cache.read(path) is None
    local_cache.write(tmp_path / "y.json", "new")
    assert not (tmp_path / "y.json").exists()


def test_the_unit_template_has_no_bytecode_cache_when_off(off, monkeypatch):
    from tritonfleet.serving import unit

    unit._templates.cache_clear()
    try:
        assert unit._templates().bytecode_cache is None
        monkeypatch.delenv(speed.ENV)
        unit._templates.cache_clear()
        assert unit._templates().bytecode_cache is not None
    finally:
        unit._templates.cache_clear()


def test_a_changed_jinja2_bytecode_format_turns_the_cache_off(monkeypatch):
    import jinja2.bccache

    from tritonfleet.serving import unit

    assert probes.jinja_bytecode_format(jinja2.bccache.Bucket) == ""

    class Changed(jinja2.bccache.Bucket):
        def write_bytecode(self, f):
            f.write(jinja2.bccache.bc_magic + json.dumps(self.checksum).encode())  # JSON, not pickle

    assert "checksum" in probes.jinja_bytecode_format(Changed)
    monkeypatch.setattr(jinja2.bccache, "Bucket", Changed)
    monkeypatch.delenv(speed.ENV, raising=False)
    res = compat.check({"jinja_bytecode"})
    assert [m.internal.feature for m in res.mismatches] == ["jinja_bytecode"] and res.off == {"jinja_bytecode"}
    assert not unit._bytecode_usable()


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       value=st.sampled_from([0, "", False]), name=st.text(min_size=1, max_size=8))
def test_the_warm_body_is_the_same_bytes_with_the_switch_off(shape, value, name):
    import math
    import os

    from tritonfleet.serving import warmup

    body = {"inputs": [{"name": name, "shape": shape, "datatype": "FP32",
                        "data": warmup.Repeated(value, math.prod(shape))}]}
    before = os.environ.pop(speed.ENV, None)
    try:
        fast = warmup.encode(body)
        os.environ[speed.ENV] = "off"
        plain = warmup.encode(body)
    finally:
        os.environ.pop(speed.ENV, None)
        if before is not None:
            os.environ[speed.ENV] = before
    assert fast == plain == json.dumps(body, allow_nan=False).encode()


def test_the_warm_body_goes_through_json_dumps_when_off(off):
    """A Repeated whose remembered value is not its contents: only the fast path would write it."""
    from tritonfleet.serving import warmup

    data = warmup.Repeated(0, 3)
    data.value = 1
    assert warmup.encode({"inputs": [{"name": "x", "shape": [3], "datatype": "INT32", "data": data}]}) == \
        b'{"inputs": [{"name": "x", "shape": [3], "datatype": "INT32", "data": [0, 0, 0]}]}'


def test_a_remembered_verdict_is_not_used_when_off(off, tmp_path, monkeypatch):
    from tritonfleet.model_repo import render, validate, verdicts

    monkeypatch.setattr(render, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(verdicts, "_key", lambda repo, gpus: "k")
    (tmp_path / "validated").mkdir()
    (tmp_path / "validated" / "k").write_text("remembered\n")
    monkeypatch.setattr(validate, "validate_repository", lambda repo, gpus=None: ["a problem"])
    assert verdicts.validate_repository(tmp_path / "repo") == ["a problem"]
    monkeypatch.delenv(speed.ENV)
    assert verdicts.validate_repository(tmp_path / "repo") == []


def test_the_lock_processes_are_forked_by_popen_when_off(off):
    """The holder's process (stdin a pipe, stdout and stderr to this process) and the heartbeat
    process (inheriting its pipe ends), the plain way: the same lines, the same exit status."""
    import os
    import select
    import subprocess

    from tritonfleet.pyinfra_ext import children

    read, write = os.pipe()
    try:
        child = children.Child(["sh", "-c", "read x; echo got $x; echo said >&2; exit 3"], stdin=read)
    finally:
        os.close(read)
    assert isinstance(child._popen, subprocess.Popen)
    os.write(write, b"hi\n")
    os.close(write)
    assert child.stdout.readline() == b"got hi\n"
    assert child.wait(10) == 3 and child.poll() == 3 and child.stderr.read() == b"said\n"
    child.close()

    beat_r, beat_w = os.pipe()
    beater = children.start_beater([beat_w], 1)
    try:
        assert isinstance(beater._popen, subprocess.Popen)
        assert select.select([beat_r], [], [], 15)[0] and os.read(beat_r, 1) == b"\n"  # its first beat
        assert beater.poll() is None
    finally:
        beater.kill()
        beater.wait(10)
        os.close(beat_r)
    assert beater.returncode == -9
