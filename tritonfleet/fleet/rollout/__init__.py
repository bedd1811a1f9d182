"""Health-gated rolling rollout over pyinfra: canary first, then batches in inventory order.

pyinfra alone cannot do this safely (``--serial`` ignores ``--fail-percent``, orders hosts at
random, ``--no-wait`` exits 0 on failure). Here each batch is one ``pyinfra --limit`` run of the
deploy (a large batch split over worker processes: tritonfleet.fleet.runner.workers); after it, every
host of the batch must pass the health gate. A host that fails is rolled back
(``deploys/rollback.py``) to what it served before the rollout; once more hosts have failed than
``max_fail`` allows, the rollout halts and the hosts not reached yet are left exactly as they
were.

Before the first batch: every target is probed (reachable, what it serves) and the deploy is
planned with ``pyinfra --dry`` on all of them, so a pre-flight error stops the rollout before any
host is touched.

The package: ``plan`` (batches), ``pyinfra_run`` (one run of the deploy), ``journal`` (what it did,
for ``--resume``), ``report`` (the table; ``finish``, the ending the pull rollout shares),
``engine`` (the rollout itself).
"""

from __future__ import annotations

from ..runner.pyinfra_run import PyinfraRun, pyinfra_command, run_pyinfra
from .engine import resume, rollout
from .journal import Journal, latest_journal
from .plan import RolloutError, parse_batch, plan_batches
from .report import HostResult, Report, exit_status, finish, table

__all__ = [
    "HostResult",
    "Journal",
    "PyinfraRun",
    "Report",
    "RolloutError",
    "exit_status",
    "finish",
    "latest_journal",
    "parse_batch",
    "plan_batches",
    "pyinfra_command",
    "resume",
    "rollout",
    "run_pyinfra",
    "table",
]
