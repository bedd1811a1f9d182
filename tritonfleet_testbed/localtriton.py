"""Run the real tritonserver of the nvidia-pytriton wheel on this machine, on loopback ports.

The wheel (``pip install --no-deps nvidia-pytriton==0.7.0``) bundles a tritonserver 2.51
binary with its shared libraries and the Python backend only. :class:`LocalTriton` starts it
for one model repository and stops it again::

    with LocalTriton("files/model_repository") as triton:
        assert triton.ready
        requests.get(f"{triton.http_url}/v2/models/resnet50_onnx/ready")

The python backend's stub imports each ``model.py`` and so leaves ``__pycache__/`` in the
model's version directory (its embedded interpreter ignores PYTHONDONTWRITEBYTECODE): serve a
copy of a repository that must stay as it is. Everything else the server needs is laid out in a
temporary directory of its own: the backend directory
(``python/`` with the backend library, its utilities and the stub for the running Python, plus
any Python-based backends given) and the server's log. The server listens on 127.0.0.1 only,
on ports picked free just before the start. It is stopped by its process id: SIGTERM, then
SIGKILL of its own process group (the Python stubs included) after ``stop_timeout`` seconds.

API: :func:`find_tritonserver`, :class:`TritonInstall`, :class:`LocalTriton`,
:class:`TritonNotFound`, :class:`TritonStartError`.
"""

from __future__ import annotations

import http.client
import importlib.util
import itertools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonfleet_testbed.ports import free_port

__all__ = [
    "LocalTriton", "TritonInstall", "TritonNotFound", "TritonStartError", "find_tritonserver", "free_port",
    "serves",
]

INSTALL_HINT = "pip install --no-deps nvidia-pytriton==0.7.0"
LOOPBACK = "127.0.0.1"

# Lines after which the 2.51 server never becomes ready, yet does not exit either: a Python
# stub that died while its model loaded leaves the server waiting for it.
STALL_MARKERS = (
    "Failed to preinitialize Python stub",
    "terminate called after throwing",
)

# Read once, at import: sysconfig fills its variables lazily and not thread-safely, and
# servers are often started from several threads at once.
_PYTHON_LIBDIR = sysconfig.get_config_var("LIBDIR") or ""
_PYTHON_LDLIBRARY = sysconfig.get_config_var("LDLIBRARY") or ""

SHM_DIR = Path("/dev/shm")
_serial = itertools.count()

# Loopback requests never go through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class TritonNotFound(RuntimeError):
    """The tritonserver of the nvidia-pytriton wheel (or a piece it needs) is missing."""


class TritonStartError(RuntimeError):
    """tritonserver exited or did not become ready; ``log`` holds its output."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(f"{message}\n--- tritonserver log ---\n{log[-4000:]}")
        self.log = log


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of the bundled tritonserver are."""

    binary: Path  #: bin/tritonserver
    libs: Path  #: nvidia_pytriton.libs, the libraries the binary links against
    backends: Path  #: backends/ (python/libtriton_python.so, triton_python_backend_utils.py)
    stubs: Path  #: python_backend_stubs/<major.minor>/triton_python_backend_stub, for this Python
    python_libdir: Path  #: the directory holding libpython, which the stub embeds

    def library_path(self) -> str:
        return f"{self.libs}:{self.python_libdir}"


def find_tritonserver() -> TritonInstall:
    """The tritonserver bundled in the installed nvidia-pytriton wheel.

    Raises :class:`TritonNotFound`, naming what is missing and how to install it.
    """
    spec = importlib.util.find_spec("pytriton")  # locate only: importing pytriton needs its deps
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotFound(f"nvidia-pytriton is not installed; it bundles tritonserver: {INSTALL_HINT}")
    package = Path(list(spec.submodule_search_locations)[0])
    server = package / "tritonserver"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    libdir = Path(_PYTHON_LIBDIR)
    ldlibrary = _PYTHON_LDLIBRARY or f"libpython{ver}.so"
    install = TritonInstall(
        binary=server / "bin" / "tritonserver",
        libs=package.parent / "nvidia_pytriton.libs",
        backends=server / "backends",
        stubs=server / "python_backend_stubs" / ver / "triton_python_backend_stub",
        python_libdir=libdir,
    )
    needed = {
        "tritonserver binary": install.binary,
        "bundled libraries": install.libs,
        "python backend": install.backends / "python" / "libtriton_python.so",
        "python backend utilities": install.backends / "python" / "triton_python_backend_utils.py",
        f"python backend stub for Python {ver}": install.stubs,
    }
    for what, path in needed.items():
        if not path.exists():
            raise TritonNotFound(f"{what} not found at {path}; reinstall with: {INSTALL_HINT}")
    if not (libdir / ldlibrary).exists() and not any(libdir.glob(f"libpython{ver}*.so*")):
        raise TritonNotFound(
            f"no shared libpython{ver} in {libdir}: the python backend stub needs a Python built "
            "with --enable-shared"
        )
    return install


def serves(log: str, service: str, port: int) -> bool:
    """Whether a tritonserver's ``log`` says it serves ``service`` on loopback ``port`` (2.51
    logs ``Started HTTPService at 127.0.0.1:PORT``, ``Started Metrics Service at ...``): until
    then a probe of that port may reach whatever else holds it (tritonfleet_testbed/ports.py)."""
    return f"Started {service} at {LOOPBACK}:{port}" in log


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    """(HTTP status, body); status 0 when nothing answers."""
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        # HTTPException: something else answers on the port, e.g. another server's gRPC
        return 0, b""


class LocalTriton:
    """The bundled tritonserver serving ``model_repository`` on free loopback ports.

    Use as a context manager (``__enter__`` starts and waits, ``__exit__`` stops), or call
    :meth:`start` and :meth:`stop`. Once started:

    * ``ready``: whether /v2/health/ready answered 200 (and the metrics endpoint answers)
      before the process exited, its log showed a stalled load (:meth:`stalled`) or
      ``ready_timeout`` passed; with ``require_ready`` (the default) a server that does not
      get there raises :class:`TritonStartError` instead;
    * ``http_url`` (``http://127.0.0.1:PORT``), ``grpc_port``, ``grpc_url`` (``127.0.0.1:PORT``),
      ``metrics_url`` (``http://127.0.0.1:PORT/metrics``);
    * ``returncode``: None while it runs, its exit status once it has ended;
    * ``log``: everything the server wrote to stdout and stderr so far (kept after stop);
    * ``retried_logs``: the logs of starts given up because a port handed out as free was
      taken before the server bound it (it is then started again on new ports, up to 3 times).

    Options: ``strict_model_config`` (``--strict-model-config``), ``model_control_mode``
    (none, poll, explicit), ``exit_on_error`` (``--exit-on-error``: exit 1 when a model fails to
    load), ``extra_args`` (more tritonserver flags, appended last), ``python_based_backends``
    (backend name -> its ``model.py``, installed as ``<backend directory>/<name>/model.py``).
    """

    def __init__(
        self,
        model_repository: str | os.PathLike,
        *,
        strict_model_config: bool = True,
        model_control_mode: str | None = None,
        exit_on_error: bool = True,
        extra_args: Sequence[str] = (),
        python_based_backends: Mapping[str, str | os.PathLike] | None = None,
        ready_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        require_ready: bool = True,
        env: Mapping[str, str] | None = None,
    ):
        self.model_repository = Path(model_repository).resolve()
        self.strict_model_config = strict_model_config
        self.model_control_mode = model_control_mode
        self.exit_on_error = exit_on_error
        self.extra_args = list(extra_args)
        self.python_based_backends = dict(python_based_backends or {})
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.require_ready = require_ready
        self.env = dict(env or {})
        self.install = find_tritonserver()
        self.ready = False
        self.http_port = self.grpc_port = self.metrics_port = 0
        self._proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._log_path: Path | None = None
        self._log_text = ""
        self.retried_logs: list[str] = []  # the log of each start given up on a taken port
        # The python backend's shared-memory regions (/dev/shm/<prefix><uuid>) carry a prefix
        # of this server's own, so that what a killed or stalled server leaves is removed.
        self.shm_prefix = f"tritonfleet_{os.getpid()}_{next(_serial)}_"

    # ---- addresses -------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{LOOPBACK}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    @property
    def log(self) -> str:
        if self._log_path is not None and self._log_path.exists():
            self._log_text = self._log_path.read_text(errors="replace")
        return self._log_text

    # ---- what the server answers ---------------------------------------------------------------
    def model_ready(self, name: str, version: str = "") -> bool:
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/ready"
        return _get(self.http_url + path)[0] == 200

    def metrics(self) -> str:
        """The Prometheus text of the metrics endpoint ('' when it does not answer)."""
        status, body = _get(self.metrics_url)
        return body.decode(errors="replace") if status == 200 else ""

    # ---- lifecycle -------------------------------------------------------------------------
    def command(self) -> list[str]:
        """The tritonserver command line (valid once started: it names ports and the temp dir)."""
        assert self._tmp is not None, "not started"
        cmd = [
            str(self.install.binary),
            f"--model-repository={self.model_repository}",
            f"--strict-model-config={str(self.strict_model_config).lower()}",
            f"--exit-on-error={str(self.exit_on_error).lower()}",
            f"--backend-directory={Path(self._tmp.name) / 'backends'}",
            f"--http-address={LOOPBACK}",
            f"--http-port={self.http_port}",
            f"--grpc-address={LOOPBACK}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={LOOPBACK}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            "--exit-timeout-secs=5",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        if self.model_control_mode:
            cmd.append(f"--model-control-mode={self.model_control_mode}")
        return cmd + self.extra_args

    def _backend_directory(self, dest: Path) -> None:
        python = dest / "python"
        python.mkdir(parents=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy2(self.install.backends / "python" / name, python / name)
        shutil.copy2(self.install.stubs, python / "triton_python_backend_stub")
        for name, model_py in self.python_based_backends.items():
            (dest / name).mkdir()
            shutil.copy2(model_py, dest / name / "model.py")

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = self.install.library_path() + (f":{old}" if old else "")
        # The stub's embedded interpreter finds its packages (numpy, ...) through the python3
        # first on PATH: this interpreter's.
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
        env.update(self.env)
        return env

    def start(self) -> LocalTriton:
        if self._proc is not None:
            raise RuntimeError("already started")
        if not self.model_repository.is_dir():
            raise FileNotFoundError(f"model repository {self.model_repository} is not a directory")
        self._tmp = tempfile.TemporaryDirectory(prefix="tritonfleet-triton-")
        tmp = Path(self._tmp.name)
        self._backend_directory(tmp / "backends")
        env = self._environment()
        for attempt in range(3):
            self.http_port, self.grpc_port, self.metrics_port = (free_port() for _ in range(3))
            self._log_path = tmp / f"tritonserver.{attempt}.log"
            with open(self._log_path, "wb") as log:
                self._proc = subprocess.Popen(
                    self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )
            self.ready = self._wait_ready(self.ready_timeout)
            if self.ready or not self._port_taken():
                break
            self._terminate()  # a port picked free was taken meanwhile: new ports, once more
            self.retried_logs.append(self.log)
            self._proc = None
        if not self.ready and self.require_ready:
            log = self.log
            state = (f"exited with status {self.returncode}" if self.returncode is not None
                     else f"not ready after {self.ready_timeout:.0f}s")
            self.stop()
            raise TritonStartError(f"tritonserver on {self.model_repository} {state}", log)
        return self

    def _port_taken(self) -> bool:
        text = self.log.lower()
        return self.returncode is not None and ("already in use" in text or "address in use" in text)

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        url = f"{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            # The log names the address it bound before the probe counts: a probe answered on
            # this port before then came from whatever else holds it.
            if serves(self.log, "HTTPService", self.http_port) and _get(url, timeout=2)[0] == 200:
                return self._metrics_up(deadline)
            if self.stalled():
                return False
            time.sleep(0.1)
        return False

    def _metrics_up(self, deadline: float) -> bool:
        """The metrics endpoint starts a moment after HTTP; wait for it unless it is off."""
        if "--allow-metrics=false" in self.extra_args:
            return True
        while time.monotonic() < deadline and self.returncode is None:
            if serves(self.log, "Metrics Service", self.metrics_port) and _get(self.metrics_url, timeout=2)[0] == 200:
                return True
            time.sleep(0.05)
        return False

    def stalled(self) -> bool:
        """Whether the log shows a load the server will wait on forever (see STALL_MARKERS)."""
        text = self.log
        return any(marker in text for marker in STALL_MARKERS)

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Wait (again) for /v2/health/ready, e.g. after loading models; False on exit/timeout."""
        self.ready = self._wait_ready(timeout)
        return self.ready

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Wait for the server to end by itself; its exit status."""
        assert self._proc is not None, "not started"
        return self._proc.wait(timeout)

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                # Still running (so its id is still its own): its process group, the Python
                # stubs included, by the server's id.
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.log  # noqa: B018 - keep the text once the temporary directory goes

    def stop(self) -> int | None:
        """Stop the server (idempotent); its exit status."""
        self._terminate()
        self.ready = False
        for region in SHM_DIR.glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)
        if self._tmp is not None:
            self.log  # noqa: B018
            self._log_path = None
            self._tmp.cleanup()
            self._tmp = None
        return self._proc.returncode if self._proc else None

    def __enter__(self) -> LocalTriton:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "ready" if self.ready else f"returncode={self.returncode}"
        return f"<LocalTriton {self.model_repository} {self.http_url} {state}>"
