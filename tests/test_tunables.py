"""Every tunable is documented once: in group_data/all.py (with a comment) and in README."""

import re

from tritonfleet import ROOT
from tritonfleet.tunables import read


def test_every_tunable_has_a_comment_and_a_readme_row():
    readme = (ROOT / "README.md").read_text()
    names = [n for n, _, _ in read()]
    assert len(names) == len(set(names)), "a tunable is defined twice"
    for name, _, comment in read():
        assert comment, f"{name} has no comment in group_data/all.py"
        assert f"| `{name}` |" in readme, f"{name} missing from README's tunables table"


def test_code_reads_only_documented_tunables():
    names = {n for n, _, _ in read()} | {"gpu_class"}
    used = set()
    for p in (ROOT / "tritonfleet").rglob("*.py"):
        text = p.read_text()
        if re.search(r"^from \.+ import (.*\b)?config\b", text, re.M):  # tritonfleet.config users
            used |= set(re.findall(r'config\.get\("([a-z0-9_]+)"', text))
    assert used, "no tunables found: the pattern is wrong"
    assert used <= names, f"read but not in group_data/all.py: {sorted(used - names)}"
