"""Every setting checked once when the inventory is loaded (tritonfleet.settings.check): type,
range, known name (with the nearest known name for a misspelling), known GPU class; refused with
the host, the setting, its value and where it was set. The deploy's side (pre-flight) is in
tests/unit/test_preflight.py; every command fed broken inventories in tests/integration/cli/test_bad_input.py."""

from __future__ import annotations

import math
import shutil
import string

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.forked import forked
from tritonfleet import ROOT
from tritonfleet.gpu.rules import GPU_CLASSES
from tritonfleet.inventory import roster
from tritonfleet.settings import check
from tritonfleet.settings.check import RULES, SettingsError
from tritonfleet.settings.defaults import DEFAULTS

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---- the rules and the defaults ------------------------------------------------------------

def test_every_tunable_has_exactly_one_rule_and_its_default_passes_it():
    assert set(RULES) == set(DEFAULTS), set(RULES) ^ set(DEFAULTS)
    for name, rule in RULES.items():
        assert rule.problem(DEFAULTS[name]) is None, (name, DEFAULTS[name], rule.what)


def test_choices_are_the_ones_the_code_acts_on():
    """The rules write the domains' choices again (the settings layer imports no domain): the
    same values, so a new choice in the code is a new choice here."""
    from tritonfleet.gpu import placement as gpucount
    from tritonfleet.host import driver_source, kernel_module
    from tritonfleet.host import nvidia_repos as vendorfacts
    from tritonfleet.model_repo import origin
    from tritonfleet.pyinfra_ext import transfer
    from tritonfleet.serving import drain, unit
    from tritonfleet.steps import verify

    def accepted(name, candidates):
        return {c for c in candidates if RULES[name].problem(c) is None}

    everything = {None, "", "docker", "distro", "yes", "no", *transfer.TRANSPORTS, *drain.KINDS,
                  *unit.MODEL_CONTROL_MODES, *gpucount.POLICIES, *kernel_module.FLAVOURS, *vendorfacts.DISTROS,
                  *verify.VERIFY_MODES, *driver_source.SOURCES, "direct", "ssh", "poll", "other"}
    assert accepted("bulk_transfer", everything) == set(transfer.TRANSPORTS)
    assert accepted("lb", everything) == {None, *drain.KINDS}
    assert accepted("triton_model_control_mode", everything) == set(unit.MODEL_CONTROL_MODES)
    assert accepted("gpu_placement", everything) == set(gpucount.POLICIES)
    assert accepted("nvidia_kernel_module", everything) == {None, *kernel_module.FLAVOURS}
    assert accepted("cuda_distro", everything) == {None, *vendorfacts.DISTROS}
    assert accepted("gpu_verify_container", everything) == set(verify.VERIFY_MODES)
    assert accepted("nvidia_driver_source", everything) == set(driver_source.SUPPORTED)
    assert accepted("health_via", everything) == {"direct", "ssh"}
    assert accepted("docker_source", everything) == {"docker", "distro"}
    assert accepted("model_origin_auth", everything | {"presigned", "host", "token"}) == set(origin.AUTHS)


# ---- generated values ----------------------------------------------------------------------

def _problem(key, value):
    return [p.why for p in check.problems("h1", {key: value}, lambda k: "here", GPU_CLASSES)]


PORTS = ("triton_http_port", "triton_grpc_port", "triton_metrics_port")


@FAST
@given(st.sampled_from(PORTS), st.integers(-10**6, 10**6))
def test_ports_are_whole_numbers_from_1_to_65535(key, n):
    data = {key: n}
    if n in (8000, 8001, 8002) and DEFAULTS[key] != n:
        return  # colliding with another port's default: its own rule, below
    assert bool(_problem(key, n)) == (not 1 <= n <= 65535)
    assert check.problems("h", data, lambda k: "x", GPU_CLASSES) == [] or not 1 <= n <= 65535


@FAST
@given(st.sampled_from(sorted(RULES)), st.one_of(
    st.text(alphabet=string.ascii_letters, min_size=1, max_size=8),
    st.integers(-5, 70000).map(str),  # a number written as text
    st.booleans()))
@example("model_fanout_piece_kb", "0")  # a list of numbers (choice) gave no hint once
def test_a_word_or_a_quoted_number_where_a_number_belongs_is_refused(key, value):
    if not any(isinstance(DEFAULTS[key], t) and not isinstance(DEFAULTS[key], bool) for t in (int, float)):
        return
    why = _problem(key, value)
    assert why and "must be" in why[0], (key, value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        assert f"(write {value} without quotes" in why[0]  # (quarantine_budget: "or 'P%'")


SECONDS = [k for k in RULES if k.endswith("_timeout") or k in ("perf_gate_duration",)]


@FAST
@given(st.sampled_from(SECONDS), st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-100, 100)))
def test_timeouts_are_not_negative(key, value):
    zero_ok = key in ("deploy_lock_timeout", "apt_lock_timeout", "triton_stop_timeout")
    ok = math.isfinite(value) and (value >= 0 if zero_ok else value > 0)
    assert (not _problem(key, value)) == ok, (key, value)


@FAST
@given(st.sampled_from([k for k in RULES if k.startswith("monitor_") and k.endswith(("_ratio", "_utilization"))
                        and k != "monitor_queue_compute_ratio"]),
       st.floats(-2, 3, allow_nan=False))
def test_ratios_are_between_0_and_1(key, value):
    assert (not _problem(key, value)) == (0 <= value <= 1)


NAMES = sorted(DEFAULTS)


@FAST
@given(st.sampled_from(NAMES), st.data())
def test_a_misspelled_name_is_refused_with_a_known_name_to_use(name, data):
    i = data.draw(st.integers(0, len(name) - 1))
    edit = data.draw(st.sampled_from(["drop", "swap", "double"]))
    if edit == "drop":
        wrong = name[:i] + name[i + 1:]
    elif edit == "swap" and i + 1 < len(name):
        wrong = name[:i] + name[i + 1] + name[i] + name[i + 2:]
    else:
        wrong = name[:i] + name[i] + name[i:]
    if wrong in check.known_names() or not wrong:
        return
    (problem,) = check.problems("h1", {wrong: DEFAULTS[name]}, lambda k: "group_data/t4.py", GPU_CLASSES)
    assert problem.key == wrong and problem.why.startswith("is no setting of tritonfleet or pyinfra")
    if len(name) <= 3:  # "lb" swapped is "bl": too short for a likeness to mean anything
        return
    assert ": did you mean " in problem.why, problem.why
    suggested = problem.why.split("did you mean ", 1)[1].split("?", 1)[0]
    assert suggested in check.known_names()


@pytest.mark.parametrize(("wrong", "right"), [
    ("trition_http_port", "triton_http_port"), ("health_timout", "health_timeout"),
    ("gpu_clas", "gpu_class"), ("ssh_hostnme", "ssh_hostname"), ("fleet_paralel", "fleet_parallel"),
])
def test_usual_misspellings_get_their_name(wrong, right):
    (why,) = _problem(wrong, 1)
    assert f"did you mean {right}?" in why


def test_names_the_operators_own_code_reads_are_declared():
    data = {"my_site_label": "x", "extra_host_data": ["my_site_label"]}
    assert check.problems("h", data, lambda k: "x", GPU_CLASSES) == []
    assert [p.key for p in check.problems("h", {"my_site_label": "x"}, lambda k: "x", GPU_CLASSES)] == ["my_site_label"]


@pytest.mark.parametrize(("value", "ok"), [("T4", True), ("l4", True), ("A100", False), ("", False), (4, False),
                                           (None, True)])
def test_gpu_class_is_one_tritonfleet_has_rules_for(value, ok):
    assert (not _problem("gpu_class", value)) == ok


def test_the_three_ports_must_differ():
    (p,) = check.problems("h", {"triton_grpc_port": 8000}, lambda k: "here", GPU_CLASSES)
    assert p.key == "triton_grpc_port" and "must differ" in p.why


# ---- where a value was set: the inventory loaded as the fleet commands load it ----------------

@pytest.fixture
def project(tmp_path, monkeypatch):
    inv = tmp_path / "inventories"
    shutil.copytree(ROOT / "inventories" / "group_data", inv / "group_data")
    (inv / "prod.py").write_text(
        't4 = [("t4-a", {"ssh_hostname": "192.0.2.1"}), ("t4-b", {"ssh_hostname": "192.0.2.2"})]\n'
        'l4 = [("l4-a", {"ssh_hostname": "192.0.2.3"})]\n')
    monkeypatch.chdir(tmp_path)
    return inv


def _load(data, limit):
    """load_inventory as the fleet commands call it: (host names, None) or (None, (error type,
    message, exit status)). Run in a forked child (tests/support/forked.py: loading an inventory patches
    the process for gevent)."""
    try:
        return [h.name for h in roster.load_inventory("inventories/prod.py", data=data, limit=limit)], None
    except SettingsError as e:
        return None, (type(e).__name__, str(e), e.exit_status)


def _refusal(project, data=None, limit=None) -> str:
    names, error = forked(_load, data, limit)
    assert names is None and error[0] == "SettingsError" and error[2] == 2, (names, error)
    return error[1]


def test_where_a_value_was_set_is_named(project):
    (project / "group_data" / "t4.py").write_text((project / "group_data/t4.py").read_text() + "health_timeout = -3\n")
    msg = _refusal(project)
    # group data applies to both hosts of the group: one line for both
    assert "t4-a, t4-b: health_timeout = -3 (inventories/group_data/t4.py): must be a number of seconds > 0" in msg
    assert "l4-a" not in msg
    (project / "group_data" / "all.py").write_text((project / "group_data/all.py").read_text()
                                                   + "fleet_parallel = '8'\n")
    msg = _refusal(project, limit=["l4"])
    assert "l4-a: fleet_parallel = '8' (inventories/group_data/all.py): must be a whole number >= 1 " \
           "(write 8 without quotes)" in msg
    msg = _refusal(project, data={"triton_metrics_port": 99999}, limit=["l4"])
    assert "l4-a: triton_metrics_port = 99999 (--data): must be a whole number from 1 to 65535" in msg


def test_host_data_and_inventory_groups_are_named(project):
    (project / "prod.py").write_text(
        't4 = ([("t4-a", {"ssh_hostname": "192.0.2.1", "ssh_port": "22"})], {"lb": "nginx"})\n')
    msg = _refusal(project)
    assert "t4-a: ssh_port = '22' (host data of t4-a in inventories/prod.py): must be a whole number from 1 to " \
           "65535 (write 22 without quotes)" in msg
    assert "t4-a: lb = 'nginx' (group t4 in inventories/prod.py): must be one of None, 'haproxy', 'hooks'" in msg


def _first_port():
    return roster.load_inventory("inventories/prod.py")[0].get("triton_http_port")


def test_a_good_inventory_loads(project):
    assert forked(_load, None, None) == (["t4-a", "t4-b", "l4-a"], None)
    assert forked(_first_port) == DEFAULTS["triton_http_port"]
