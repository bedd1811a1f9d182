"""The health-signal spec (tritonfleet.gpu.signals): every metric a health rule reads is one its
writer really writes (the collector's and the probe's own output, rendered here), and the rules
are the spec's alerts with the spec's severity, ``for`` and quarantine label."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tritonfleet.gpu import signals as S
from tritonfleet.gpu import telemetry as t
from tritonfleet.inventory.roster import load_inventory
from tritonfleet.observability import gpu_health_rules as ghr
from tritonfleet.observability import inference_probe as ip

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "nvidia-real-h200-580-health"
#: the node exporter's textfile collector's own series (its textfile.go), and the scrape's ``up``
OTHERS = {S.NODE_EXPORTER: {"node_textfile_mtime_seconds", "node_textfile_scrape_error"}, S.PROMETHEUS: {"up"}}
METRIC = re.compile(r"\b(tritonfleet_[a-z_]+|node_[a-z_]+|up(?=\{))")


def _names(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def collector_writes() -> set[str]:
    """Every series name of the collector's textfile: the real H200 answer, as a GPU that retires
    pages would give it (the H200 answers [N/A]: it remaps rows), an Xid, a failed query."""
    answer = (FIXTURE / "query-telemetry.txt").read_text().split("rc=")[0]
    gpus = t.parse_query(answer.replace("[N/A], [N/A], [N/A]", "0, 0, No"))
    xid = [("0000:00:06", 79, "RESTART_BM", 1, 1, 1.0, True)]
    return _names(t.render(gpus, True, 0.2, xid, True)) | _names(t.render(None, False, 0.0, [], False))


def probe_writes(monkeypatch) -> set[str]:
    """Every series name of the probe's textfile: a model answered, then failed."""
    answers = iter([(True, 0.01, ""), (False, 0.02, "no")])

    class Triton:
        def __init__(self, url, key, timeout):
            pass

        def ready_models(self):
            return ["m"]

        def probe(self, model):
            return next(answers)

    monkeypatch.setattr(ip, "Triton", Triton)
    prober = ip.Prober([("8000", "http://127.0.0.1:8000")], "", 1)
    return _names(prober.round()) | _names(prober.round())


@pytest.fixture(scope="module")
def group():
    return ghr.rules(load_inventory(ROOT / "inventories" / "prod.py"), "triton", "1m")


def problems(group: dict, written: dict[str, set[str]]) -> list[str]:
    """What the spec or the rules name that its writer does not write."""
    out = [f"{metric}: the spec says {writer} writes it; it does not"
           for metric, writer in S.WRITERS.items() if metric not in written[writer]]
    anyone = set().union(*written.values())
    for rule in group["rules"]:
        read = set(METRIC.findall(rule["expr"]))
        if not read or not read <= anyone:
            out.append(f"{rule['alert']} reads {sorted(read - anyone)}, which nothing writes")
    return out


def test_every_metric_a_rule_reads_is_written(group, monkeypatch):
    written = {S.COLLECTOR: collector_writes(), S.PROBE: probe_writes(monkeypatch), **OTHERS}
    assert problems(group, written) == []


def test_the_rules_are_the_spec(group):
    seen = set()
    for rule in group["rules"]:
        spec = S.ALERT[rule["alert"]]
        seen.add(spec.name)
        assert (rule["labels"]["severity"], rule["for"]) == (spec.severity, spec.for_), spec.name
        assert (rule["labels"].get("quarantine") == "true") is spec.quarantine, spec.name
        assert set(METRIC.findall(rule["expr"])) == set(spec.reads), spec.name
    assert seen == set(S.ALERT), set(S.ALERT) - seen
    assert len(S.ALERT) == len(S.ALERTS)


def test_a_metric_misspelt_in_the_collector_is_found(group, monkeypatch):
    """The check is able to fail: the collector writing a temperature name no rule reads."""
    fields = tuple((f[0], f[1], S.GPU_PREFIX + "temperature_celcius" if f[2] == S.TEMPERATURE else f[2], *f[3:])
                   for f in t.FIELDS)
    monkeypatch.setattr(t, "FIELDS", fields)
    written = {S.COLLECTOR: collector_writes(), S.PROBE: probe_writes(monkeypatch), **OTHERS}
    found = problems(group, written)
    assert f"{S.TEMPERATURE}: the spec says {S.COLLECTOR} writes it; it does not" in found
    assert any(p.startswith("GpuTemperatureHigh reads") for p in found), found
