"""``tritonfleet testbed up|down|list|destroy``: local disposable GPU-like hosts.

The ``testbed`` group is added to the ``tritonfleet`` command through the entry point group
``tritonfleet.commands`` (pyproject.toml) where this package is installed; ``python -m
tritonfleet_testbed`` runs the same group on its own."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from tritonfleet.core.procs import alive

from . import hosts, rootfs


def _serve_repo(state: hosts.State, directory: Path) -> None:
    """Serve the stand-in vendor repository on the bridge address only."""
    if state.repo_server_pid and alive(state.repo_server_pid):
        os.kill(state.repo_server_pid, signal.SIGTERM)
    logf = open(hosts.STATE_DIR / "repo-server.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", hosts.GATEWAY, str(hosts.REPO_PORT),
         "--directory", str(directory)],
        stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
    )
    state.repo_server_pid = proc.pid
    state.save()
    import socket

    for _ in range(100):
        try:
            socket.create_connection((hosts.GATEWAY, hosts.REPO_PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise hosts.TestbedError("the stand-in vendor repository server did not start")


def bring_up(n_hosts: int, suite: str = rootfs.SUITE) -> hosts.State:
    """Hosts of Debian ``suite``, stand-in vendor repository and stand-in images: everything a
    deploy needs."""
    from .standin_images import build_cuda_image, build_triton_image
    from .standin_repo import build_vendor_repo, debian_package, gpu_profile

    t0 = time.monotonic()
    hosts.log("building (or reusing) the stand-in vendor repository and images")
    repo = build_vendor_repo(hosts.STATE_DIR / "vendor-repo", platform.release(),
                             docker_io_deb=debian_package("docker.io"))
    triton = build_triton_image()
    cuda = build_cuda_image()
    state = hosts.up(n_hosts, gpu_env_for=gpu_profile, suite=suite)
    state.repo = {
        "url": f"http://{hosts.GATEWAY}:{hosts.REPO_PORT}",
        "fingerprint": repo.fingerprint,
        "cuda_key_name": repo.cuda_key_name,
    }
    state.images = {"triton": str(triton), "cuda": str(cuda)}
    state.save()
    _serve_repo(state, repo.root)
    hosts.log(f"testbed ready in {time.monotonic() - t0:.1f}s")
    return state


@click.group()
def testbed() -> None:
    """Local test hosts (systemd-nspawn, root, Debian 12 or 13)."""


@testbed.command("up")
@click.option("--hosts", "n_hosts", default=2, show_default=True, help="number of hosts")
@click.option("--distro", "suite", default=rootfs.SUITE, show_default=True, type=click.Choice(list(rootfs.SUITES)),
              help="the Debian release of these hosts (bookworm: 12, numbered tb1..; trixie: 13, numbered "
                   "tb21..); hosts of both can run side by side")
def up_cmd(n_hosts: int, suite: str) -> None:
    """Start N hosts (half T4, half L4), the stand-in vendor repo and images."""
    try:
        bring_up(n_hosts, suite)
    except hosts.TestbedError as e:
        raise click.ClickException(str(e)) from e


@testbed.command("down")
def down_cmd() -> None:
    """Remove every host, mount, namespace, NAT rule and setting the testbed made."""
    hosts.down()
    hosts.log("testbed removed")


@testbed.command("destroy")
@click.argument("name")
def destroy_cmd(name: str) -> None:
    """Destroy one host with its disk (then `up` recreates it bare)."""
    try:
        hosts.destroy_host(name)
    except hosts.TestbedError as e:
        raise click.ClickException(str(e)) from e


@testbed.command("list")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(as_json: bool) -> None:
    """Show the running hosts."""
    state = hosts.State.load()
    rows = [
        {"name": h.name, "address": h.address, "gpu_class": h.gpu_class, "distro": h.suite,
         "running": bool(h.pid and alive(h.pid))}
        for h in state.hosts
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no testbed hosts")
    for r in rows:
        click.echo(f"{r['name']:<10} {r['address']:<12} {r['gpu_class']:<4} {r['distro']:<9} "
                   f"{'running' if r['running'] else 'stopped'}")
