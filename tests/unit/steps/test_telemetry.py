"""Command generation of the GPU health step (tritonfleet.steps.telemetry, pyinfra's @fake
connector): a bare host gets the node exporter, the two scripts (the package's own files, byte
for byte), their units, one daemon-reload (noted for the GPU-loss guard) and the services; a
converged host gets nothing but its reads; a changed script restarts its service only; per-GPU
instances are all probed; gpu_telemetry = False removes what is there and nothing else. The same
step runs for real in testbed/test_quarantine.py."""

from __future__ import annotations

import hashlib

import pytest

from tests.support.fakehost import run_fake
from tritonfleet.gpu.fault_push import host_token
from tritonfleet.host.facts import HASHES
from tritonfleet.observability import telemetry_units as tu
from tritonfleet.pyinfra_ext.memo import SECTION, STATUS
from tritonfleet.settings.access import ConfigError
from tritonfleet.settings.defaults import DEFAULTS
from tritonfleet.steps.telemetry import gpu_telemetry

PATHS = [tu.COLLECTOR, tu.PROBE, tu.SIGNALS, tu.XIDS, tu.XID_CATALOG, tu.PUSH, tu.unit_path(tu.COLLECTOR_UNIT), tu.unit_path(tu.PROBE_UNIT)]
UNITS = [f"{tu.COLLECTOR_UNIT}.service", f"{tu.PROBE_UNIT}.service", "prometheus-node-exporter.service"]


def changes(cmds: list[str]) -> list[str]:
    """Commands that change the host (not the reads)."""
    reads = ("[ -f ", "! (test -e", "dpkg-query -W", "if command -v", "systemctl show", "_tf0() (",
             "if [ -n \"$TMPDIR\"")
    return [c for c in cmds if not c.startswith(reads) and "##PYINFRA_NOCMD##" not in c]


def batch(answers: list[list[str]]) -> list[str]:
    """The answer of memo.prefetch's one command (FactBatch): each fact's lines and status."""
    out = []
    for lines in answers:
        out += [SECTION, *lines, "", f"{STATUS} 0"]
    return out


def converged(files: dict[str, str], running=True) -> dict:
    state = ["SubState=running", "UnitFileState=enabled"] if running else ["SubState=dead", "UnitFileState=disabled"]
    file_answers = [["mode=644 user=root group=root", hashlib.sha256(files[p].encode()).hexdigest()] for p in PATHS]
    # the batch reads the files together (FileStates: one stat, one sha256sum) and the units together
    files_together = [f"{p}|{mode}" for p, (mode, _) in zip(PATHS, file_answers, strict=True)] + [
        HASHES, *[f"{digest}  {p}" for p, (_, digest) in zip(PATHS, file_answers, strict=True)]]
    units_together = [line for u in UNITS for line in ["", *state]][1:]
    return {
        "echo '@@tritonfleet-fact@@'": batch([files_together, units_together]),
        # each fact again on its own, after a change made the run forget what it read
        **{f"[ -f {p} ]": a for p, a in zip(PATHS, file_answers, strict=True)},
        **{f"--property Id --property SubState {u}": [f"Id={u}", state[0]] for u in UNITS},  # pyinfra's own
        **{f"--property Id --property UnitFileState {u}": [f"Id={u}", state[1]] for u in UNITS},
        **{f"UnitFileState {u}": state for u in UNITS},
        "dpkg-query -W": ["ii\tprometheus-node-exporter\t1.5.0-1+b6", "ii\tpython3\t3.11.2-1+b1"],
        "test -e /var/lib/prometheus/node-exporter": "user=root group=root mode=drwxr-xr-x atime=1 mtime=1 ctime=1 "
                                                     "size=4096 '/var/lib/prometheus/node-exporter'",
    }


def test_bare_host_gets_everything():
    host, cmds, state = run_fake(gpu_telemetry, {})
    assert not state.failed_hosts
    run = changes(cmds)
    install = [c for c in run if "apt-get" in c and "install" in c]
    assert len(install) == 1 and "--no-install-recommends" in install[0]
    assert "prometheus-node-exporter" in install[0] and "python3" in install[0]
    want = tu.files(DEFAULTS, [DEFAULTS["triton_http_port"]])
    assert {p: host.connector.uploads[p] for p in PATHS} == want
    assert want[tu.COLLECTOR] == open(tu.__file__.replace("observability/telemetry_units.py", "gpu/telemetry.py")).read()
    assert run.count("systemctl daemon-reload") == 1
    for unit in UNITS:
        assert f"systemctl start {unit}" in run and f"systemctl enable {unit}" in run


def test_converged_host_changes_nothing():
    want = tu.files(DEFAULTS, [DEFAULTS["triton_http_port"]])
    _, cmds, state = run_fake(gpu_telemetry, converged(want))
    assert not state.failed_hosts
    assert changes(cmds) == []


def test_a_changed_script_restarts_only_its_service_without_a_daemon_reload():
    want = tu.files(DEFAULTS, [DEFAULTS["triton_http_port"]])
    old = dict(want, **{tu.PROBE: want[tu.PROBE] + "# older\n"})
    host, cmds, _ = run_fake(gpu_telemetry, converged(old))
    run = changes(cmds)
    assert host.connector.uploads.keys() == {tu.PROBE}
    assert "systemctl daemon-reload" not in run
    assert [c for c in run if c.startswith("systemctl")] == [f"systemctl restart {tu.PROBE_UNIT}.service"]


def test_a_changed_signal_spec_restarts_both_services():
    """Both scripts read the metric names from the spec's copy when they start."""
    want = tu.files(DEFAULTS, [DEFAULTS["triton_http_port"]])
    old = dict(want, **{tu.SIGNALS: want[tu.SIGNALS] + "# older\n"})
    host, cmds, _ = run_fake(gpu_telemetry, converged(old))
    run = changes(cmds)
    assert host.connector.uploads.keys() == {tu.SIGNALS}
    assert "systemctl daemon-reload" not in run
    assert [c for c in run if c.startswith("systemctl")] == [f"systemctl restart {tu.COLLECTOR_UNIT}.service",
                                                             f"systemctl restart {tu.PROBE_UNIT}.service"]


def test_a_changed_xid_catalog_restarts_only_the_collector():
    """The collector reads NVIDIA's Xid catalog (and its Xid ledger) when it starts; the probe reads neither."""
    want = tu.files(DEFAULTS, [DEFAULTS["triton_http_port"]])
    old = dict(want, **{tu.XID_CATALOG: want[tu.XID_CATALOG].replace("RESET_GPU", "RESTART_BM", 1)})
    host, cmds, _ = run_fake(gpu_telemetry, converged(old))
    run = changes(cmds)
    assert host.connector.uploads.keys() == {tu.XID_CATALOG}
    assert [c for c in run if c.startswith("systemctl")] == [f"systemctl restart {tu.COLLECTOR_UNIT}.service"]


def test_the_direct_path_gives_the_host_its_own_token_and_the_collector_its_arguments(tmp_path):
    """quarantine_push_url: the host's push token (the HMAC of its name under the control machine's
    secret, mode 600) and the collector's --push-* arguments; a converged host is restarted by neither."""
    secret = tmp_path / "push.secret"
    secret.write_text("s3cret\n")
    data = {"quarantine_push_url": "http://10.0.0.5:9095", "quarantine_push_secret_file": str(secret),
            "quarantine_xids": [63]}
    want = tu.files(DEFAULTS, [DEFAULTS["triton_http_port"]])
    host, cmds, state = run_fake(gpu_telemetry, converged(want), data)
    assert not state.failed_hosts
    token_path = DEFAULTS["quarantine_push_token_path"]
    assert host.connector.uploads[token_path] == host_token("s3cret", host.name) + "\n"
    unit = host.connector.uploads[tu.unit_path(tu.COLLECTOR_UNIT)]
    assert (f"--push-url=http://10.0.0.5:9095 --push-host={host.name} --push-token-file={token_path} "
            "--push-xids=63") in unit
    assert f"chmod 600 {token_path}" in " ".join(changes(cmds))
    assert [c for c in changes(cmds) if c.startswith("systemctl restart")] == [
        f"systemctl restart {tu.COLLECTOR_UNIT}.service"]


def test_the_direct_path_without_its_secret_names_the_host_file_and_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"quarantine_push_secret_file .*missing.*tritonfleet quarantine token"):
        run_fake(gpu_telemetry, {}, {"quarantine_push_url": "http://10.0.0.5:9095",
                                     "quarantine_push_secret_file": str(tmp_path / "missing")})


def test_a_changed_setting_rewrites_the_unit_and_reloads_once():
    want = tu.files(DEFAULTS, [DEFAULTS["triton_http_port"]])
    host, cmds, _ = run_fake(gpu_telemetry, converged(want), {"telemetry_interval": 2})
    assert host.connector.uploads.keys() == {tu.unit_path(tu.COLLECTOR_UNIT)}
    assert "--interval=2 " in host.connector.uploads[tu.unit_path(tu.COLLECTOR_UNIT)]
    run = changes(cmds)
    assert run.count("systemctl daemon-reload") == 1
    assert [c for c in run if c.startswith("systemctl restart")] == [f"systemctl restart {tu.COLLECTOR_UNIT}.service"]


def test_every_per_gpu_instance_is_probed():
    host, _, _ = run_fake(gpu_telemetry, {}, {"triton_per_gpu": True, "gpu_count": 3})
    unit = host.connector.uploads[tu.unit_path(tu.PROBE_UNIT)]
    assert "--triton=8000=http://127.0.0.1:8000 --triton=8010=http://127.0.0.1:8010 " \
           "--triton=8020=http://127.0.0.1:8020" in unit


def test_operators_own_node_exporter_is_left_alone():
    _, cmds, _ = run_fake(gpu_telemetry, {}, {"telemetry_node_exporter": False})
    run = "\n".join(changes(cmds))
    assert "prometheus-node-exporter" not in run and "install" in run and "python3" in run


def test_off_removes_what_is_there_and_nothing_else():
    want = tu.files(DEFAULTS, [DEFAULTS["triton_http_port"]])
    _, cmds, _ = run_fake(gpu_telemetry, converged(want), {"gpu_telemetry": False})
    run = changes(cmds)
    assert run[:2] == [f"systemctl disable --now {u} 2>/dev/null || true" for u in UNITS[:2]]
    assert run[2].startswith("rm -f") and "tritonfleet-gpu.prom" in run[2] and tu.COLLECTOR in run[2]
    assert tu.SIGNALS in run[2]
    assert run[-1] == "systemctl daemon-reload" and "prometheus-node-exporter" not in "\n".join(run)
    _, cmds, _ = run_fake(gpu_telemetry, {}, {"gpu_telemetry": False})
    assert changes(cmds) == []


def test_a_setting_that_cannot_go_into_a_unit_is_refused_naming_host_and_setting():
    with pytest.raises(ConfigError, match="@fake/gpu1: telemetry_kmsg_path: .*cannot go into a unit's command line"):
        run_fake(gpu_telemetry, {}, {"telemetry_kmsg_path": "/tmp/a b'c"})
