"""A real nginx (Debian's package) serving a pull-mode origin directory, for tests and benchmarks.

Everything under the origin is served read-only (GET, HEAD, conditional GETs by ETag and
Last-Modified: nginx's static module); ``reports/`` also takes HTTP PUT (nginx's
ngx_http_dav_module: ``dav_methods PUT``, ``create_full_put_path``), which is how self-converging
hosts report. Started in the foreground in a temporary prefix, stopped by its process id.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tritonfleet_testbed.ports import free_port

CONFIG = """\
daemon off;
user root root;
worker_processes {workers};
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log {access};
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  types {{ application/json json; application/gzip gz; text/html html; text/plain txt; }}
  default_type application/octet-stream;
  keepalive_requests 100000;
  server {{
    listen {addr}:{port} backlog=4096;
    root {root};
    location / {{ autoindex off; }}
    location /reports/ {{
      dav_methods PUT;
      create_full_put_path on;
      dav_access user:rw group:r all:r;
      client_max_body_size 1m;
    }}
  }}
}}
"""


class OriginServer:
    """nginx serving ``root`` at http://``addr``:``port`` (a free port when None)."""

    def __init__(self, root: Path, tmp: Path, addr: str = "127.0.0.1", port: int | None = None,
                 workers: int = 1, access_log: bool = True):
        exe = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(exe).exists():
            raise RuntimeError("nginx is not installed (bash scripts/setup installs it)")
        tmp.mkdir(parents=True, exist_ok=True)
        (root / "reports").mkdir(parents=True, exist_ok=True)
        self.port = port or free_port(addr)
        self.url = f"http://{addr}:{self.port}"
        self.tmp = tmp
        conf = tmp / "nginx.conf"
        conf.write_text(CONFIG.format(tmp=tmp, root=root.resolve(), addr=addr, port=self.port, workers=workers,
                                      access=f"{tmp}/access.log" if access_log else "off"))
        self.log = open(tmp / "nginx.out", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([exe, "-p", str(tmp), "-c", str(conf)], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((addr, self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"nginx did not start: {(tmp / 'error.log').read_text(errors='replace')[-2000:]}"
                                       if (tmp / "error.log").exists() else "nginx did not start") from None
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """CPU nginx used so far (its master and workers, user + system)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        pids = [self.proc.pid]
        try:
            pids += [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]
        except OSError:
            pass
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except OSError:
                pass
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: workers finish what they serve
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


CACHE = Path(os.environ.get("TRITONFLEET_CACHE", "/var/cache/tritonfleet"))


def agent_wheelhouse(cache: Path = CACHE) -> Path:
    """Wheels of every distribution the self-converging hosts' agent needs (tritonfleet's runtime
    dependencies at the versions installed here), downloaded once with pip and cached by that
    list (CACHE/agent-wheels-<hash>): what `tritonfleet bootstrap --wheelhouse` publishes."""
    import fcntl
    import hashlib
    import sys

    from tritonfleet.fleet.pull.bootstrap import runtime_closure

    closure = runtime_closure()
    closure.pop("tritonfleet", None)
    spec = sorted(f"{n}=={v}" for n, v in closure.items())
    d = cache / f"agent-wheels-{hashlib.sha256(chr(10).join(spec).encode()).hexdigest()[:12]}"
    if (d / ".complete").exists():
        return d
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".agent-wheels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (d / ".complete").exists():
            return d
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
                              "-d", str(tmp), *spec], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"pip download of the agent's wheels failed: {res.stderr[-2000:]}")
        (tmp / ".complete").write_text("\n".join(spec) + "\n")
        os.replace(tmp, d)
    return d


# what tritonfleet's wheel is built from (the skeleton's config.py, deploys/, inventories/ and files/ are
# links into the checkout's own), as tests/testbed/test_wheel.py builds it
WHEEL_SOURCES = ("pyproject.toml", "README.md", "config.py", "tritonfleet", "deploys", "inventories", "files")


def build_wheel(out: Path, sources: tuple[str, ...] = WHEEL_SOURCES) -> Path:
    """tritonfleet's wheel from a clean copy of this checkout (no build/ of an earlier build in it;
    the test tooling's package is not copied, so not in it), built with pip without build isolation
    or an index, as an operator would get it: ``out/src`` the copy, the wheel in ``out``."""
    import sys

    from tritonfleet import ROOT

    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in sources:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                          "-w", str(out), str(src)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         timeout=600)
    wheels = sorted(out.glob("tritonfleet-*.whl"))
    if res.returncode != 0 or not wheels:
        raise RuntimeError(f"building tritonfleet's wheel failed: {res.stderr[-2000:]}")
    return wheels[-1]
