"""The HAProxy backend docs/operations.md recommends is the one the tests run: its block and its
table are the lines and reasons of ``serving.haproxy_config`` (one source of truth)."""

from __future__ import annotations

import re

from tritonfleet import ROOT
from tritonfleet.serving.haproxy_config import TRAFFIC_LINES, traffic_lines

DOC = ROOT / "docs" / "operations.md"
SECTION = "### The HAProxy backend in front of Triton (recommended)"


def section(text: str) -> str:
    start = text.index(SECTION)
    end = text.index("\n## ", start)
    return text[start:end]


def block(text: str) -> list[str]:
    """The section's HAProxy configuration block, line by line, stripped."""
    body = re.search(r"```haproxy\n(.*?)```", section(text), re.S)
    assert body, "no ```haproxy block in the section"
    return [ln.strip() for ln in body.group(1).splitlines() if ln.strip()]


def missing(text: str) -> list[str]:
    """What the docs lack of the constant: a line not in the block (in order), a reason not in the table."""
    lines, sec = block(text), section(text)
    out = []
    at = 0
    for line in traffic_lines():
        if line not in lines[at:]:
            out.append(f"line {line!r}")
            continue
        at = lines.index(line, at) + 1
    out += [f"reason of {line!r}" for line, why in TRAFFIC_LINES if f"| `{line}` | {why} |" not in sec]
    return out


def test_the_docs_recommend_exactly_the_lines_the_tests_run():
    assert missing(DOC.read_text()) == []


def test_the_check_sees_a_line_or_a_reason_that_differs():
    text = DOC.read_text()
    line, why = TRAFFIC_LINES[1]
    assert missing(text.replace(f"  {line}\n", "  retry-on conn-failure\n", 1)) == [f"line {line!r}"]
    assert missing(text.replace(f"| {why} |", "| something else |", 1)) == [f"reason of {line!r}"]


def test_the_block_is_the_backend_the_lines_go_into():
    lines = block(DOC.read_text())
    assert "backend triton" in lines and "option httpchk GET /v2/health/ready" in lines
    assert lines.index("backend triton") < lines.index(traffic_lines()[0])
