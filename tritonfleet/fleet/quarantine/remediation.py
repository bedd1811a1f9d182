"""The receiver's remediation of a quarantined host (``quarantine_remediate``): for a fault whose
recommended action is a GPU reset, the reset on the host over SSH (tritonfleet.fleet.quarantine.remedy
decides and writes the commands), then the host's alerts acknowledged up to the reset, so it
returns through the warm gate like any other; a reset that did not clear it, or a fault that asks
for a reboot, is said (``needs-reboot``) and the host stays out; a host that faults again within
``quarantine_refault_window`` of coming back is held, its evidence saved in the state directory."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pyinfra.api import StringCommand

from ...core.errors import TritonfleetError
from ...inventory.roster import FleetHost
from ..runner.pyinfra_run import run_pyinfra
from .latency import Latency
from .planning import FiringAlert, QuarantineError, Record, acknowledged, clean, fault_time, now_iso
from .remedy import EVIDENCE_SCRIPT, Decision, History, action_of, decide, reset_script

Runner = Callable[[FleetHost, str], tuple[bool, str]]
#: reboots a host and waits for it (True, "") or says why it failed (False, why)
Rebooter = Callable[[FleetHost], tuple[bool, str]]
_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$")


def smi_bus_id(pci: str) -> str | None:
    """The kernel log's PCI address of a GPU (``0000:3b:00``, the Xid line's) as nvidia-smi's ``-i``
    takes a bus id (``00000000:3B:00.0``); None for anything else."""
    m = _PCI.match(pci.strip())
    if not m:
        return None
    domain, bus, dev, fn = m.group(1) or "0", m.group(2), m.group(3), m.group(4) or "0"
    return f"{int(domain, 16):08X}:{bus.upper()}:{dev.upper()}.{fn}"


def ssh_runner(fh: FleetHost, script: str) -> tuple[bool, str]:
    """``script`` on the host over the inventory's SSH connection (pyinfra's, with the host's
    ``_sudo`` when its data sets it): (exit status 0, its output)."""
    h = fh.pyinfra_host
    if h is None:
        raise QuarantineError(f"{fh.name}: no SSH connection to remediate it (the receiver's inventory)")
    if not h.connected:
        h.connect(reason="tritonfleet quarantine", show_errors=False, raise_exceptions=True)
    ok, out = h.run_shell_command(
        StringCommand(script), print_output=False, print_input=False, **({"_sudo": True} if fh.get("_sudo") else {})
    )
    return bool(ok), "\n".join([*out.stdout_lines, *out.stderr_lines])


class PyinfraRebooter:
    """The reboot as the fleet commands run a deploy: ``pyinfra -y --json --limit HOST INVENTORY
    DEPLOY`` (tritonfleet.fleet.runner.pyinfra_run: a child that dies with the receiver), the
    deploy file the reboot step's (deploys/reboot.py), its output kept in ``logs``. Available only
    while that file is there (looked at each time: without it the receiver says ``needs-reboot``)."""

    def __init__(self, inventory: str, deploy: str, logs: Path, data: dict | None = None, timeout: float = 3600):
        self.inventory, self.deploy, self.logs, self.data, self.timeout = inventory, deploy, logs, data or {}, timeout

    def available(self) -> bool:
        return Path(self.deploy).is_file()

    def __call__(self, fh: FleetHost) -> tuple[bool, str]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"reboot-{fh.name}-{now_iso().replace(':', '')}.log"
        res = run_pyinfra(self.inventory, self.deploy, [fh.name], dict(self.data), log_path=log, timeout=self.timeout)
        ok = res.rc == 0 and res.reached(fh.name) and fh.name not in res.failed()
        return ok, "" if ok else res.reason(fh.name)


class Remedies:
    """The remediation part of the Receiver (mixed into it: its records, alerts, events)."""

    remediate: bool
    refault_window: float
    runner: Runner
    history: dict[str, History]
    hosts: dict[str, FleetHost]
    records: dict[str, Record]
    alerts: dict[str, FiringAlert]
    acked: dict[str, str]
    state_dir: Path
    latency: Latency
    rebooter: Rebooter | None
    rebooting: dict[str, tuple[threading.Thread, float, list]]
    event: Callable[..., None]
    _once: Callable[[str, str, str, str], None]

    def _remedy_all(self) -> None:
        """One step for each quarantined host (not held) whose fault is not acknowledged yet."""
        if not self.remediate:
            return
        for name, rec in list(self.records.items()):
            if name in self.rebooting:
                self._reboot_over(name, rec)
                continue
            if rec.held:
                continue
            live = [a for fp, a in self.alerts.items() if a.host == name and not acknowledged(a, self.acked.get(fp))]
            if not live:
                continue
            hist = self.history.setdefault(name, History())
            d = decide(
                action_of(live),
                hist,
                rec.fault_at or min((fault_time(a) or 0 for a in live), default=0),
                self.refault_window,
            )
            if d.step == "reset":
                self._reset(name, rec, live, hist, d)
            elif d.step == "hold":
                self._hold_with_evidence(name, rec, d)
            elif (
                d.step == "reboot" and self.rebooter is not None and getattr(self.rebooter, "available", lambda: True)()
            ):
                self._reboot(name, hist, d)
            elif d.step == "reboot":
                self._once(
                    f"remedy:{name}",
                    "needs-reboot",
                    name,
                    f"{d.why}: reboot it, then `tritonfleet quarantine release` (it stays out meanwhile; "
                    "with deploys/reboot.py in the receiver's directory it reboots the host itself)",
                )
            else:
                self._once(f"remedy:{name}", "no-remedy", name, d.why)

    def _run(self, fh: FleetHost, script: str) -> tuple[bool, str]:
        try:
            return self.runner(fh, script)
        except (TritonfleetError, OSError) as e:
            return False, f"{type(e).__name__}: {e}"

    def _reset(self, name: str, rec: Record, live: list[FiringAlert], hist: History, d: Decision) -> None:
        fh = self.hosts[name]
        pcis = sorted({b for a in live if (b := smi_bus_id(str(a.labels.get("pci", ""))))})
        if not pcis:
            self._once(f"remedy:{name}", "no-remedy", name, f"{d.why}, but its alerts name no GPU (pci): it stays out")
            return
        service = str(fh.get("triton_service"))
        t0 = time.time()
        self.event("reset", name, f"{d.why}: stopping {service}, resetting GPU {', '.join(pcis)}")
        ok, out = self._run(fh, reset_script(service, pcis))
        hist.resets.append(t0)
        if not ok:
            self.event("reset-failed", name, f"the GPU reset failed: {clean(out[-400:], 400)} (a reboot next)")
            return
        self._remedied(name, rec, "reset-done", f"GPU {', '.join(pcis)} reset", t0)

    def _remedied(self, name: str, rec: Record, kind: str, what: str, t0: float) -> None:
        """A reset or reboot that cleared the fault: its time recorded (the histogram's
        ``remedied`` stage), the host's alerts acknowledged up to now (a fault seen later counts
        again), so the next round sends it back through the warm gate."""
        now = time.time()
        rec.remedied_at = now
        took = self.latency.observe("remedied", rec.fault_at, now)
        for fp, a in self.alerts.items():
            if a.host == name:
                self.acked[fp] = f"{a.starts_at}@{now:.3f}"
        self.event(
            kind,
            name,
            f"{what} in {now - t0:.1f} s"
            + (f" ({took:.1f} s after the fault)" if took is not None else "")
            + "; its alerts acknowledged up to now (a fault seen later counts): back through the warm gate",
        )

    def _reboot(self, name: str, hist: History, d: Decision) -> None:
        """The reboot in a thread of its own (minutes on a real machine: the rounds go on); each
        round looks whether it is over (``_reboot_over``). Once only: ``hist.reboots``."""
        fh, result, t0 = self.hosts[name], [], time.time()
        hist.reboots.append(t0)
        rebooter = self.rebooter
        if rebooter is None:  # _decide reboots only with a rebooter: a bug if not
            raise RuntimeError(f"{name}: a reboot without a rebooter (serve --reboot-deploy)")

        def run() -> None:
            try:
                result.append(rebooter(fh))
            except (TritonfleetError, OSError) as e:
                result.append((False, f"{type(e).__name__}: {e}"))

        t = threading.Thread(target=run, name=f"reboot-{name}", daemon=True)
        self.rebooting[name] = (t, t0, result)
        self.event("reboot", name, f"{d.why}: rebooting it (deploys/reboot.py; it stays out meanwhile)")
        t.start()

    def _reboot_over(self, name: str, rec: Record) -> None:
        t, t0, result = self.rebooting[name]
        if t.is_alive():
            return
        del self.rebooting[name]
        ok, why = result[0] if result else (False, "the reboot ended without a result")
        if not ok:
            self.event("reboot-failed", name, f"the reboot failed: {clean(why, 400)}: it stays out for an operator")
            return
        self._remedied(name, rec, "reboot-done", "rebooted", t0)

    def _hold_with_evidence(self, name: str, rec: Record, d: Decision) -> None:
        ok, out = self._run(self.hosts[name], EVIDENCE_SCRIPT)
        folder = self.state_dir / "evidence"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}-{now_iso(time.time()).replace(':', '')}.log"
        path.write_text(out + ("\n" if out and not out.endswith("\n") else ""))
        rec.held, rec.held_reason = True, d.why
        self.event("held", name, f"{d.why}: {path}" + ("" if ok else " (collecting it failed: see the file)"))

    def _came_back(self, name: str) -> None:
        """A host back in service: a new fault within the refault window holds it."""
        self.history[name] = History(back_at=time.time())
