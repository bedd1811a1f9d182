"""One settings accessor (tritonfleet.settings.access.Settings), passed explicitly: what reads
tunables takes a ``settings`` from its caller, never a bare ``get`` callable nor a default that
reaches for pyinfra's current host on its own; the current host, an inventory host, a per-GPU
instance and a plain mapping all answer ``settings.get(key)``."""

from __future__ import annotations

import ast

import pytest

from tritonfleet import ROOT
from tritonfleet.inventory.roster import FleetHost
from tritonfleet.serving import per_gpu
from tritonfleet.settings import access


def _functions():
    for p in sorted((ROOT / "tritonfleet").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield p.relative_to(ROOT).as_posix(), node


def test_tunables_are_read_through_an_explicit_settings():
    found = []
    for rel, fn in _functions():
        args = fn.args.args + fn.args.kwonlyargs
        defaults = dict(zip([a.arg for a in fn.args.args][len(fn.args.args) - len(fn.args.defaults):],
                            fn.args.defaults, strict=True))
        for a in args:
            if a.arg == "get":
                found.append(f"{rel}:{fn.lineno}: {fn.name}(get): take a Settings named settings")
            if a.arg == "settings" and a.arg in defaults:
                found.append(f"{rel}:{fn.lineno}: {fn.name}(settings=...): the caller passes it")
        if fn.name == "tunable":
            found.append(f"{rel}:{fn.lineno}: tunable(): an inventory host is a Settings (fh.get)")
    assert not found, "\n".join(found)


def test_every_kind_of_settings_answers_get(monkeypatch):
    data = {"triton_service": "triton", "triton_container_name": "triton-server", "triton_http_port": 8000,
            "triton_grpc_port": 8001, "triton_metrics_port": 8002, "triton_per_gpu_port_step": 10}
    fh = FleetHost("h1", ["t4"], dict(data))
    for settings in (data, fh):
        one = per_gpu.instance_get(settings, 2)
        assert isinstance(one, access.Overlay)
        assert (one.get("triton_service"), one.get("triton_http_port"), one.get("triton_gpus")) == \
            ("triton-gpu2", 8020, "device=2")
        assert one.get("triton_container_name") == "triton-server-gpu2"
        assert one.get("no_such_setting", "fallback") == "fallback"

    class Host:  # pyinfra's current host, as access.get reads it
        name = "h1"
        data = {"triton_http_port": 9000}

    monkeypatch.setattr(access, "host", Host())
    current = access.current()
    assert current.get("triton_http_port") == 9000
    assert current.get("triton_metrics_port") == 8002  # the package's default
    assert current.get("not_a_tunable", None) is None
    with pytest.raises(access.ConfigError, match="h1: 'not_a_tunable' is not set and is no tunable"):
        current.get("not_a_tunable")
