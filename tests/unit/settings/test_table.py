"""Every tunable is documented once: in tritonfleet/settings/defaults.py (with a comment), and the table
in docs/tunables.md is generated from it."""

import re

from tritonfleet import ROOT
from tritonfleet.settings.defaults import DEFAULTS
from tritonfleet.settings.table import markdown, read

DOC = ROOT / "docs" / "tunables.md"


def test_every_tunable_has_a_comment_and_a_docs_row():
    doc = DOC.read_text()
    names = [n for n, _, _ in read()]
    assert len(names) == len(set(names)), "a tunable is defined twice"
    for name, _, comment in read():
        assert comment, f"{name} has no comment in tritonfleet/settings/defaults.py"
        assert f"| `{name}` |" in doc, f"{name} missing from the table in docs/tunables.md"


def test_docs_table_is_the_generated_one():
    doc = DOC.read_text()
    table = "\n".join(line for line in doc.splitlines() if line.startswith("|"))
    assert table == markdown(), "docs/tunables.md: paste the output of `python -m tritonfleet.tunables`"


def test_defaults_are_the_documented_tunables():
    assert list(DEFAULTS) == [n for n, _, _ in read()]


def test_code_reads_only_documented_tunables():
    names = {n for n, _, _ in read()} | {"gpu_class", "triton_per_gpu_index"}  # (a per-GPU instance's own)
    used = set()
    for p in (ROOT / "tritonfleet").rglob("*.py"):
        text = p.read_text()
        if re.search(r"^\s*from \.+settings import access as config\b", text, re.M):  # the current host's
            used |= set(re.findall(r'config\.get\("([a-z0-9_]+)"', text))
        used |= set(re.findall(r'\bsettings\.get\("([a-z0-9_]+)"', text))  # a Settings passed in
    assert used, "no tunables found: the pattern is wrong"
    assert used <= names, f"read but not in tritonfleet/settings/defaults.py: {sorted(used - names)}"
