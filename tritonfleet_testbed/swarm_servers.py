"""The fan-out's programs for the tests on this machine, taken from Debian's packages without
installing them (installing opentracker starts a tracker on every address of the machine):
opentracker (a tracker that answers only for the info hashes of its whitelist, as Debian builds it)
and aria2c (a BitTorrent client that seeds from a web seed, BEP 19), each with its libraries.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tritonfleet_testbed.origin_servers import _stop, _wait
from tritonfleet_testbed.ports import free_port
from tritonfleet_testbed.standin_repo import debian_package

# the packages and the libraries of theirs a bare Debian 12 lacks
ARIA2 = ("aria2", "libaria2-0", "libc-ares2", "libssh2-1")
OPENTRACKER = ("opentracker", "libowfat0")


def unpacked(directory: Path, packages: tuple[str, ...]) -> dict[str, str]:
    """``packages`` unpacked below ``directory``; the environment that runs their binaries."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in packages:
        mark = directory / f".{name}"
        if not mark.exists():
            subprocess.run(["dpkg-deb", "-x", str(debian_package(name)), str(directory)], check=True)
            mark.write_text("")
    libs = [str(directory / d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "lib", "usr/lib")]
    return {"PATH": f"{directory / 'usr/bin'}:{os.environ.get('PATH', '')}",
            "LD_LIBRARY_PATH": ":".join(libs)}


def aria2_env(directory: Path) -> dict[str, str]:
    return dict(os.environ, **unpacked(directory, ARIA2))


class Tracker:
    """opentracker on address:port (TCP for HTTP announces) with a whitelist file of info hashes."""

    def __init__(self, workdir: Path, address: str = "127.0.0.1", port: int | None = None):
        self.dir = Path(workdir)
        self.address, self.port = address, port or free_port(address)
        self.url = f"http://{address}:{self.port}/announce"
        self.whitelist = self.dir / "whitelist"
        self.proc: subprocess.Popen | None = None

    def allow(self, *info_hashes: str) -> None:
        """Whitelist ``info_hashes`` (opentracker reads the file again on SIGHUP)."""
        have = set(self.whitelist.read_text().split()) if self.whitelist.exists() else set()
        self.whitelist.write_text("".join(f"{h}\n" for h in sorted(have | set(info_hashes))))
        self.whitelist.chmod(0o644)
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(1)

    def __enter__(self) -> Tracker:
        env = dict(os.environ, **unpacked(self.dir / "pkg", OPENTRACKER))
        self.dir.chmod(0o755)
        self.allow()
        self.log = self.dir / "opentracker.log"
        with open(self.log, "ab") as out:
            # opentracker chroots to -d and drops to nobody: the whitelist is named inside that
            # root, so SIGHUP reads it again from there
            self.proc = subprocess.Popen(
                ["opentracker", "-i", self.address, "-p", str(self.port), "-P", str(self.port), "-d", str(self.dir),
                 "-w", self.whitelist.name],
                cwd=self.dir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        _wait(self.address, self.port, self.proc, self.log)
        return self

    def stop(self) -> None:
        _stop(self.proc)

    def __exit__(self, *exc) -> None:
        self.stop()
