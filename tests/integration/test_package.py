"""The package's skeleton as an operator meets it: a scaffolded repository validated by the
tritonfleet command itself (the rest of the package on its own: tests/unit/test_package.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.test_package import init
from tritonfleet.inventory import roster


def test_scaffolded_repository_loads_and_validates(tmp_path):
    """The new repository's inventory loads with its group data (every host in a GPU class, the
    host-key policy named), and its model repository is valid."""
    dest = tmp_path / "repo"
    assert init(str(dest)).exit_code == 0
    res = subprocess.run([str(Path(sys.executable).parent / "tritonfleet"), "validate"], cwd=dest, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    hosts = roster.load_inventory(dest / "inventories" / "prod.py")
    assert [(h.name, h.gpu_class) for h in hosts] == [("triton-t4-01", "T4"), ("triton-t4-02", "T4"),
                                                     ("triton-l4-01", "L4")]
    assert all(h.get("ssh_strict_host_key_checking") == "yes" for h in hosts)
