"""Facts read together (tritonfleet.host.facts.FileStates, UnitStates; memo's ``together``): the
answer each fact gets from the one command is the answer of its own command. FileStates is
compared with FileState on this machine's own shell over generated files (regular, empty, missing,
directories, links, FIFOs); the batch's grouping against the specs it was given."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet.host.facts import FileState, FileStates, UnitState, UnitStates
from tritonfleet.pyinfra_ext import memo

KINDS = ["file", "empty", "missing", "dir", "link_to_file", "dangling_link", "link_to_dir", "fifo"]


def make(kind: str, path, content: bytes) -> None:
    if kind == "file":
        path.write_bytes(content)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "dir":
        path.mkdir()
    elif kind == "link_to_file":
        target = path.with_name(path.name + ".target")
        target.write_bytes(content)
        path.symlink_to(target)
    elif kind == "dangling_link":
        path.symlink_to(path.with_name(path.name + ".nowhere"))
    elif kind == "link_to_dir":
        path.with_name(path.name + ".d").mkdir()
        path.symlink_to(path.with_name(path.name + ".d"))
    elif kind == "fifo":
        os.mkfifo(path)


def sh(command: str) -> list[str]:
    res = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(KINDS), st.binary(max_size=64), st.sampled_from([0o644, 0o600, 0o755])),
             min_size=1, max_size=6),
    st.booleans(),
)
def test_files_read_together_answer_as_each_file_read_alone(tmp_path_factory, files, repeat_first):
    d = tmp_path_factory.mktemp("files")
    paths = []
    for i, (kind, content, mode) in enumerate(files):
        p = d / f"f{i}"
        make(kind, p, content)
        if kind in ("file", "empty"):
            p.chmod(mode)
        paths.append(str(p))
    if repeat_first:
        paths.append(paths[0])
    assert all(FileStates.joinable(path=p) for p in paths), paths
    alone = {p: FileState().process(sh(FileState().command(p))) for p in paths}
    together = FileStates().process(sh(FileStates().command(tuple(paths))))
    answered = {kw["path"]: value for cls, kw, value in FileStates.derived(together, tuple(paths)) if cls is FileState}
    assert answered == alone
    regular = {str(d / f"f{i}") for i, (kind, _, _) in enumerate(files) if kind in ("file", "empty", "link_to_file")}
    assert {p for p, v in answered.items() if v is not None} == regular  # a regular file, after links


@pytest.mark.parametrize("path", ["/etc/a file", "/etc/it's", "/etc/back\\slash", "etc/relative", "/etc/new\nline"])
def test_a_path_its_line_could_not_name_is_read_on_its_own(path):
    assert not FileStates.joinable(path=path)


def test_units_are_answered_in_the_order_asked_and_a_short_answer_is_refused():
    value = UnitStates().process(["SubState=running", "UnitFileState=enabled", "", "SubState=dead", "UnitFileState="])
    assert UnitStates.derived(value, ("a.service", "b.service")) == [
        (UnitState, {"unit": "a.service"}, UnitState().process(["SubState=running", "UnitFileState=enabled"])),
        (UnitState, {"unit": "b.service"}, UnitState().process(["SubState=dead", "UnitFileState="])),
    ]
    with pytest.raises(ValueError):
        UnitStates.derived(value, ("a.service", "b.service", "c.service"))
    assert not UnitStates.joinable(unit="a unit.service") and UnitStates.joinable(unit="triton-gpu0.service")


class Other:
    pass


def test_a_batch_reads_two_or_more_of_a_kind_as_one_fact_in_the_place_of_the_first():
    specs = (
        (Other, {"x": 1}),
        (FileState, {"path": "/etc/a"}),
        (UnitState, {"unit": "a.service"}),
        (FileState, {"path": "/etc/b c"}),  # its line could not name it: on its own
        (FileState, {"path": "/etc/b"}),
        (FileState, {"path": "/etc/a"}),  # asked twice: read once
    )
    assert memo._together(specs, {}) == [
        (Other, {"x": 1}),
        (FileStates, {"paths": ("/etc/a", "/etc/b")}),
        (UnitState, {"unit": "a.service"}),  # one alone stays as it is
        (FileState, {"path": "/etc/b c"}),
    ]
    known = {(FileState, memo._freeze({"path": "/etc/a"})): None}  # remembered already: not asked again
    assert memo._together(specs, known) == list(specs)
