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


def test_serving_helpers_answer_for_an_inventory_host_without_pyinfra_state():
    """The registry login and the repository API's calls are worked out from a ``FleetHost`` (the
    fleet commands' host) as from the host being deployed: no pyinfra State or current host."""
    from pyinfra.context import ctx_host, ctx_state

    from tritonfleet.serving import images, repository_api
    from tritonfleet.settings.defaults import DEFAULTS

    fh = FleetHost("h1", ["t4"], {**DEFAULTS, "triton_image": "nvcr.io/nvidia/tritonserver:25.01-py3",
                                  "registry_user": "ci", "triton_http_port": 8100, "triton_base_dir": "/srv/triton",
                                  "triton_http_bind": "10.0.0.7"})
    with ctx_state.use(None), ctx_host.use(None):
        assert not ctx_state.isset() and not ctx_host.isset()
        assert images.login_registry(fh) == "nvcr.io"
        assert images.needs_login(fh, "nvcr.io/nvidia/tritonserver:25.01-py3")
        assert not images.needs_login(fh, "docker.io/library/busybox")
        assert images.login_registry(FleetHost("h2", ["t4"], {**fh.data, "registry_host": "r.example"})) == "r.example"
        cmd = repository_api.repository_api_commands(fh, ["m"], ["old"])
    assert "http://10.0.0.7:8100/v2/repository/models/old/unload" in cmd
    assert "find /srv/triton/model_repository/m -type d -exec touch -c {} + && " in cmd
    assert cmd.index("/old/unload") < cmd.index("/m/load")
