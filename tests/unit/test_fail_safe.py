"""No error read as "all clear": what cannot be read is an explicit, reported state or a failure
(docs/hardening.md, "What is checked at run time"), blind excepts are gone, and the shell-safety
invariants are checks that stay under ``python -O``.

The drain's own cases are in tests/unit/serving/test_drain.py (unit and @fake) and tests/testbed/test_drain.py
(behind a real HAProxy); the tunnel's and the unit watch's in tests/integration/serving/test_health.py.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tritonfleet import ROOT
from tritonfleet.fleet import probe
from tritonfleet.inventory.roster import FleetHost
from tritonfleet.serving import drain, unit_watch

PACKAGE = ROOT / "tritonfleet"
LINTED = ("tritonfleet", "tritonfleet_testbed", "tests", "deploys", "inventories", "bench")


def python_files(*roots: str):
    """The project's Python files under ``roots``: not those in hidden directories (bench/.work
    holds a benchmark's virtualenv and scratch copies; ruff skips them too, by .gitignore)."""
    for root in roots:
        for p in (ROOT / root).rglob("*.py"):
            parts = p.relative_to(ROOT).parts
            if "__pycache__" not in parts and not any(x.startswith(".") for x in parts) and p.is_file():
                yield p


def test_no_assert_in_the_package():
    """`python -O` removes assert statements: an invariant the shell's safety rests on is a check
    that raises."""
    found = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in python_files("tritonfleet")
             for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Assert)]
    assert not found, "assert in the package (an `if ...: raise` instead):\n" + "\n".join(found)


def test_no_blind_except_is_excused_and_the_rule_is_on():
    pyproject = (ROOT / "pyproject.toml").read_text()
    select = re.search(r"^select = \[(.*)\]$", pyproject, re.MULTILINE).group(1)
    assert '"BLE"' in select, select
    found = [f"{p.relative_to(ROOT)}:{i}" for p in python_files(*LINTED)
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"noqa:[^#]*\bBLE", line)]
    assert not found, "blind excepts excused with noqa (catch the errors meant):\n" + "\n".join(found)


def test_the_shell_safety_checks_stay_under_python_O():
    code = """
from tritonfleet.serving import apikey; from tritonfleet.model_repo import release as release_plan
for f, args in ((apikey.unit_script, (["inference'"],)), (release_plan._heredoc, ("/x", "a\\nEOF\\n", "EOF"))):
    try:
        f(*args)
    except ValueError as e:
        print("refused:", e)
    else:
        print("passed")
"""
    res = subprocess.run([sys.executable, "-O", "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2 and all(ln.startswith("refused:") for ln in lines), lines
    assert "'" in lines[0] and "the end of its here-document" in lines[1]


# ---------------------------------------------------------------- status: unknown is not "none"

def host(**data) -> FleetHost:
    from tritonfleet.settings.defaults import DEFAULTS

    return FleetHost("h1", ["t4"], {**DEFAULTS, "ssh_hostname": "10.0.0.1", "gpu_class": "t4", **data})


def sections(**parts: str) -> dict[str, list[str]]:
    base = {"gpu": "Tesla T4, 580.159.04, 0, 00000000:00:1E.0, GPU-84b0bf9a-67bf-493c-9214-4fad8b125a6d",
            "active": "active"}
    text = "".join(f"@{k}\n{v}\n" for k, v in {**base, **parts}.items())
    return probe.parse(text)


@pytest.mark.parametrize("answer,said", [
    ("", "did not answer"),
    ('{"error":"This API is restricted, expecting header \'triton-api-key\'"}', "This API is restricted"),
    ("<html>502 Bad Gateway</html>", "502 Bad Gateway"),
])
def test_models_triton_does_not_say_are_unknown_not_missing(answer, said):
    st = probe.interpret(host(), sections(models=answer))
    assert st.models_ready == [] and said in st.unknown["models"]
    drift = probe.drift(st, {"models": ["resnet50_onnx"]})
    assert any(d.startswith("models unknown: ") and said in d for d in drift), drift
    assert not any(d.startswith("not ready:") for d in drift), drift


def test_models_triton_says_are_read():
    index = json.dumps([{"name": "resnet50_onnx", "version": "1", "state": "READY"},
                        {"name": "text_classifier_onnx", "version": "1", "state": "UNAVAILABLE"}])
    st = probe.interpret(host(), sections(models=index))
    assert (st.models_ready, st.models_not_ready, st.unknown) == (["resnet50_onnx"], ["text_classifier_onnx"], {})
    assert "not ready: text_classifier_onnx" in probe.drift(st, {"models": ["resnet50_onnx", "text_classifier_onnx"]})


def test_records_that_cannot_be_read_are_unknown_not_absent():
    st = probe.interpret(host(), sections(last='{"release": "r1", "time": "2026-', failure="{not json"))
    assert st.last_deploy is None and st.last_failure is None
    assert "history.jsonl is not a record" in st.unknown["last deployment"]
    assert "is not a failure report" in st.unknown["last failure"]
    drift = probe.drift(st, {})
    assert any(d.startswith("last deployment unknown:") for d in drift)
    assert any(d.startswith("last failure unknown:") for d in drift)


def test_a_gpu_count_that_is_not_a_count_is_said():
    st = probe.interpret(host(gpu_count="four"), sections())
    assert st.gpu_expected is None and "gpu_count" in st.unknown["GPU count"]
    assert any(d.startswith("GPU count unknown:") for d in probe.drift(st, {}))


def test_an_nvidia_smi_error_is_not_no_driver():
    st = probe.interpret(host(), sections(gpu="Failed to initialize NVML: Driver/library version mismatch"))
    drift = probe.drift(st, {"driver_branch": "580"})
    assert "GPUs unknown: Failed to initialize NVML: Driver/library version mismatch" in drift
    assert "no driver" not in drift


# ---------------------------------------------------------------- the health gate's report

def test_a_history_line_that_is_not_a_record_is_not_never_recorded():
    text = "\n".join(["ActiveState=active", "SubState=running", unit_watch.SECTION, "", unit_watch.SECTION, "",
                      unit_watch.SECTION, "/opt/triton/releases/r2", unit_watch.SECTION, '{"release": "r1", "ti'])
    snap = unit_watch.parse_watch(text + "\n")
    assert snap.last is None and "history.jsonl is not a record" in snap.last_error
    what, _ = unit_watch.serving_now(snap, "triton", "h1")
    assert "the last healthy deployment cannot be told" in what and "never recorded" not in what


# ---------------------------------------------------------------- HAProxy's answers

class FakeAPI:
    address = "/run/haproxy/admin.sock"

    def __init__(self, stat: str, servers: str):
        self.answers = {"show stat": stat, "show servers state triton": servers}

    def command(self, line: str) -> str:
        return self.answers[line]


STAT = "# pxname,svname,scur,status\ntriton,h1,{scur},UP\n"
SERVERS = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state\n3 triton 1 h1 10.0.0.1 2 {admin}\n"


@pytest.mark.parametrize("scur,admin,said", [
    ("", "0", "no current sessions (scur)"),
    ("3", "", "no admin state"),
])
def test_haproxy_answers_that_cannot_be_read_are_errors_not_zero(scur, admin, said):
    ha = drain.HAProxy(["/run/haproxy/admin.sock"], "triton", "h1")
    ha.apis = [FakeAPI(STAT.format(scur=scur), SERVERS.format(admin=admin))]
    with pytest.raises(drain.DrainError, match=re.escape(said)):
        ha.in_flight()
    ha.apis = [FakeAPI(STAT.format(scur="3"), SERVERS.format(admin="8"))]
    assert ha.in_flight() == 3 and ha.state().drained


def test_the_docs_list_every_place_checked():
    """docs/hardening.md lists the run-time checks and every place an error could have become a
    default value."""
    text = (ROOT / "docs" / "hardening.md").read_text()
    section = text.split("## What is checked at run time", 1)[1]
    for word in ("compat.py", "speed-only", "refuses", "pyinfra_patches.install()", "required", "drain",
                 "InFlightUnknown", "status", "health gate", "HAProxy", "performance gate"):
        assert word in section, word
    assert Path(ROOT / "docs" / "operations.md").read_text().count("cannot be read") >= 1
