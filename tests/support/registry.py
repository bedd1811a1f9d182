"""A private registry for tests: Debian's docker-registry (the CNCF distribution registry) with
htpasswd auth, served on this testbed instance's bridge address; images pushed with skopeo.

The registry binary is taken from Debian's package without installing it (installing would start
a registry service on every address of this machine).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import bcrypt

from tritonfleet_testbed import hosts
from tritonfleet_testbed.standin_repo import debian_package

PORT = 5000


class LocalRegistry:
    def __init__(self, workdir: Path, user: str, secret: str, address: str = hosts.GATEWAY):
        self.dir = Path(workdir)
        self.user, self.secret, self.address = user, secret, address
        self.host = f"{address}:{PORT}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LocalRegistry:
        self.dir.mkdir(parents=True, exist_ok=True)
        binary = self.dir / "bin"
        subprocess.run(["dpkg-deb", "-x", str(debian_package("docker-registry")), str(binary)], check=True)
        (self.dir / "data").mkdir(exist_ok=True)
        htpasswd = self.dir / "htpasswd"
        hashed = bcrypt.hashpw(self.secret.encode(), bcrypt.gensalt(rounds=10)).decode()
        htpasswd.write_text(f"{self.user}:{hashed}\n")
        config = self.dir / "config.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "version": 0.1,
            "log": {"level": "info"},
            "storage": {"filesystem": {"rootdirectory": str(self.dir / "data")}},
            "http": {"addr": self.host, "secret": base64.b64encode(os.urandom(16)).decode()},
            "auth": {"htpasswd": {"realm": "tritonfleet-test", "path": str(htpasswd)}},
        }))
        self.log = open(self.dir / "registry.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([str(binary / "usr/bin/docker-registry"), "serve", str(config)],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        for _ in range(200):
            try:
                socket.create_connection((self.address, PORT), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"registry did not start: {(self.dir / 'registry.log').read_text()[-2000:]}")

    def push(self, archive: str | Path, ref: str) -> str:
        """Push a docker-save archive as ``<registry>/<ref>``; the credentials travel in an auth
        file (not in skopeo's argv). Returns the full image reference."""
        auth = self.dir / "auth.json"
        token = base64.b64encode(f"{self.user}:{self.secret}".encode()).decode()
        auth.write_text(json.dumps({"auths": {self.host: {"auth": token}}}))
        os.chmod(auth, 0o600)
        image = f"{self.host}/{ref}"
        tar = self.dir / "image.tar"
        with gzip.open(archive) as src, open(tar, "wb") as dst:  # skopeo reads plain tar archives
            shutil.copyfileobj(src, dst)
        try:
            res = subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--dest-authfile",
                                  str(auth), f"docker-archive:{tar}", f"docker://{image}"],
                                 capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, f"skopeo copy to {image}: {res.stderr}"
        finally:
            auth.unlink()
            tar.unlink()
        return image

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()
