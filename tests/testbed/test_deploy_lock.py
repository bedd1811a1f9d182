"""The deploy lock cannot be skipped: on a converged test host, a deploy file that leaves out
`pyinfra_patches.install()` (README's example of deploys/models.py did) refuses at its first step,
while pyinfra loads it, naming the fix; nothing on the host changes and no lock is taken."""

from __future__ import annotations

from tests.support.testbed import INVENTORY, ROOT, host_state, mark, pyinfra_raw, ssh
from tritonfleet.pyinfra_ext.hostlock import LOCK_FILE


def test_a_deploy_file_without_the_patches_line_refuses_and_changes_nothing(deployed, tmp_path):
    testbed, _, _ = deployed
    h = testbed.hosts[0]
    text = (ROOT / "deploys" / "models.py").read_text()
    deploy = tmp_path / "models.py"
    deploy.write_text("".join(ln for ln in text.splitlines(keepends=True) if "pyinfra_patches" not in ln))
    before = mark(h)
    holder = ssh(h, f"cat {LOCK_FILE} 2>/dev/null; true")
    res = pyinfra_raw("-y", "--limit", h.name, INVENTORY, str(deploy))
    out = (res.stdout + res.stderr).decode(errors="replace")
    assert res.returncode != 0, out[-3000:]
    assert "tritonfleet: no host was changed" in out and "did not call pyinfra_patches.install() before it" in out, \
        out[-3000:]
    assert f"{deploy}: the step 'pre-flight' runs" in out and "from tritonfleet import pyinfra_patches" in out
    assert "Traceback" not in out, out[-3000:]
    assert host_state(h) == before
    assert ssh(h, f"cat {LOCK_FILE} 2>/dev/null; true") == holder  # no run took the lock
