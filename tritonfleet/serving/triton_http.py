"""Triton's endpoints as the control machine reads them. Its metrics (the Prometheus text
exposition of ``/metrics``) parsed into samples: the drain, the metrics reads, tune and the load
test all read them this way."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition. A counter's samples carry the name the
    exposition gives its family (prometheus_client's parser appends ``_total`` to counter
    samples; Triton's counters have no such suffix)."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = family.name if family.type == "counter" and s.name == f"{family.name}_total" else s.name
            out.append(Sample(name, dict(s.labels), float(s.value)))
    return out
