"""Run the real tritonserver of the nvidia-pytriton wheel for tests (loopback only).

Two ways, both with the Python-based onnxruntime backend of tritonfleet_testbed:

* ``local_server(repo)``: the wheel's binary on this machine, with this interpreter's
  Python (the stub's embedded interpreter finds its site-packages through the ``python3``
  first on PATH, so the virtual environment's numpy and onnxruntime are the ones used);
* ``chroot_server(root, repo)``: the tritonserver of an extracted stand-in image, started
  the way ``docker run <image> tritonserver ...`` starts it (the image's Env, Entrypoint and
  WorkingDir), in a chroot with its own mount namespace for /proc, /dev and /dev/shm.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonfleet_testbed import standin_images as images
from tritonfleet_testbed.localtriton import serves
from tritonfleet_testbed.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = REPO_ROOT / "files" / "model_repository"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"


def parse_config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def cpu_config(text: str) -> str:
    """``text`` (a config.pbtxt) with every instance group on KIND_CPU and no gpus."""
    config = parse_config(text)
    for group in config.instance_group:
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
        group.ClearField("gpus")
    return text_format.MessageToString(config)


def copy_repository(dest: Path, *, kind_cpu: bool) -> Path:
    """Copy files/model_repository to ``dest``, with KIND_CPU instance groups if asked."""
    shutil.copytree(MODEL_REPOSITORY, dest)
    if kind_cpu:
        for cfg in dest.glob("*/config.pbtxt"):
            cfg.write_text(cpu_config(cfg.read_text()))
    return dest


def backend_directory(dest: Path) -> Path:
    """A --backend-directory: backends/python (for this Python) and backends/onnxruntime."""
    server = images.pytriton_server_dir()
    python = dest / "python"
    python.mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(server / "backends/python" / name, python / name)
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy2(
        server / "python_backend_stubs" / ver / "triton_python_backend_stub",
        python / "triton_python_backend_stub",
    )
    (dest / "onnxruntime").mkdir()
    shutil.copy2(images.backend_model_py(), dest / "onnxruntime" / "model.py")
    return dest


def port_flags(http: int, grpc: int, metrics: int) -> list[str]:
    return [
        f"--http-port={http}",
        "--http-address=127.0.0.1",
        f"--grpc-port={grpc}",
        "--grpc-address=127.0.0.1",
        f"--metrics-port={metrics}",
        "--metrics-address=127.0.0.1",
    ]


class Server:
    """A started tritonserver process; ``url`` is host:port of its HTTP endpoint."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, ports: tuple[int, int, int]):
        self.http_port, self.grpc_port, self.metrics_port = ports
        self.url = f"127.0.0.1:{self.http_port}"
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _get(self, path: str, port: int | None = None) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{port or self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException):
            return 0, b""  # HTTPException: another server's gRPC answers on the port

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited with {self.proc.returncode}:\n{self.log()}"
                )
            if serves(self.log(), "HTTPService", self.http_port) and self._get("/v2/health/ready")[0] == 200:
                return
            time.sleep(0.25)
        raise TimeoutError(f"tritonserver not ready after {timeout}s:\n{self.log()}")

    def wait_exit(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def model_ready(self, name: str) -> bool:
        return self._get(f"/v2/models/{name}/ready")[0] == 200

    def metrics(self) -> dict[str, float]:
        """Prometheus samples, ``'name{labels}'`` -> value."""
        status, body = self._get("/metrics", self.metrics_port)
        assert status == 200, status
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def infer_at_once(self, model: str, requests: list[list]) -> list:
        """Send every request (a list of tritonclient.http InferInput) at the same moment.

        The bodies are serialized first (tritonclient's own request encoding) and posted from
        one thread and connection each, released together, so they reach the server within
        a dynamic batcher's queue delay. Returns tritonclient InferResult objects, in order.
        """
        bodies = [httpclient.InferenceServerClient.generate_request_body(r) for r in requests]
        barrier = threading.Barrier(len(bodies))

        def send(item):
            body, json_size = item
            conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=120)
            try:
                conn.connect()
                barrier.wait(60)
                headers = {"Content-Type": "application/octet-stream"}
                if json_size is not None:
                    headers["Inference-Header-Content-Length"] = str(json_size)
                conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{model}: HTTP {resp.status}: {data[:500]!r}")
                size = resp.getheader("Inference-Header-Content-Length")
                return httpclient.InferenceServerClient.parse_response_body(
                    data, header_length=int(size) if size else None
                )
            finally:
                conn.close()

        with ThreadPoolExecutor(len(bodies)) as pool:
            return list(pool.map(send, bodies))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                # the server's own group (stubs included), by its id
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def _running(server: Server, wait: bool) -> Iterator[Server]:
    try:
        if wait:
            server.wait_ready()
        yield server
    finally:
        server.stop()


def local_server(
    repo: Path, work: Path, *, wait: bool = True
) -> contextlib.AbstractContextManager[Server]:
    """The wheel's tritonserver on ``repo`` (strict config, loopback ports)."""
    backends = backend_directory(work / "backends")
    libdirs = [str(images.pytriton_libs_dir()), sysconfig.get_config_var("LIBDIR")]
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": ":".join(libdirs + [os.environ.get("LD_LIBRARY_PATH", "")]).rstrip(":"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    ports = (free_port(), free_port(), free_port())
    cmd = [
        str(images.pytriton_server_dir() / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        "--strict-model-config=true",
        f"--backend-directory={backends}",
        *port_flags(*ports),
    ]
    return _running(Server(cmd, env, work / "tritonserver.log", ports), wait)


def container_command(root: Path, workdir: str, argv: list[str]) -> list[str]:
    """``argv`` run in ``root`` as in a container: own mount namespace with /proc, /dev and
    a tmpfs /dev/shm (gone when the process ends), cwd ``workdir``, PIDs unchanged (exec)."""
    script = (
        'set -e; R="$1"; W="$2"; shift 2; '
        'mount -t proc proc "$R/proc"; '
        'mount --rbind /dev "$R/dev"; '
        'mount -t tmpfs -o size=512m tmpfs "$R/dev/shm"; '
        f'exec {CHROOT} "$R" /bin/sh -c \'cd "$0" && exec "$@"\' "$W" "$@"'
    )
    cmd = [UNSHARE, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh"]
    return cmd + [str(root), workdir, *argv]


def image_env(config: dict) -> dict[str, str]:
    return dict(e.split("=", 1) for e in config.get("Env", []))


def chroot_server(
    root: Path, config: dict, args: list[str], log: Path, *, wait: bool = True
) -> contextlib.AbstractContextManager[Server]:
    """Run ``args`` in the image root ``root`` like ``docker run <image> args...`` would.

    ``config`` is the image's container config (Env, Entrypoint, WorkingDir). Ports are
    chosen here and appended as flags.
    """
    ports = (free_port(), free_port(), free_port())
    argv = list(config.get("Entrypoint") or []) + list(args) + port_flags(*ports)
    cmd = container_command(root, config.get("WorkingDir") or "/", argv)
    return _running(Server(cmd, image_env(config), log, ports), wait)


def infer_json(server: Server, model: str) -> dict:
    """The model's metadata (``GET /v2/models/<model>``)."""
    status, body = server._get(f"/v2/models/{model}")
    assert status == 200, (status, body)
    return json.loads(body)
