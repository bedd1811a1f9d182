"""Model repository sync: the real operation and its host-side shell, run by pyinfra's @local
connector against a release tree in a temporary directory (this machine plays the host). Changed,
added, removed and renamed files, a no-op, files changed on the host, an interrupted transfer.
The same over real SSH (OpenSSH and pyinfra's own connection) is in testbed/test_model_sync.py."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops

from tests.support.fakehost import defaults
from tritonfleet.core import runid
from tritonfleet.model_repo import release as release_plan
from tritonfleet.model_repo import render as models
from tritonfleet.model_repo.render import _rendered
from tritonfleet.pyinfra_ext import transfer
from tritonfleet.steps.triton import model_repository


def write(root: Path, rel: str, data: bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


@pytest.fixture
def repo(tmp_path) -> Path:
    r = tmp_path / "repo"
    write(r, "a/config.pbtxt", b"name: \"a\"\n")
    write(r, "a/1/model.onnx", os.urandom(300_000))
    write(r, "b/config.pbtxt", b"name: \"b\"\n")
    write(r, "b/1/model.onnx", os.urandom(200_000))
    write(r, "b/labels.txt", b"cat\ndog\n")
    return r


@pytest.fixture
def base(tmp_path, monkeypatch, caplog) -> Path:
    caplog.set_level(logging.INFO, logger="pyinfra")
    monkeypatch.setenv("TRITONFLEET_LOCAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    return tmp_path / "opt-triton"


def sync(base: Path, repo: Path, transport: str = "auto") -> tuple[State, list[str]]:
    """One run of the model sync step on this machine (pyinfra's @local connector, like
    `pyinfra -y @local ...`). Returns the state and the names of operations that changed."""
    _rendered.cache_clear()  # one pyinfra run per process in real life: the repository is read anew
    data = {**defaults("t4"), "triton_base_dir": str(base), "model_repository": str(repo),
            "model_overrides": {}, "bulk_transfer": transport}
    inventory = Inventory(([("@local", data)], {}), t4=(["@local"], {}))
    state = State(inventory, Config(), check_for_changes=False)
    connect_all(state)
    add_deploy(state, model_repository)
    try:
        run_ops(state)
    except PyinfraError:
        pass
    host = inventory.get_host("@local")
    changed = [", ".join(state.get_op_meta(h).names) for h, d in state.ops[host].items()
               if d.operation_meta.did_change()]
    return state, changed


def live(base: Path) -> Path:
    return base / os.readlink(base / "model_repository")


def inode(p: Path) -> int:
    return p.stat().st_ino


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def assert_serves(base: Path, repo: Path) -> None:
    """The live release is exactly ``repo``: same files, same bytes, with its marker."""
    rel = live(base)
    got = {p.relative_to(rel).as_posix(): sha(p) for p in rel.rglob("*")
           if p.is_file() and not p.name.startswith(".tritonfleet-")}
    want = {p.relative_to(repo).as_posix(): sha(p) for p in repo.rglob("*") if p.is_file()}
    assert got == want
    man = models.manifest(repo)
    assert rel.name == models.release_id(man)
    assert (rel / models.MARKER).is_file() and (rel / release_plan.STAT).is_file()


def test_first_sync_then_noop(base, repo, caplog):
    state, changed = sync(base, repo)
    assert not state.failed_hosts and changed
    assert_serves(base, repo)
    assert os.readlink(base / "model_repository") == f"releases/{live(base).name}"  # relative
    assert (base / "releases.log").read_text().split() == [live(base).name]
    state, changed = sync(base, repo)
    assert not state.failed_hosts and changed == []


def test_changed_added_removed_renamed(base, repo, caplog):
    sync(base, repo)
    old = live(base)
    write(repo, "a/config.pbtxt", b"name: \"a\"\nmax_batch_size: 8\n")  # changed
    write(repo, "c/config.pbtxt", b"name: \"c\"\n")                      # added
    (repo / "b/labels.txt").unlink()                                    # removed
    (repo / "b/1/model.onnx").rename(repo / "b/1/model_v2.onnx")        # renamed
    caplog.clear()
    state, changed = sync(base, repo)
    assert not state.failed_hosts and changed
    assert_serves(base, repo)
    new = live(base)
    assert new != old and old.is_dir(), "the previous release is kept for rollback"
    # only the changed and the added file travelled; the rename is a hard link by content
    assert "2 files to send" in caplog.text
    assert inode(new / "b/1/model_v2.onnx") == inode(old / "b/1/model.onnx")
    assert inode(new / "a/1/model.onnx") == inode(old / "a/1/model.onnx")
    assert inode(new / "a/config.pbtxt") != inode(old / "a/config.pbtxt")
    assert not (new / "b/labels.txt").exists()
    # the old release is untouched (a changed file never writes through a shared inode)
    assert (old / "a/config.pbtxt").read_bytes() == b"name: \"a\"\n"


def test_back_to_an_earlier_release_is_a_switch(base, repo, caplog):
    sync(base, repo)
    first = live(base).name
    write(repo, "a/config.pbtxt", b"changed\n")
    sync(base, repo)
    write(repo, "a/config.pbtxt", b"name: \"a\"\n")
    caplog.clear()
    sync(base, repo)
    assert live(base).name == first
    assert "files to send" not in caplog.text
    assert (base / "releases.log").read_text().split()[-1] == first


def test_the_rollback_switch_points_back_and_prunes_nothing(base, repo):
    """release_plan.switch_back_script (the rollback's switch), run by a real shell on this machine."""
    sync(base, repo)
    first = live(base).name
    write(repo, "a/config.pbtxt", b"changed\n")
    sync(base, repo)
    second = live(base).name
    # (switch_script would prune the release it does not switch to, with a small keep: this never does)
    (base / "releases.log").write_text(f"{first}\n{second}\nnot-a-release\n")
    res = subprocess.run(["sh", "-c", release_plan.switch_back_script(str(base), first, "run1")], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert os.readlink(base / "model_repository") == f"releases/{first}"
    assert (base / "releases.log").read_text().split() == [first, second, "not-a-release", first]
    assert (base / "releases" / second).is_dir() and not list(base.glob("model_repository.new-*"))


def test_keeps_only_the_newest_releases(base, repo):
    ids = []
    for i in range(5):
        write(repo, "a/config.pbtxt", f"v{i}\n".encode())
        sync(base, repo)
        ids.append(live(base).name)
    kept = sorted(p.name for p in (base / "releases").iterdir())
    assert kept == sorted(ids[-3:])  # triton_keep_releases = 3


def test_file_changed_on_the_host_is_repaired(base, repo, caplog):
    sync(base, repo)
    rel = live(base)
    with open(rel / "b/labels.txt", "ab") as f:
        f.write(b"tampered\n")
    (rel / "b/stray.txt").write_text("not from the repository\n")
    caplog.clear()
    state, changed = sync(base, repo)
    assert not state.failed_hosts and changed, "a drifted live release is not a no-op"
    err = caplog.text
    assert "rebuilding" in err and "1 files to send" in err
    assert_serves(base, repo)
    assert live(base).name == rel.name
    state, changed = sync(base, repo)
    assert changed == []


def test_interrupted_transfer_leaves_the_live_release_and_resumes(base, repo, monkeypatch, caplog):
    sync(base, repo)
    before = live(base).name
    write(repo, "d/1/LICENSE", b"small, complete before the cut\n")  # sent first (sorted)
    write(repo, "d/1/model.onnx", os.urandom(3_000_000))

    real = transfer._over_pipe

    def cut(source, command):  # the connection drops after 1 MB of the stream
        head = subprocess.Popen(["head", "-c", "1000000"], stdin=source, stdout=subprocess.PIPE)
        source.close()
        rc, err = real(head.stdout, command)
        head.wait()
        return rc, err

    monkeypatch.setattr(transfer, "_over_pipe", cut)
    state, _ = sync(base, repo)
    assert state.failed_hosts
    # nothing half-written is visible: the live link and its release are as before
    assert live(base).name == before
    new_id = models.release_id(models.manifest(repo))
    assert not (base / "releases" / new_id).exists()
    # the cut run's own directory (named after the release and the run)
    assert [d.name for d in (base / "releases").glob(".incoming-*")] == [f".incoming-{new_id}.{runid.RUN_ID}"]
    partial = base / "releases" / f".incoming-{new_id}.{runid.RUN_ID}" / "d/1/model.onnx"
    assert partial.exists() and partial.stat().st_size < 3_000_000

    monkeypatch.setattr(transfer, "_over_pipe", real)
    monkeypatch.setattr(runid, "RUN_ID", "20990101T000000-1-abcdef")  # the next run: another id
    caplog.clear()
    state, changed = sync(base, repo)
    assert not state.failed_hosts and changed
    err = caplog.text
    # only the partial file travels again; what arrived (and what was linked) is kept
    assert "1 files to send (3.0 MB), 0 hard-linked from earlier releases, 6 kept" in err
    assert_serves(base, repo)
    assert not list((base / "releases").glob(".incoming-*"))


def test_incomplete_release_is_never_switched_to(base, repo, monkeypatch):
    sync(base, repo)
    before = live(base).name
    write(repo, "e/config.pbtxt", b"name: \"e\"\n")
    write(repo, "e/1/model.onnx", b"onnx")
    real = transfer._tar_process
    # a stream that lacks a file (e.g. it vanished locally): the completeness check refuses it
    monkeypatch.setattr(transfer, "_tar_process", lambda root, paths: real(root, paths[:-1]))
    state, _ = sync(base, repo)
    assert state.failed_hosts
    assert live(base).name == before


def test_plan_links_by_content_and_never_reuses_drifted_files():
    man = {"x/1/m.onnx": [10, "a" * 64], "x/c.pbtxt": [3, "b" * 64], "y/new": [4, "c" * 64]}
    index = {"releases": {"r1": {"old/path.onnx": [10, "a" * 64], "x/c.pbtxt": [3, "b" * 64]}},
             "drift": {"r1": ["x/c.pbtxt"]}, "incoming": {"y/new": 2, "junk": 1}}
    plan = release_plan.make_plan("r2", man, index)
    assert plan.link == {"x/1/m.onnx": "r1/old/path.onnx"}
    assert plan.send == ["x/c.pbtxt", "y/new"]  # drifted content and the partial file travel
    assert plan.keep == [] and plan.remove == ["junk", "y/new"]
    assert plan.send_bytes == 7 and not plan.repair


def test_expect_listing_sorts_like_c_locale_sort(tmp_path):
    man = {"b/x": [1, ""], "B/x": [1, ""], "a b/x": [22, ""], "a/x": [3, ""]}
    text = release_plan.expect_listing(man)
    f = tmp_path / "l"
    f.write_text(text)
    res = subprocess.run(["sort", "-c", str(f)], env={**os.environ, "LC_ALL": "C"}, capture_output=True)
    assert res.returncode == 0, res.stderr


def test_transport_choice():
    from types import SimpleNamespace

    with pytest.raises(transfer.TransferError, match="bulk_transfer must be one of"):
        transfer.choose(SimpleNamespace(name="h", connector=None), "rsync")
    not_ssh = SimpleNamespace(name="h", connector=SimpleNamespace(data={}))
    for wanted in ("ssh", "auto", "connection"):
        with pytest.raises(transfer.TransferError, match="h: model sync needs pyinfra's ssh connector"):
            transfer.choose(not_ssh, wanted)
    assert shutil.which("ssh"), "the OpenSSH client is needed for the ssh transport tests"


def test_large_plans_travel_as_a_file(base, repo, monkeypatch):
    from tritonfleet.model_repo import ops as release_op

    monkeypatch.setattr(release_op, "INLINE_SCRIPT_MAX", 0)
    state, changed = sync(base, repo)
    assert not state.failed_hosts and changed
    assert_serves(base, repo)
    assert not list((base / "releases").glob(".tritonfleet-plan-*"))


def test_unknown_transport_is_refused_before_the_host_is_touched(base, repo):
    with pytest.raises(Exception, match="bulk_transfer must be one of"):
        sync(base, repo, transport="scp")
    assert not base.exists()


# ---- the release is the repository, exactly (generated trees) ---------------------------------

# odd but legal names: hidden, spaces, a leading dash, quotes, shell and glob characters, a
# backslash, non-ASCII; every one travels through find, sort, the heredocs and tar unchanged
NAME_CHARS = "abcXYZ019._- '\"$*?[]\\#&;()~%+=@,é日"
name_st = st.text(NAME_CHARS, min_size=1, max_size=8).filter(lambda n: n not in (".", ".."))
# a small pool of contents: the same bytes under several paths (renames, hard links by content)
content_st = st.sampled_from([b"", b"\n", b"x" * 3, bytes(range(256)), b"config\n" * 50])


@st.composite
def trees(draw, depth: int = 0):
    """{name: bytes (a file) or a dict (a directory, possibly empty)}"""
    out = {}
    for name in draw(st.lists(name_st, max_size=4 if depth < 3 else 0, unique=True)):
        if depth == 0 and name.startswith(".tritonfleet-"):
            continue
        out[name] = draw(trees(depth + 1)) if draw(st.booleans()) else draw(content_st)
    return out


def flat(tree: dict, prefix: str = "") -> dict[str, bytes | None]:
    """{path: bytes} of files and {path/: None} of every directory."""
    out: dict[str, bytes | None] = {}
    for name, value in tree.items():
        if isinstance(value, dict):
            out[f"{prefix}{name}/"] = None
            out.update(flat(value, f"{prefix}{name}/"))
        else:
            out[f"{prefix}{name}"] = value
    return out


@st.composite
def changed(draw, tree: dict):
    """``tree`` after renames, deletions, rewrites and additions."""
    files = {p: v for p, v in flat(tree).items() if v is not None}
    out = {}
    for path, data in files.items():
        action = draw(st.sampled_from(["keep", "keep", "delete", "rename", "rewrite"]))
        if action == "keep":
            out[path] = data
        elif action == "rename":
            out[path.rsplit("/", 1)[0] + "/" + draw(name_st) if "/" in path else draw(name_st)] = data
        elif action == "rewrite":
            out[path] = draw(content_st)
    added = draw(trees())
    result: dict = {}
    for path, data in out.items():  # rebuild a nested tree; a clash (file vs directory) drops one
        node, parts = result, path.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            if not (parts[0].startswith(".tritonfleet-") and len(parts) == 1):
                node.setdefault(parts[-1], data)
    for name, value in added.items():
        result.setdefault(name, value)
    return result


def materialize(root: Path, tree: dict) -> None:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for path, data in sorted(flat(tree).items()):
        if data is None:
            (root / path).mkdir(parents=True, exist_ok=True)
        else:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)


def snapshot(root: Path, *, host: bool = False) -> dict[str, bytes | None]:
    """Every entry below ``root``: {path: bytes} of files, {path/: None} of directories; a host
    release's own record at its top is left out. Symlinks are followed (what Triton reads)."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        rel = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        for d in dirnames:
            out[f"{prefix}{d}/"] = None
        for f in filenames:
            if host and not prefix and f.startswith(".tritonfleet-"):
                continue
            p = Path(dirpath, f)
            assert p.is_file() and (host is False or not p.is_symlink()), p
            out[f"{prefix}{f}"] = p.read_bytes()
    return out


def assert_exact(base: Path, repo: Path) -> None:
    rel = live(base)
    assert snapshot(rel, host=True) == snapshot(repo)
    assert rel.name == models.release_id(models.manifest(repo))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_trees_arrive_exactly(base, tmp_path_factory, data):
    """Nested and empty directories, hidden files at any depth, odd names, zero-byte files;
    then renames, deletions, rewrites and additions: the live release is the local tree, in
    paths, types and bytes, after every run; one more run changes nothing."""
    work = tmp_path_factory.mktemp("gen")
    b, repo = work / "opt-triton", work / "repo"
    first = data.draw(trees().filter(bool), label="tree")
    second = data.draw(changed(first), label="changed")
    for tree in (first, second):
        materialize(repo, tree)
        state, changed_ops = sync(b, repo)
        assert not state.failed_hosts
        assert_exact(b, repo)
    state, changed_ops = sync(b, repo)
    assert not state.failed_hosts and changed_ops == []
    shutil.rmtree(work)


def test_an_ensemble_keeps_its_empty_version_directory(base, repo):
    (repo / "ens/1").mkdir(parents=True)
    write(repo, "ens/config.pbtxt", b'name: "ens"\nplatform: "ensemble"\n')
    write(repo, "a/1/.hidden/.keep", b"")
    state, _ = sync(base, repo)
    assert not state.failed_hosts
    assert (live(base) / "ens/1").is_dir() and not any((live(base) / "ens/1").iterdir())
    assert (live(base) / "a/1/.hidden/.keep").is_file()
    assert_exact(base, repo)
    # the empty directory removed on the host is drift: the next run puts it back
    (live(base) / "ens/1").rmdir()
    state, changed_ops = sync(base, repo)
    assert not state.failed_hosts and changed_ops
    assert_exact(base, repo)


def test_symlinks_in_the_repository_are_followed(base, repo):
    (repo / "a/2").symlink_to("1")  # a version directory by link
    (repo / "b/1/same.onnx").symlink_to("model.onnx")
    state, _ = sync(base, repo)
    assert not state.failed_hosts
    rel = live(base)
    assert not (rel / "a/2").is_symlink() and (rel / "a/2/model.onnx").read_bytes() == \
        (repo / "a/1/model.onnx").read_bytes()
    assert not (rel / "b/1/same.onnx").is_symlink()
    assert_exact(base, repo)


@pytest.mark.parametrize("make, why", [
    (lambda r: (r / "a/1/gone").symlink_to("nothing"), "a/1/gone: symlink to nothing, which does not exist"),
    (lambda r: (r / "a/1/loop").symlink_to("../../a"), "a/1/loop: symlink to a directory that holds it"),
    (lambda r: os.mkfifo(r / "a/1/pipe"), "a/1/pipe: not a regular file or directory"),
    (lambda r: write(r, "a/1/two\nlines", b""), "holds a line break"),
    (lambda r: write(r, ".tritonfleet-stat", b""), "kept for the release record"),
])
def test_what_a_release_cannot_reproduce_is_refused_before_the_host_is_touched(base, repo, make, why):
    make(repo)
    with pytest.raises(models.RepositoryError, match=f"(?s)model repository {re.escape(str(repo))}: .*{why}"):
        sync(base, repo)
    assert not base.exists()
