"""One definition of what a model repository may contain (tritonfleet.model_repo.contents), used
by `tritonfleet validate` and by the deploy (tritonfleet.model_repo.render.walk: every release, and
pre-flight through it). Generated trees with every kind of entry refused (FIFO, socket, symlink
loop, link to an ancestor directory, broken link, absolute link, link out of the repository,
names with a line break or not UTF-8, the reserved top-level prefix) next to ones that are fine
(relative links to a file and to a directory inside): the validator reports each refused entry
with its rule, and the deploy refuses the repository exactly when the validator does, naming one
of the entries the validator named. (Devices are left out: making one needs CAP_MKNOD and a
filesystem without nodev; the rule is the same branch as the FIFO's.)"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet.model_repo import contents
from tritonfleet.model_repo import render as models
from tritonfleet.model_repo.validate.repository import validate_repository

BASE = Path(__file__).resolve().parents[2] / "corpus" / "good" / "python"


def _fifo(repo: Path, at: str) -> None:
    os.mkfifo(repo / at)


def _socket(repo: Path, at: str) -> None:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(repo / at))
    finally:
        s.close()


def _link(target: str):
    def make(repo: Path, at: str) -> None:
        (repo / at).symlink_to(target)
    return make


def _loop(repo: Path, at: str) -> None:
    (repo / at).symlink_to(Path(at).name + ".b")
    (repo / (at + ".b")).symlink_to(Path(at).name)


def _named(raw: bytes):
    def make(repo: Path, at: str) -> None:
        parent = os.fsencode(repo / Path(at).parent)
        with open(os.path.join(parent, raw), "wb") as f:
            f.write(b"x")
    return make


#: kind -> (how to make it at a path below a model directory, the rule the validator reports, or
#: None for an entry that is fine)
KINDS = {
    "fifo": (_fifo, "special-file"),
    "socket": (_socket, "special-file"),
    "loop": (_loop, "symlink-cycle"),
    "ancestor": (_link("../.."), "symlink-cycle"),
    "broken": (_link("nothing-here"), "broken-symlink"),
    "absolute-in": (None, "unsafe-path"),  # an absolute link to a file of the repository itself
    "absolute-out": (_link("/etc/hostname"), "unsafe-path"),
    "out": (_link("../../../../outside.txt"), "unsafe-path"),
    "newline": (_named(b"two\nlines"), "file-name"),
    "not-utf8": (_named(b"caf\xe9.txt"), "file-name"),
    "self": (_link("../1"), "symlink-cycle"),  # a version directory linked into itself
    "good-file": (_link("model.py"), None),
    "good-dir": (_link("../assets"), None),  # a directory of the model, not an ancestor
    "good-version": (None, None),  # identity/2 -> 1: a version directory by link
}


def plant(repo: Path, kind: str, i: int) -> None:
    at = f"identity/1/x{i}"
    if kind == "absolute-in":
        (repo / at).symlink_to(repo / "identity/1/model.py")
    elif kind == "good-version":
        if not (repo / "identity/2").exists():
            (repo / "identity/2").symlink_to("1")
    else:
        KINDS[kind][0](repo, at)


def _reserved(repo: Path) -> None:
    (repo / ".tritonfleet-stat").write_text("")


def make_repo(tmp: Path, kinds: list[str], reserved: bool) -> Path:
    root = tmp / "work"
    repo = root / "models"
    shutil.copytree(BASE, repo, symlinks=True)
    (repo / "identity/assets").mkdir()
    (repo / "identity/assets/labels.txt").write_text("a\nb\n")
    (root / "outside.txt").write_text("not part of the repository\n")
    for i, kind in enumerate(kinds):
        plant(repo, kind, i)
    if reserved:
        _reserved(repo)
    return repo


def refused_by_validate(repo: Path) -> dict[str, str]:
    return {p.path: p.rule for p in validate_repository(repo) if p.rule in contents.RULES}


def refused_by_deploy(repo: Path) -> str | None:
    try:
        for _ in models.walk(repo):
            pass
    except models.RepositoryError as e:
        return str(e)
    return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(sorted(KINDS)), max_size=4), reserved=st.booleans())
def test_validate_and_the_deploy_agree_on_every_entry(tmp_path_factory, kinds, reserved):
    repo = make_repo(tmp_path_factory.mktemp("repo"), kinds, reserved)
    by_validate = refused_by_validate(repo)
    by_deploy = refused_by_deploy(repo)
    # every planted entry that is not fine is reported by the validator with its rule
    expected = {f"identity/1/x{i}": KINDS[k][1] for i, k in enumerate(kinds) if KINDS[k][1]}
    if reserved:
        expected[".tritonfleet-stat"] = "file-name"
    planted = {path: rule for path, rule in by_validate.items()
               if not path.startswith("identity/1/x") or path in expected}
    for path, rule in expected.items():
        match = [p for p in planted if p == path or p.startswith(path)]  # a renamed byte shows as U+FFFD
        if "newline" in kinds or "not-utf8" in kinds:
            match = match or [p for p in planted if p.startswith("identity/1/")]
        assert match and any(planted[p] == rule for p in match), (path, rule, by_validate)
    # and the deploy refuses exactly when the validator does, naming one of those entries
    assert (by_deploy is not None) == bool(by_validate), (by_deploy, by_validate)
    if by_deploy:
        assert by_deploy.startswith(f"model repository {repo}: ")
        named = by_deploy.split(": ", 2)[1]
        assert named in by_validate, (named, by_validate)


def test_each_refused_kind_alone(tmp_path):
    """Each kind by itself: the validator's rule, and the deploy's refusal names the same path."""
    for kind, (_, rule) in sorted(KINDS.items()):
        repo = make_repo(tmp_path / kind, [kind], reserved=False)
        by_validate, by_deploy = refused_by_validate(repo), refused_by_deploy(repo)
        if rule is None:
            assert by_validate == {} and by_deploy is None, (kind, by_validate, by_deploy)
            continue
        assert rule in by_validate.values(), (kind, by_validate)
        assert by_deploy is not None and by_deploy.split(": ", 2)[1] in by_validate, (kind, by_deploy)


def test_the_good_links_are_followed_by_the_release(tmp_path):
    repo = make_repo(tmp_path, ["good-file", "good-version"], reserved=False)
    rels = [rel for kind, rel, _ in models.walk(repo)]
    assert "identity/1/x0" in rels and "identity/2/model.py" in rels


def test_a_directory_that_cannot_be_read_is_refused_by_both(tmp_path, monkeypatch):
    """Unreadable directories cannot be made for root (the tests run as root): os.listdir is
    made to refuse one, as it does for another user."""
    repo = make_repo(tmp_path, [], reserved=False)
    real = os.listdir

    def listdir(path):
        if str(path).endswith("identity/1"):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    assert refused_by_validate(repo) == {"identity/1": "unreadable"}
    assert "identity/1: cannot read the directory: Permission denied" in refused_by_deploy(repo)


@pytest.mark.parametrize("rule", sorted(contents.RULES))
def test_every_rule_is_planted_above(rule):
    assert rule in {r for _, r in KINDS.values()} | {"file-name", "unreadable"}
