"""One pyinfra run of the deploy for a batch (``-y --json``, one ``--limit`` a host), a child
that dies with the rollout, and what its result says about each host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...core.checks import is_check
from ...core.procs import die_with_parent
from ...core.report import CHANNEL_ENV


@dataclass
class PyinfraRun:
    """One pyinfra run: its exit status, its ``-y --json`` result and its log (stderr)."""

    rc: int
    data: dict
    log: str
    log_path: str = ""  # where the run's command and output were written
    reasons: dict[str, str] = field(default_factory=dict)  # host -> why it failed, when the result cannot say

    def where(self) -> str:
        return f" (pyinfra's output: {self.log_path})" if self.log_path else ""

    def failed(self) -> set[str]:
        return set((self.data.get("results") or {}).get("failed_hosts") or [])

    def changed(self) -> set[str]:
        out: set[str] = set()
        for op in (self.data.get("results") or {}).get("operations", []):
            if not is_check(op["name"]):
                out.update(op.get("success", []))
        return out

    def ran(self) -> set[str]:
        out: set[str] = set()
        for op in (self.data.get("results") or {}).get("operations", []):
            out.update(op.get("success", []) + op.get("error", []) + op.get("no_change", []))
        return out

    def reached(self, host: str) -> bool:
        """pyinfra ran at least one operation on ``host`` (False also when the run gave no result)."""
        return host in self.ran()

    def failed_in(self, host: str) -> str | None:
        """The operation pyinfra failed ``host`` in, as the result names it."""
        for op in reversed((self.data.get("results") or {}).get("operations", [])):
            if host in op.get("error", []):
                return op["name"]
        return None

    def reason(self, host: str) -> str:
        """Why pyinfra failed ``host``, from the run's result (``-y --json``): the operation it
        failed in, or that no operation ran on it. pyinfra's own words are in the run's log."""
        if host in self.reasons:
            return self.reasons[host]
        where = self.where()
        op = self.failed_in(host)
        if op:
            return f"{op}: failed{where}"
        if not self.data:
            return f"pyinfra gave no result (exit status {self.rc}){where}"
        if not self.reached(host):
            return f"no operation ran on it (pyinfra could not connect, or the deploy code failed){where}"
        return f"pyinfra failed it (exit status {self.rc}){where}"


def pyinfra_command() -> list[str]:
    exe = Path(sys.executable).parent / "pyinfra"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pyinfra"]


def run_pyinfra(
    inventory: str,
    deploy: str,
    hosts: list[str],
    data: dict,
    dry: bool = False,
    log_path: Path | None = None,
    timeout: float = 7200,
    failure_dir: Path | None = None,
    on_start: Callable[[int], None] | None = None,
) -> PyinfraRun:
    """One pyinfra run. The child dies with this process (SIGKILL from the kernel when the rollout
    dies: tritonfleet.core.procs), so a dead rollout never leaves a deploy running ungated.
    ``failure_dir``: where the run's steps leave each failed host's report (CHANNEL_ENV).
    ``on_start(pid)`` is called once the child runs."""
    cmd = pyinfra_command() + ["-y", "--json"]
    for h in hosts:  # one --limit per host: pyinfra takes no comma-separated list
        cmd += ["--limit", h]
    if dry:
        cmd.append("--dry")
    for k, v in data.items():
        cmd += ["--data", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    cmd += [inventory, deploy]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    env.pop(CHANNEL_ENV, None)
    if failure_dir is not None:
        env[CHANNEL_ENV] = str(failure_dir)
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=die_with_parent(),
    )
    if on_start:
        on_start(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        rc, out, err = 124, "", f"{err or ''}\npyinfra did not finish within {timeout:.0f}s"
    if log_path:
        log_path.write_text(f"$ {' '.join(cmd)}\n{err}\n{out}")
    try:
        data_out = json.loads(out) if out.strip() else {}
    except ValueError:
        data_out = {}
    if not isinstance(data_out, dict):  # not pyinfra's result: no result
        data_out = {}
    return PyinfraRun(rc, data_out, err, str(log_path) if log_path else "")
