"""An operator's repository written by `tritonfleet init` of tritonfleet 0.1.0 (its deploy files as
they were: tests/fixtures/operator-repo-0.1.0/) deploys the session's converged hosts with this
package: every entry point runs, and none changes anything. Leaves the hosts as it found them."""

from __future__ import annotations

import pytest

from tests.support.testbed import changed_ops, pyinfra

OLD = "tests/fixtures/operator-repo-0.1.0/deploys"


@pytest.mark.parametrize("deploy", ["triton.py", "models.py", "verify.py"])
def test_the_old_deploy_files_are_a_no_op_on_converged_hosts(deployed, deploy):
    res, data = pyinfra(f"{OLD}/{deploy}")
    assert res.returncode == 0, res.stderr[-4000:]
    assert data.get("results", {}).get("failed_hosts") == [], res.stderr[-4000:]
    assert changed_ops(data) == [], res.stderr[-3000:]
