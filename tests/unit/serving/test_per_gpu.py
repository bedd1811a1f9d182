"""One Triton per GPU (``triton_per_gpu``): the port layout (hypothesis over GPU counts, ports and
offsets), the units the Triton service step writes, restarts and removes (@fake connector), the
per-instance health gate report, the Prometheus targets and what `tritonfleet status` shows.
The testbed run (four instances on a 4-GPU stand-in host, then back to one unit) is in
testbed/test_multigpu.py."""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fakehost import defaults, run_fake
from tritonfleet import TEMPLATES
from tritonfleet.cli.fleet import status_table
from tritonfleet.fleet import probe
from tritonfleet.gpu import placement as gpucount
from tritonfleet.inventory.roster import FleetError, FleetHost
from tritonfleet.observability import metrics, prometheus
from tritonfleet.serving import per_gpu as pergpu
from tritonfleet.serving.unit import (
    render_unit,
    unit_context,
    unit_path,
    units_digest,
    wanted_units,
)

T4 = defaults("t4")
UNIT_DIR = "/etc/systemd/system"


def per_gpu(**extra) -> dict:
    return {**T4, "triton_per_gpu": True, **extra}


# ------------------------------------------------------------------------ port layout

def test_default_layout_of_a_four_gpu_host():
    get = per_gpu()
    layout = [(g.get("triton_service"), g.get("triton_container_name"), g.get("triton_gpus"), g.get("triton_http_port"),
               g.get("triton_grpc_port"), g.get("triton_metrics_port")) for g in pergpu.instance_gets(get, 4)]
    assert layout == [(f"triton-gpu{i}", f"triton-server-gpu{i}", f"device={i}", 8000 + 10 * i, 8001 + 10 * i,
                       8002 + 10 * i) for i in range(4)]


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, pergpu.MAX_INSTANCES), http=st.integers(1024, 40000),
       grpc_off=st.integers(1, 5), metrics_off=st.integers(1, 5), step=st.integers(1, 40))
def test_ports_and_names_distinct_or_refused(count, http, grpc_off, metrics_off, step):
    """Every GPU count 1..16: the instances' ports are distinct and their units and containers
    named apart, or the layout is refused naming the tunable to change."""
    grpc, metrics_port = http + grpc_off, http + grpc_off + metrics_off
    get = per_gpu(triton_http_port=http, triton_grpc_port=grpc, triton_metrics_port=metrics_port,
                  triton_per_gpu_port_step=step)
    ports = [p for i in range(count) for p in (http + step * i, grpc + step * i, metrics_port + step * i)]
    if len(set(ports)) < len(ports):
        with pytest.raises(pergpu.PerGpuError, match="triton_per_gpu_port_step"):
            pergpu.instance_gets(get, count)
        return
    gets = pergpu.instance_gets(get, count)
    seen = [g.get(k) for g in gets for k in pergpu.PORT_KEYS]
    assert len(seen) == len(set(seen)) == 3 * count
    assert len({unit_path(g) for g in gets}) == len({g.get("triton_container_name") for g in gets}) == count
    assert [g.get("triton_gpus") for g in gets] == [f"device={i}" for i in range(count)]
    assert pergpu.indexes(get, [unit_path(g).rsplit("/", 1)[1] for g in gets]) == list(range(count))


@pytest.mark.parametrize("bad", [0, -3, "10x", None, 2.5])
def test_port_step_must_be_a_whole_number(bad):
    with pytest.raises(pergpu.PerGpuError, match="triton_per_gpu_port_step"):
        pergpu.instance_gets(per_gpu(triton_per_gpu_port_step=bad), 2)


def test_off_is_the_single_unit_byte_for_byte():
    """triton_per_gpu off (the default): the one unit, rendered as before, whatever the GPU count."""
    assert T4["triton_per_gpu"] is False
    single = render_unit(unit_context(T4))
    for n in (1, 4, 8):
        assert wanted_units(T4, n) == [(f"{UNIT_DIR}/triton.service", single)]
    assert "--gpus all" in single and "-p 8000:8000" in single and "triton-server-gpu" not in single
    assert units_digest(T4, 4) == hashlib.sha256(single.encode()).hexdigest()[:16]
    assert "{{ gpus }}" in (TEMPLATES / "triton.service.j2").read_text()


# ------------------------------------------------------------------------ the Triton service step (@fake)

def unit_response(path: str, text: str) -> tuple:
    return (re.compile(rf"\[ -f {re.escape(path)} \] && stat"),
            ["mode=644 user=root group=root", hashlib.sha256(text.encode()).hexdigest()])


def step_names(responses: dict, data: dict) -> tuple[list[str], dict]:
    from tritonfleet.steps.triton import triton_service

    responses = {"docker image inspect": "sha256:" + "a" * 64,
                 re.compile(r"\[ -f /etc/tritonfleet/triton-api-key \] && stat"):
                     ["mode=600 user=root group=root", "0" * 64],
                 **responses}
    host, _, state = run_fake(triton_service, responses, data)
    return [n.split(" | ", 1)[1] for meta in state.op_meta.values() for n in meta.names], host.connector.uploads


def test_four_units_written_each_restarted_single_unit_and_gone_gpu_removed_first():
    names, uploads = step_names({"ls -1 /etc/systemd/system": ["triton-gpu5.service"],
                                 **dict([unit_response(f"{UNIT_DIR}/triton.service", "old")])},
                                {"triton_per_gpu": True, "gpu_count": 4})
    assert sorted(uploads) == [f"{UNIT_DIR}/triton-gpu{i}.service" for i in range(4)]
    for i in range(4):
        text = uploads[f"{UNIT_DIR}/triton-gpu{i}.service"]
        assert f"--gpus device={i} \\" in text and "--gpus all" not in text
        assert f"-p {8000 + 10 * i}:8000 \\\n  -p {8001 + 10 * i}:8001 \\\n  -p {8002 + 10 * i}:8002 \\" in text
        assert f"--name triton-server-gpu{i} " in text and f"docker stop -t 40 triton-server-gpu{i}" in text
        assert "-v /opt/triton/model_repository:/models:ro" in text  # the same repository
    removed = [n for n in names if n.startswith("stop, disable and remove")]
    assert removed == ["stop, disable and remove triton.service (one Triton per GPU replaces it)",
                       "stop, disable and remove triton-gpu5.service (its GPU is gone)"]
    first_restart = next(i for i, n in enumerate(names) if n.startswith("restart "))
    assert max(names.index(n) for n in removed) < first_restart
    assert [n for n in names if n.startswith("restart ")] == [
        f"restart triton-gpu{i} (unit, image or models changed)" for i in range(4)]
    assert [n for n in names if n.endswith("running and enabled")] == [
        f"triton-gpu{i} running and enabled" for i in range(4)]


def test_converged_per_gpu_host_changes_nothing():
    data = per_gpu(gpu_count=4)
    units = wanted_units(data, 4)
    responses = dict(unit_response(path, text) for path, text in units)
    responses["ls -1 /etc/systemd/system"] = [p.rsplit("/", 1)[1] for p, _ in units]
    responses["systemctl show"] = ["SubState=running", "UnitFileState=enabled"]
    responses["docker inspect --format '{{.State.Running}}"] = [
        "running=true", "image=sha256:" + "a" * 64, "started=1000.5"]
    names, uploads = step_names(responses, {"triton_per_gpu": True, "gpu_count": 4})
    assert uploads == {}
    assert not [n for n in names if n.startswith(("restart", "stop", "systemd daemon-reload"))], names


def test_switching_back_removes_the_per_gpu_units_before_the_single_unit():
    names, uploads = step_names({"ls -1 /etc/systemd/system": [f"triton-gpu{i}.service" for i in range(4)]}, {})
    removed = [n for n in names if n.startswith("stop, disable and remove")]
    assert removed == [f"stop, disable and remove triton-gpu{i}.service (triton_per_gpu is off)" for i in range(4)]
    assert names.index(removed[-1]) < names.index("systemd unit triton.service")
    assert uploads == {f"{UNIT_DIR}/triton.service": render_unit(unit_context(T4))}


def test_one_gpu_host_runs_one_per_gpu_instance():
    names, uploads = step_names({}, {"triton_per_gpu": True, "gpu_count": 1})
    assert sorted(uploads) == [f"{UNIT_DIR}/triton-gpu0.service"]
    assert "--gpus device=0 \\" in uploads[f"{UNIT_DIR}/triton-gpu0.service"]


def test_colliding_ports_refused_before_anything_changes():
    from tritonfleet.preflight import triton_layer  # its PreflightError ends the run: SystemExit
    from tritonfleet.settings.access import ConfigError
    from tritonfleet.steps.triton import triton_service

    data = {"triton_per_gpu": True, "gpu_count": 2, "triton_per_gpu_port_step": 1}
    with pytest.raises(ConfigError, match="@fake/gpu1: triton_per_gpu: GPU 1's triton_http_port 8001 is also "
                                          "GPU 0's triton_grpc_port .raise triton_per_gpu_port_step"):
        run_fake(triton_service, {}, data)
    with pytest.raises(SystemExit, match=r"@fake/gpu1: triton_per_gpu: .* \(inventories/group_data/all.py"):
        run_fake(triton_layer, {}, data)
    with pytest.raises(SystemExit, match="@fake/gpu1: triton_per_gpu with a load balancer .lb = 'haproxy'. is not built"):
        run_fake(triton_layer, {}, {"triton_per_gpu": True, "gpu_count": 2, "lb": "haproxy"})


# ------------------------------------------------------------------------ health gate report

def test_failed_instance_named_in_the_report():
    from tritonfleet.core.report import Failure
    from tritonfleet.serving.health import instance_failure

    g = pergpu.instance_get(per_gpu(), 2)
    f = instance_failure(Failure("h4", "health gate", "Triton live", "not healthy after 60s", cause="no answer"), g)
    assert f.found == "GPU 2 (triton-gpu2.service, HTTP 8020): not healthy after 60s"
    assert f.cause.startswith("GPU 2 (triton-gpu2.service, HTTP 8020)")
    single = instance_failure(Failure("h4", "health gate", "x", "y", cause="z"), T4)
    assert (single.found, single.cause) == ("y", "z")


# ------------------------------------------------------------------------ Prometheus targets

def fleet_host(name="h4", address="10.0.0.4", **data) -> FleetHost:
    return FleetHost(name, ["t4"], {"ssh_hostname": address, "gpu_class": "t4", **T4, **data})


def test_prometheus_one_target_per_gpu_with_its_label():
    hosts = [fleet_host(triton_per_gpu=True, gpu_count=4), fleet_host("h1", "10.0.0.1")]
    ts, _ = prometheus.targets(hosts)
    assert [(t.target, t.labels.get("gpu")) for t in ts] == [
        ("10.0.0.4:8002", "0"), ("10.0.0.4:8012", "1"), ("10.0.0.4:8022", "2"), ("10.0.0.4:8032", "3"),
        ("10.0.0.1:8002", None)]
    assert all(t.labels["host"] == t.host.name for t in ts)
    files = prometheus.file_sd(ts, "triton")
    assert len(files["triton-t4.json"]) == 5


@settings(max_examples=50, deadline=None)
@given(count=st.integers(1, 8), step=st.integers(3, 50))
def test_prometheus_targets_distinct_per_gpu_count(count, step):
    ts = metrics.metrics_targets(fleet_host(triton_per_gpu=True, gpu_count=count, triton_per_gpu_port_step=step))
    assert [g for _, g in ts] == list(range(count))
    assert len({t for t, _ in ts}) == count


def test_prometheus_needs_gpu_count_for_per_gpu_hosts():
    with pytest.raises(FleetError, match="h4: triton_per_gpu needs the host's gpu_count"):
        prometheus.targets([fleet_host(triton_per_gpu=True)])


# ------------------------------------------------------------------------ tritonfleet status

def t4x4() -> list[dict]:
    return [{"index": i, "pci_bus_id": f"00000000:00:1{'BCDE'[i]}.0", "uuid": f"GPU-{i}", "name": "Tesla T4"}
            for i in range(4)]


def probe_text(instances: list[str], unit: str) -> str:
    gpus = "\n".join(f"Tesla T4, 580.159.04, {g['index']}, {g['pci_bus_id']}, {g['uuid']}" for g in t4x4())
    return (f"@gpu\n{gpus}\n@gpu_record\n" + "\n".join(gpucount.record_lines(t4x4()))
            + "\n@active\n\n@unit\n" + unit + "\n@instances\n" + "\n".join(instances) + "\n")


def test_status_per_gpu_instances_up_of_expected():
    fh = fleet_host(triton_per_gpu=True)
    assert "triton-gpu" in probe.command(fh) and "/v2/health/ready" in probe.command(fh)
    assert "@instances" not in probe.command(fleet_host())  # the single unit's probe as before
    digest = units_digest(fh, 4)
    all_up = [f"{i} active 200" for i in range(4)]
    st = probe.interpret(fh, probe.parse(probe_text(all_up, digest)))
    want = probe.intent(fh, st)
    assert want["unit"] == digest
    assert (st.instances_expected, st.unit_state) == (4, "active")
    assert [d for d in probe.drift(st, want) if d.startswith(("triton ", "per-GPU")) or "unit" in d] == []
    assert "active 4/4" in status_table([st])

    down = [*all_up[:2], "2 failed 000", "3 active 200", "5 active 200"]
    st = probe.interpret(fh, probe.parse(probe_text(down, "0" * 16)))
    drift = probe.drift(st, probe.intent(fh, st))
    assert "triton 3/4 instances up; down: GPU 2 (failed, not ready)" in drift
    assert "per-GPU units of GPUs the host does not have: GPU 5" in drift
    assert "unit differs" in drift
    assert "DOWN 3/4" in status_table([st])
    st = probe.interpret(fh, probe.parse(probe_text(all_up[:3], digest)))
    assert "triton 3/4 instances up; down: GPU 3 (no unit)" in probe.drift(st, probe.intent(fh, st))


def test_status_per_gpu_release_is_the_configs_as_written():
    """Each instance sees one GPU: the release wanted is the one-GPU rendering, not the spread."""
    from tritonfleet import ROOT
    from tritonfleet.model_repo import render as models

    fh = fleet_host(triton_per_gpu=True, model_repository=str(ROOT / "files/model_repository"), model_overrides={})
    st = probe.interpret(fh, probe.parse(probe_text([], "")))
    assert probe.intent(fh, st).get("release") == models.host_repository(fh, gpus=1)[2]


@pytest.mark.parametrize("value,on", [(True, True), ("true", True), ("1", True), ("yes", True), (False, False),
                                      (None, False), ("false", False), (0, False), ("x", False)])
def test_on_only_when_asked(value, on):
    assert pergpu.enabled({"triton_per_gpu": value}) is on


# ------------------------------------------------------------------------ rollout: the host as one unit

def test_rollout_gates_every_instance_and_names_the_one_that_fails(monkeypatch):
    from tritonfleet.fleet.rollout import engine as rollout
    from tritonfleet.serving import health

    fh = fleet_host(triton_per_gpu=True)
    st = probe.interpret(fh, probe.parse(probe_text([], "")))
    monkeypatch.setattr(probe, "intent", lambda h, s=None: {"models": ["m"]})
    monkeypatch.setattr(probe, "probe", lambda h, with_intent=True: st)
    gated = []

    def gate(get, address, models, transport, limit, watch):
        gated.append(get.get("triton_http_port"))
        return health.HealthResult(get.get("triton_http_port") != 8020, [health.Check("x", False, "no answer")])

    monkeypatch.setattr(health, "gate", gate)
    monkeypatch.setattr(health, "failure_of", lambda res, name, models, watch, limit, rollout=False:
                        health.Failure(name, "health gate", "ready", "not healthy", cause="no answer"))
    res, failure = rollout._gate(fh, 5)
    assert gated == [8000, 8010, 8020] and not res.ok
    assert failure.found == "GPU 2 (triton-gpu2.service, HTTP 8020): not healthy"
    gated.clear()
    monkeypatch.setattr(health, "gate", lambda get, *a: gated.append(get.get("triton_http_port")) or health.HealthResult(True))
    res, failure = rollout._gate(fh, 5)
    assert gated == [8000, 8010, 8020, 8030] and res.ok and failure is None
