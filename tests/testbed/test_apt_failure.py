"""A failed apt command during a real deploy on a real host: the Container Toolkit pinned to a
version that the (stand-in) repository does not carry. The host fails at that step with one report
(the command, apt's own words, what they mean, the versions the repository has, the setting to
change), nothing after it runs, Triton keeps serving, and `tritonfleet status` shows the same
report until a healthy deployment. (The apt lock held past apt_lock_timeout: tests/testbed/test_faults.py.)

Leaves the fleet as the `deployed` fixture made it.
"""

from __future__ import annotations

from tests.support.testbed import (
    changed_ops,
    container_started,
    infer_resnet,
    lines_of,
    pyinfra,
    ssh,
    status_of,
)
from tritonfleet.host.apt_diagnosis import APT_LOG

MISSING = "1.17.3-1"  # a release of NVIDIA's toolkit that the stand-in repository does not carry
VERSION = "dpkg-query -W -f '${Version}' nvidia-container-toolkit"


def test_a_pinned_version_the_repository_lacks_fails_the_host_with_one_report(deployed):
    testbed, _, _ = deployed
    h = testbed.hosts[-1]
    have, started = ssh(h, VERSION), container_started(h)
    res, data = pyinfra("deploys/host.py", "--limit", h.name, "--data", f"container_toolkit_version={MISSING}")
    err = res.stderr
    assert res.returncode != 0, err[-3000:]
    report = lines_of(err[err.index(f"tritonfleet: {h.name} failed at NVIDIA Container Toolkit | Container Toolkit "
                                    f"{MISSING}"):])
    assert (f"found:    version {MISSING} of nvidia-container-toolkit, nvidia-container-toolkit-base, "
            "libnvidia-container-tools, libnvidia-container1: not in the host's package lists (the host's lists "
            f"carry {have} of each)") in report, report
    assert f"command:  apt-get -y install --allow-downgrades nvidia-container-toolkit={MISSING} " in report
    assert f"E: Version '{MISSING}' for 'nvidia-container-toolkit' was not found" in report
    assert "meaning:  the version pinned for it is not in any repository the host reads" in report
    assert "the host now: apt changed no package" in report
    assert "set container_toolkit_version in group data" in report
    # apt's words once (in the report, not again as pyinfra's dump of the output); no repr, no traceback
    assert err.count(f"E: Version '{MISSING}' for 'nvidia-container-toolkit' was not found") == 1
    for wrong in ("Traceback", "Unexpected error", "\\n"):
        assert wrong not in err, wrong
    # all of apt's output stays on the host
    assert f"E: Version '{MISSING}' for 'nvidia-container-toolkit' was not found" in ssh(h, f"cat {APT_LOG}")
    # nothing after the failed step ran: the toolkit as it was, Triton untouched and serving
    assert not any("GPU" in n or "nvidia runtime" in n for n in changed_ops(data)), changed_ops(data)
    assert ssh(h, VERSION) == have
    assert container_started(h) == started and infer_resnet(h.address).shape == (1, 1000)

    # `tritonfleet status` shows the same report until a healthy deployment
    rc, row = status_of(h.name)
    assert rc == 1 and lines_of(row["last_failure"]["text"]) in report, row
    assert any(d.startswith("last run failed") and "version not available" in d for d in row["drift"]), row["drift"]

    # with the version the repository has, the host layer converges; a healthy deploy clears the report
    res, _ = pyinfra("deploys/host.py", "--limit", h.name)
    assert res.returncode == 0, res.stderr[-3000:]
    res, _ = pyinfra("deploys/models.py", "--limit", h.name)
    assert res.returncode == 0, res.stderr[-3000:]
    rc, row = status_of(h.name)
    assert rc == 0 and row["last_failure"] is None, row
    assert container_started(h) == started
