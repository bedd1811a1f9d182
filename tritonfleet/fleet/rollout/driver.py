"""A driver branch (or Container Toolkit) change as a rollout: after a host's deploy and health
gate, a real CUDA kernel on every GPU (tritonfleet.gpu.cuda_check); a host that fails it goes back
to the branch it ran before (the same deploy with that branch), is validated again there, and is
held: a hold file on the host says which branch it stays on, what was tried and why it came back.
Later rollouts leave a held host out while they would move its driver again, until an operator
releases it (``tritonfleet rollout --release-holds``); ``tritonfleet status`` shows the hold.

The GPU Operator's upgrade controller validates with CUDA's vectorAdd but neither canaries nor
rolls back; NVIDIA's Ansible role does neither (docs/fleet-operations.md, "Driver changes").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...core.connection_errors import CONNECTION_ERRORS
from ...gpu import cuda_check
from ...host.driver_hold import describe, hold_command
from ...inventory import roster
from ..runner import workers

#: the settings whose change makes a rollout a driver rollout
DRIVER_SETTINGS = ("nvidia_driver_branch", "container_toolkit_version")


def branch_of(driver: str | None) -> str | None:
    """``580`` of a driver version ``580.82.07``."""
    return driver.split(".", 1)[0] if driver else None


@dataclass
class DriverChange:
    """The driver part of one rollout: which hosts it moves from which branch, the validation after
    each batch, the way back for the hosts that fail it."""

    wanted: dict[str, str]  # host -> the branch (or toolkit version) the rollout asks for
    before: dict[str, str | None]  # host -> the branch it ran before
    image: dict[str, str]  # host -> the image the validation runs in (its Triton image)
    echo: Callable[[str], None] = print
    outcome: dict[str, dict] = field(default_factory=dict)  # host -> what was tried, validations, hold

    @classmethod
    def detect(
        cls, data: dict, hosts: list[roster.FleetHost], before: dict[str, dict], echo: Callable[[str], None] = print
    ) -> DriverChange | None:
        """The change when the rollout's data or inventory moves any host's driver branch (or asks for
        another Container Toolkit version than it has); None for a Triton or model rollout."""
        wanted, was, image = {}, {}, {}
        for fh in hosts:
            b = before.get(fh.name) or {}
            branch = str(fh.get("nvidia_driver_branch") or "") or None
            now = branch_of(b.get("driver"))
            toolkit = str(fh.get("container_toolkit_version") or "")
            moved = (branch and now and branch != now) or (
                "container_toolkit_version" in data and toolkit and b.get("toolkit") and toolkit != b.get("toolkit")
            )
            if moved:
                wanted[fh.name] = branch or now or ""
                was[fh.name] = now
                image[fh.name] = str(fh.get("triton_image"))
        if not wanted:
            return None
        return cls(wanted, was, image, echo)

    def validate(self, hosts: list[roster.FleetHost]) -> dict[str, str]:
        """The CUDA kernel on every GPU of each host the change moved: {host: why} for those that
        failed it."""
        mine = [fh for fh in hosts if fh.name in self.wanted]
        failed = {}
        for fh, res in zip(mine, workers.parallel(mine, self._run_check), strict=True):
            entry = self.outcome.setdefault(fh.name, {"from": self.before.get(fh.name), "to": self.wanted[fh.name]})
            entry.setdefault("validations", []).append(
                {"branch": self.wanted[fh.name], "passed": res.passed, "gpus": res.gpus, "reason": res.reason}
            )
            if res.passed:
                self.echo(
                    f"{fh.name}: CUDA validation passed on {res.gpus} GPU(s) (vectorAdd in {self.image[fh.name]})"
                )
            else:
                failed[fh.name] = (
                    f"CUDA validation failed after the driver change to {self.wanted[fh.name]}: {res.reason}"
                )
        return failed

    def _run_check(self, fh: roster.FleetHost) -> cuda_check.CudaResult:
        try:
            _, out = roster.run(fh, cuda_check.command(self.image[fh.name]), timeout=cuda_check.TIMEOUT + 30)
        except (roster.FleetError, *CONNECTION_ERRORS) as e:
            return cuda_check.CudaResult(False, 0, f"could not run: {str(e)[:200]}", ())
        return cuda_check.parse(out)

    def revert(
        self,
        inventory: str,
        deploy: str,
        data: dict,
        failed: list[roster.FleetHost],
        results: dict,
        logs: Path,
        label: str,
    ) -> None:
        """Each failed host back on the branch it ran before (the rollout's deploy with that branch),
        validated again there, then held: its result says what was tried and why it came back."""
        mine = [fh for fh in failed if fh.name in self.wanted and self.before.get(fh.name)]
        by_branch: dict[str, list[roster.FleetHost]] = {}
        for fh in mine:
            by_branch.setdefault(str(self.before[fh.name]), []).append(fh)
        for branch, group in by_branch.items():
            names = [fh.name for fh in group]
            self.echo(f"[{label}] driver: back to branch {branch} on {', '.join(names)}")
            pyi = workers.run_pyinfra(
                inventory,
                deploy,
                names,
                {**data, "nvidia_driver_branch": branch},
                log_path=logs / f"driver-revert-{label.replace(' ', '-').replace('/', '-')}.log",
                failure_dir=logs / f"failures-driver-revert-{branch}",
                settings=group[0],
            )
            bad = pyi.failed() if pyi.data else set(names)
            ok = [fh for fh in group if fh.name not in bad]
            again = DriverChange(
                {fh.name: branch for fh in ok}, {}, {fh.name: self.image[fh.name] for fh in ok}, self.echo
            )
            still = again.validate(ok)
            for fh in group:
                entry = self.outcome.setdefault(fh.name, {"from": branch, "to": self.wanted[fh.name]})
                entry["validations"] = entry.get("validations", []) + again.outcome.get(fh.name, {}).get(
                    "validations", []
                )
                tried = self.wanted[fh.name]
                why = next((v["reason"] for v in entry["validations"] if not v["passed"]), "the deploy failed")
                r = results[fh.name]
                if fh.name in bad:
                    entry["revert_failed"] = True
                    r.detail += f"; driver back to {branch}: the deploy failed ({pyi.reason(fh.name)})"
                    continue
                if fh.name in still:
                    entry["revert_failed"] = True
                    r.detail += f"; driver back on {branch} but {still[fh.name]}"
                    continue
                hold = {
                    "branch": branch,
                    "tried": tried,
                    "reason": why[:300],
                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                try:
                    roster.run(fh, hold_command(hold))
                except (roster.FleetError, *CONNECTION_ERRORS) as e:
                    r.detail += f"; the hold could not be written ({str(e)[:120]})"
                entry["held"] = hold
                r.detail += f"; {describe(hold)}: back on {branch}, validated, held"
                self.echo(f"{fh.name}: {describe(hold)}")

    def settle(self, results: dict) -> None:
        """After the release's rollback: a host whose driver could not go back stays "rollback failed"
        whatever the release's rollback did."""
        for n, entry in self.outcome.items():
            if entry.get("revert_failed") and n in results:
                results[n].result = "rollback failed"

    def report(self) -> dict:
        """The rollout report's ``driver`` part: per host, from, to, each validation, the hold."""
        return {"wanted": self.wanted, "before": self.before, "hosts": self.outcome}


def held_out(hosts: list[roster.FleetHost], holds: dict[str, dict | None]) -> dict[str, str]:
    """{host: why} for the held hosts whose driver this rollout would move (their wanted branch is not
    the one they are held on): left out of the rollout, named in its report."""
    out = {}
    for fh in hosts:
        hold = holds.get(fh.name)
        if hold is None:
            continue
        wanted = str(fh.get("nvidia_driver_branch") or "") or None
        if not hold.get("branch") or (wanted and wanted != str(hold["branch"])):
            out[fh.name] = (
                f"{describe(hold)}; left out: this rollout would move its driver to {wanted}; "
                "release it with --release-holds to try again"
            )
    return out


def lines(report: dict) -> list[str]:
    """The report table's lines about the driver change."""
    if not report:
        return []
    out = []
    for host, entry in sorted((report.get("hosts") or {}).items()):
        steps = ", ".join(
            f"{v['branch']}: {'passed' if v['passed'] else 'FAILED'}" for v in entry.get("validations", [])
        )
        held = f"; {describe(entry['held'])}" if entry.get("held") else ""
        out.append(
            f"driver {host}: {entry.get('from')} -> {entry.get('to')}; CUDA validation {steps or 'not run'}{held}"
        )
    return out
