"""LocalTriton: the real tritonserver of the nvidia-pytriton wheel, started and stopped here."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from tritonfleet_testbed import localtriton
from tritonfleet_testbed.localtriton import (
    LocalTriton,
    TritonNotFound,
    TritonStartError,
    find_tritonserver,
)

SOURCE = Path(__file__).resolve().parents[2] / "corpus"
NO_LOOPBACK_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http(url: str, body: dict | None = None) -> tuple[int, dict | str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with NO_LOOPBACK_PROXY.open(req, timeout=10) as r:
        text = r.read().decode()
        return r.status, (json.loads(text) if text.startswith("{") else text)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _backend_dir(triton: LocalTriton) -> Path:
    (arg,) = [a for a in triton.command() if a.startswith("--backend-directory=")]
    return Path(arg.split("=", 1)[1])


def _regions(prefix: str) -> list[Path]:
    return sorted(localtriton.SHM_DIR.glob(f"{prefix}*"))


def test_find_tritonserver():
    install = find_tritonserver()
    assert install.binary.is_file() and os.access(install.binary, os.X_OK)
    assert (install.backends / "python" / "libtriton_python.so").is_file()
    assert install.stubs.name == "triton_python_backend_stub" and install.stubs.is_file()
    assert any(install.libs.glob("libtritonserver*.so*"))
    assert any(install.python_libdir.glob("libpython3*.so*"))


def test_find_tritonserver_without_the_wheel_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pytriton" else real(name, *a))
    with pytest.raises(TritonNotFound, match=r"pip install --no-deps nvidia-pytriton==0\.7\.0"):
        find_tritonserver()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A copy of tests/corpus: serving a repository writes __pycache__/ into it."""
    copy = tmp_path_factory.mktemp("corpus") / "corpus"
    shutil.copytree(SOURCE, copy, symlinks=True)
    return copy


@pytest.fixture(scope="module")
def server(corpus):
    with LocalTriton(corpus / "good/python") as triton:
        yield triton


def test_ready_on_loopback_ports(server):
    assert server.ready and server.returncode is None
    ports = {server.http_port, server.grpc_port, server.metrics_port}
    assert len(ports) == 3 and all(_listening(p) for p in ports)
    assert server.http_url == f"http://127.0.0.1:{server.http_port}"
    assert server.grpc_url == f"127.0.0.1:{server.grpc_port}"
    assert server.metrics_url == f"http://127.0.0.1:{server.metrics_port}/metrics"
    assert _http(f"{server.http_url}/v2/health/ready")[0] == 200
    assert server.model_ready("identity") and not server.model_ready("nosuch")
    cmd = server.command()
    assert "--strict-model-config=true" in cmd and "--exit-on-error=true" in cmd
    assert all(f"--{k}-address=127.0.0.1" in cmd for k in ("http", "grpc", "metrics"))
    assert "Started HTTPService at 127.0.0.1:" in server.log


def test_infer_and_metrics(server):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    status, answer = _http(f"{server.http_url}/v2/models/identity/infer", body)
    assert status == 200
    assert answer["outputs"][0]["name"] == "OUTPUT0" and answer["outputs"][0]["data"] == [1, 2, 3, 4]
    text = server.metrics()
    line = next(ln for ln in text.splitlines()
                if ln.startswith('nv_inference_request_success{model="identity",version="1"}'))
    assert float(line.rsplit(" ", 1)[1]) >= 1


def test_stop_ends_the_server_and_cleans_up(corpus):
    triton = LocalTriton(corpus / "good/python")
    with triton:
        pid, port, prefix = triton.pid, triton.http_port, triton.shm_prefix
        tmp = _backend_dir(triton).parent
        assert _alive(pid) and _regions(prefix) and tmp.is_dir()
    assert triton.returncode == 0 and not triton.ready
    assert not _alive(pid) and not _listening(port)
    assert not _regions(prefix) and not tmp.exists()
    assert "successfully unloaded 'identity'" in triton.log  # the log outlives the server
    assert triton.stop() == 0  # idempotent


def test_refused_repository_exits_1(corpus):
    triton = LocalTriton(corpus / "bad/name-mismatch", require_ready=False)
    with triton:
        assert not triton.ready
        assert triton.wait_exit(30) == 1
    assert "failed to load all models" in triton.log
    assert "directory name must equal model name" in triton.log


def test_require_ready_raises_with_the_log(corpus):
    with pytest.raises(TritonStartError, match="exited with status 1") as err:
        with LocalTriton(corpus / "bad/preferred-over-max"):
            pass
    assert "preferred size must be <= max batch size" in err.value.log


def test_without_exit_on_error_the_good_models_serve(corpus, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(corpus / "good/python", repo)
    shutil.copytree(corpus / "bad/negative-max-batch/identity", repo / "broken")
    with LocalTriton(repo, exit_on_error=False, extra_args=["--strict-readiness=false"]) as triton:
        assert triton.ready and triton.returncode is None
        assert triton.model_ready("identity") and not triton.model_ready("broken")


def test_explicit_model_control_loads_nothing_by_itself(corpus):
    with LocalTriton(corpus / "good/python", model_control_mode="explicit") as triton:
        assert triton.ready and not triton.model_ready("identity")
        assert "--model-control-mode=explicit" in triton.command()
    with LocalTriton(corpus / "good/python", model_control_mode="explicit",
                     extra_args=["--load-model=identity"]) as triton:
        assert triton.model_ready("identity")


def test_stalled_load_is_not_ready_and_leaves_nothing_behind(corpus):
    """A python stub that dies while loading leaves tritonserver 2.51 waiting forever."""
    started = time.monotonic()
    triton = LocalTriton(corpus / "bad/no-model-file", require_ready=False)
    with triton:
        assert not triton.ready and triton.stalled() and triton.returncode is None
        assert time.monotonic() - started < 20
        pid, prefix = triton.pid, triton.shm_prefix
        assert _regions(prefix)
    assert triton.returncode is not None and not _alive(pid)
    assert not _regions(prefix)


def test_a_server_ignoring_sigterm_is_killed_after_the_bound(corpus, monkeypatch):
    monkeypatch.setattr(LocalTriton, "command",
                        lambda self: ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"])
    triton = LocalTriton(corpus / "good/python", require_ready=False, ready_timeout=0.5, stop_timeout=0.5)
    started = time.monotonic()
    with triton:
        assert not triton.ready and triton.returncode is None
        pid = triton.pid
    assert triton.returncode == -9 and not _alive(pid)
    assert time.monotonic() - started < 5


def test_python_based_backend_is_installed(corpus):
    from tritonfleet_testbed.standin_images import backend_model_py

    with LocalTriton(corpus / "good/onnx", python_based_backends={"onnxruntime": backend_model_py()}) as t:
        assert t.model_ready("identity")
        backend = _backend_dir(t)
        assert (backend / "onnxruntime/model.py").read_text() == backend_model_py().read_text()
        assert (backend / "python/triton_python_backend_stub").is_file()


def test_missing_repository():
    with pytest.raises(FileNotFoundError):
        LocalTriton(SOURCE / "nonexistent").start()
