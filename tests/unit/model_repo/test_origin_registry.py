"""Model origin stores are a table (tritonfleet.model_repo.origin.STORES, kept in
tritonfleet.settings.origin_stores): a store defined here, in this module alone, and one line in
the table are all a deploy needs to use it: the settings check at load takes its URL and refuses a
bad one in the store's words, pre-flight's check asks it, publishing uploads through it, and the
host-side fetch signs as it says. And no module but a store's own decides anything by kind."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_structure import ROOT, imported
from tritonfleet import preflight
from tritonfleet.gpu.rules import GPU_CLASSES
from tritonfleet.model_repo import ops
from tritonfleet.model_repo import origin as origins
from tritonfleet.pyinfra_ext import stream
from tritonfleet.settings import check
from tritonfleet.settings.defaults import DEFAULTS

#: what the toy store holds, by origin URL: {key: bytes}
HELD: dict[str, dict[str, bytes]] = {}
CALLS: list[str] = []


class MemStore:
    """A toy store: ``mem://<box>/<path>``, its objects in :data:`HELD`; a box is lower-case."""

    kind: ClassVar[str] = "mem"
    schemes: ClassVar[tuple[str, ...]] = ("mem",)
    shape: ClassVar[str] = "mem://box/path"

    @classmethod
    def url_problem(cls, url: str) -> str | None:
        return None if urlsplit(url).netloc.islower() else "its box must be lower-case (the toy store's rule)"

    @classmethod
    def login_in_clear(cls, user: Any, upload: Any) -> bool:
        return False

    @classmethod
    def from_settings(cls, url, auth, expiry, settings) -> origins.Origin:
        return origins.Origin(cls.kind, url, auth, expiry=expiry, region="mem-1",
                              credentials_file=str(settings.get("model_origin_credentials_file")))

    @classmethod
    def pull_problem(cls, origin) -> str | None:
        return None

    def __init__(self, origin: origins.Origin):
        self.origin = origin
        self.held = HELD.setdefault(origin.url, {})

    def check(self, write: bool = True) -> None:
        CALLS.append(f"check write={write}")

    def findings(self) -> list[origins.Finding]:
        return []

    def root_url(self) -> str | None:
        return None

    def sizes(self, shas: set[str]) -> dict[str, int]:
        return {s: len(self.held[self.origin.object_key(s)]) for s in shas if self.origin.object_key(s) in self.held}

    def has(self, key: str) -> bool:
        return key in self.held

    def put_file(self, path: Path, sha: str) -> None:
        CALLS.append(f"put_file {sha}")
        self.held[self.origin.object_key(sha)] = Path(path).read_bytes()

    def put_bytes(self, key: str, data: bytes) -> None:
        CALLS.append(f"put_bytes {key}")
        self.held[key] = data

    def urls(self, shas: list[str]) -> dict[str, str]:
        return {s: f"http://127.0.0.1:9/mem/{s}" for s in shas}

    def host_fetch_config(self) -> tuple[str, str] | None:
        return ("/etc/tritonfleet/mem-credentials", self.origin.region or "")


@pytest.fixture
def mem(monkeypatch):
    monkeypatch.setitem(origins.STORES, "mem", MemStore)  # the one line a new store adds
    for cache in (origins._published, origins._checked, origins._stores):
        cache.clear()
    HELD.clear()
    CALLS.clear()
    yield
    for cache in (origins._published, origins._checked, origins._stores):
        cache.clear()


def settings(**kw) -> dict:
    return {**DEFAULTS, "model_origin_auth": "host", **kw}


def refusals(url: str) -> list[str]:
    return [p.why for p in check.problems("gpu1", {"model_origin": url}, lambda k: "here", GPU_CLASSES)]


def test_the_settings_check_takes_the_new_stores_url_and_its_rule_from_the_table(mem):
    assert refusals("mem://box/fleet") == []
    [why] = refusals("mem://BOX/fleet")
    assert why.endswith(": its box must be lower-case (the toy store's rule)"), why
    assert "mem://..." in why  # the schemes the check lists come from the table
    with pytest.raises(origins.UsageError, match="box must be lower-case"):
        origins.from_settings(settings(model_origin="mem://BOX/fleet"))


def test_without_its_table_line_the_store_is_unknown():
    assert "mem" not in origins.STORES
    assert refusals("mem://box/fleet")
    with pytest.raises(origins.UsageError, match="neither s3://bucket/prefix nor http"):
        origins.from_settings(settings(model_origin="mem://box/fleet"))


@given(box=st.text("abcXYZ09-", min_size=1, max_size=8))
def test_the_load_check_and_the_origin_agree_on_the_new_stores_urls(box):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(origins.STORES, "mem", MemStore)
        url = f"mem://{box}/fleet"
        try:
            origins.from_settings(settings(model_origin=url))
            refused = False
        except origins.UsageError:
            refused = True
        assert bool(refusals(url)) == refused == (not box.islower())


def test_preflight_publishing_and_the_host_fetch_go_through_the_new_store(mem, tmp_path, monkeypatch):
    data = settings(model_origin="mem://box/fleet")
    # pre-flight's check asks the store (this machine publishes: write=True)
    monkeypatch.setattr(preflight.access, "current", lambda: data)
    monkeypatch.setattr(preflight, "host", SimpleNamespace(name="gpu1"))
    preflight.check_model_origin()
    assert CALLS == ["check write=True"]
    origin = origins.from_settings(data)
    assert isinstance(origins.store_for(origin), MemStore)

    # publishing: the objects and then the manifest go through the store
    (tmp_path / "m").mkdir()
    (tmp_path / "m/config.pbtxt").write_bytes(b"name: 'm'\n")
    sha = hashlib.sha256(b"name: 'm'\n").hexdigest()
    manifest = {"m/": [0, ""], "m/config.pbtxt": [10, sha]}
    origins.publish(origin, tmp_path, manifest, "r1")
    assert CALLS[1:] == [f"put_file {sha}", "put_bytes fleet/releases/r1.json"]
    assert HELD["mem://box/fleet"][f"fleet/objects/sha256/{sha}"] == b"name: 'm'\n"

    # the host-side fetch: its URLs and its signing come from the store
    sent = {}

    def run_shell_command(command, print_output=False, **kw):
        sent["script"], sent["stdin"] = str(command), kw["_stdin"]
        return True, SimpleNamespace(stdout_lines=[f"verified {sha} 10", "placed 1"], stderr_lines=[])

    monkeypatch.setattr(stream, "connector_arguments", lambda: {})
    host = SimpleNamespace(name="gpu1", print_prefix="[gpu1] ", run_shell_command=run_shell_command)
    assert ops._fetch_objects(None, host, str(tmp_path), manifest, ["m/config.pbtxt"], origin,
                              "/opt/triton", "r1")
    assert f"o {sha} 10 http://127.0.0.1:9/mem/{sha}" in sent["stdin"]
    assert ". /etc/tritonfleet/mem-credentials" in sent["script"] and "aws:amz:%s:s3" in sent["script"]
    assert "mem-1" in sent["script"]


@pytest.mark.parametrize("loader", ["tritonfleet.inventory.roster", "tritonfleet.preflight"])
def test_the_modules_that_run_the_settings_check_fill_the_table(loader):
    """The table is filled by tritonfleet.model_repo.origin, which the settings layer cannot
    import: each module that runs the settings check imports it (a fresh interpreter)."""
    code = (f"import {loader}; from tritonfleet.settings import origin_stores as t; "
            "print(sorted((s, c.__name__) for s, c in t.STORES.items()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[('http', 'HttpStore'), ('https', 'HttpStore'), ('s3', 'S3Store')]"


# --------------------------------------------------------------------------- no kind checks elsewhere

#: the stores' own modules: the only places that may decide by a kind or scheme name
STORE_MODULES = {"tritonfleet/model_repo/s3_store.py", "tritonfleet/model_repo/http_store.py"}
ORIGIN_MODULES = ("tritonfleet.model_repo.origin", "tritonfleet.model_repo.origin_store",
                  "tritonfleet.settings.origin_stores", "tritonfleet.model_repo.pull_publish")


def _names() -> set[str]:
    return {name for store in set(origins.STORES.values()) for name in (store.kind, *store.schemes)}


def kind_checks(source: str, names: set[str]) -> list[int]:
    """Lines of ``source`` that compare with a store's kind or scheme (``== "s3"``, ``in ("http",
    "https")``, ``.kind == ...``) or test a URL's prefix against one (``startswith("http://")``)."""
    found = []

    def literals(node) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(literals(e) for e in node.elts)) if node.elts else set()
        return set()

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(literals(s) & names for s in sides) or any(
                    isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides):
                found.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
              and any(v.split(":")[0] in names for a in node.args for v in literals(a))):
            found.append(node.lineno)
    return found


def _origin_users() -> dict[str, str]:
    """{path: source} of every module that deals with the model origin (the settings layer,
    `tritonfleet check`'s wiring, and every module that imports the origin), the stores' own
    excepted."""
    out = {}
    for p in sorted((ROOT / "tritonfleet").rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        near = rel.startswith(("tritonfleet/settings/", "tritonfleet/fleet/wiring/"))
        if rel not in STORE_MODULES and (near or any(m in ORIGIN_MODULES for _, m in imported(p))):
            out[rel] = p.read_text()
    return out


def test_no_module_but_a_stores_own_checks_the_kind():
    names = _names()
    assert {"s3", "http", "https"} <= names
    bad = [f"{rel}:{line}" for rel, text in _origin_users().items() for line in kind_checks(text, names)]
    assert not bad, ("a decision by model origin kind outside the stores' modules: make it a method of the "
                     f"store (tritonfleet.model_repo.origin_store.OriginStore): {bad}")


@pytest.mark.parametrize("line", ['if origin.kind == "s3" and origin.auth == "host":',
                                  'if urlsplit(u).scheme in ("http", "https"):',
                                  'if str(u).startswith(("http://", "https://")):'])
def test_the_kind_check_scan_sees_the_forms_it_forbids(line):
    assert kind_checks(f"{line}\n    pass\n", _names()) == [1]
