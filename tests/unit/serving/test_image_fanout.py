"""The image fan-out's host scripts as far as they run without a registry or Docker: the mirror
host's program on a store laid out as Distribution lays it out (the torrent of the pinned image's
blobs, every blob checked first), and the parsers (tritonfleet.serving.image_fanout)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tritonfleet.model_repo import torrent
from tritonfleet.serving import image_fanout as fan


def put(root: Path, data: bytes) -> str:
    h = hashlib.sha256(data).hexdigest()
    d = root / "docker/registry/v2/blobs/sha256" / h[:2] / h
    d.mkdir(parents=True, exist_ok=True)
    (d / "data").write_bytes(data)
    return "sha256:" + h


def store(root: Path, index: bool = False) -> tuple[str, dict[str, bytes]]:
    blobs = {"config": b'{"rootfs": {"diff_ids": []}}', "l1": bytes(range(256)) * 700, "l2": b"x" * 5000}
    digests = {k: put(root, v) for k, v in blobs.items()}
    man = {"schemaVersion": 2, "config": {"digest": digests["config"]},
           "layers": [{"digest": digests["l1"]}, {"digest": digests["l2"]}]}
    digest = put(root, json.dumps(man).encode())
    if index:
        other = {"digest": "sha256:" + "0" * 64, "platform": {"os": "linux", "architecture": "arm64"}}
        mine = {"digest": digest, "platform": {"os": "linux", "architecture": "amd64"}}
        digest = put(root, json.dumps({"schemaVersion": 2, "manifests": [other, mine]}).encode())
    return digest, {digests[k][7:]: v for k, v in blobs.items()}


WEB_SEED = "https://10.0.0.9:5000/v2/nvidia/tritonserver/"


def seed(root: Path, digest: str) -> dict:
    out = subprocess.run([sys.executable, "-c", fan.seed_program(), str(root), "nvidia/tritonserver", digest,
                          "http://10.0.0.9:6969/announce", "16384", WEB_SEED],
                         capture_output=True, text=True, check=True)
    return fan.parse_seed(out.stdout.splitlines())


def test_the_mirror_makes_the_torrent_of_the_pinned_images_blobs_from_its_store(tmp_path):
    digest, blobs = store(tmp_path, index=True)
    got = seed(tmp_path, digest)
    assert got["blobs"] == {h: len(v) for h, v in blobs.items()}
    assert [d for d, _ in got["manifests"]][0] == digest and len(got["manifests"]) == 2
    # the same torrent as the control machine's own code makes of the same files, laid out as the
    # registry's blob URLs below the web seed (SWARM_LAYOUT: where the hosts' swarm finds a blob)
    name, prefix = fan.SWARM_LAYOUT.split("/")
    want = torrent.make({h: len(v) for h, v in blobs.items()}, lambda h: __import__("io").BytesIO(blobs[h]), 16384,
                        name=name, prefix=prefix)
    assert got["info_hash"] == want.info_hash
    assert got["torrent"] == want.metainfo("http://10.0.0.9:6969/announce")
    assert got["seed_torrent"] == want.metainfo("http://10.0.0.9:6969/announce", WEB_SEED)
    for h in blobs:  # BEP 19: the web seed, the torrent's name, the file's path: the registry's blob URL
        path = want.info["name"] + "/" + want.info["files"][want.files.index(h)]["path"][0]
        assert WEB_SEED + path == f"https://10.0.0.9:5000/v2/nvidia/tritonserver/blobs/sha256:{h}"


def test_a_blob_the_store_holds_damaged_is_never_in_a_torrent(tmp_path):
    digest, blobs = store(tmp_path)
    h = next(h for h, v in blobs.items() if len(v) == 5000)
    (tmp_path / "docker/registry/v2/blobs/sha256" / h[:2] / h / "data").write_bytes(b"y" * 5000)
    got = seed(tmp_path, digest)
    assert got == {"skip": f"the mirror's copy of sha256:{h} does not hash to its digest"}
    assert not (tmp_path / fan.SEED_DIR / digest[7:] / "t.torrent").exists()


def test_an_image_the_store_lacks_has_no_torrent(tmp_path):
    got = seed(tmp_path, "sha256:" + "a" * 64)
    assert "skip" in got and "has no sha256:" in got["skip"]


@given(st.lists(st.sampled_from(["imgfan-blob x 1", "imgfan-manifest sha256:a YQ==", "noise", ""]), max_size=6))
def test_an_answer_without_a_torrent_is_a_skip(lines):
    assert "skip" in fan.parse_seed(lines)


def test_the_load_input_names_every_manifest_and_blob():
    text = fan.load_input([("sha256:" + "1" * 64, b"{}")], {"b" * 64: 3, "a" * 64: 9})
    assert text.splitlines() == [f"m sha256:{'1' * 64} e30=", f"b {'a' * 64}", f"b {'b' * 64}"]


def test_the_load_script_without_the_registry_binary_says_so_and_exits_0(tmp_path):
    """Run with sh up to its first check: a missing registry binary is said, never fatal."""
    script = fan.load_script(str(tmp_path), "nvidia/tritonserver", "sha256:" + "1" * 64, "m/x@sha256:1", 5079)
    out = subprocess.run(["sh", "-c", script], input="m sha256:" + "1" * 64 + " e30=\n", capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("imgfan-skip no registry binary")


def load(tmp_path: Path, monkeypatch, stdin: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The load script with a stand-in registry binary (it only leaves a mark when started) and its
    scratch directory under tmp_path; returns the run and the mark's path."""
    mark = tmp_path / "registry-started"
    binary = tmp_path / "docker-registry"
    binary.write_text(f"#!/bin/sh\ntouch {mark}\n")
    binary.chmod(0o755)
    monkeypatch.setattr(fan, "REGISTRY_BIN", str(binary))
    monkeypatch.setattr(fan, "HOST_BASE", str(tmp_path))
    (tmp_path / "objects").mkdir()
    script = fan.load_script(str(tmp_path / "objects"), "nvidia/tritonserver", "sha256:" + "1" * 64, "m/x@sha256:1", 5079)
    return subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, text=True), mark


def test_the_load_script_refuses_a_manifest_that_does_not_hash_to_its_digest(tmp_path, monkeypatch):
    """A manifest whose bytes are not those of its digest stops the load before any registry
    starts: nothing unchecked reaches Docker (the staging's pull through the mirror follows)."""
    said = "sha256:" + hashlib.sha256(b'{"schemaVersion": 2}').hexdigest()
    out, mark = load(tmp_path, monkeypatch, f"m {said} {base64.b64encode(b'{}').decode()}\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"imgfan-skip manifest {said} does not hash to its digest"
    assert not mark.exists()
    assert not list(tmp_path.glob("store.*")), "the scratch directory is removed"


def test_the_load_script_refuses_a_blob_the_swarm_did_not_bring(tmp_path, monkeypatch):
    text = b'{"schemaVersion": 2}'
    digest = "sha256:" + hashlib.sha256(text).hexdigest()
    out, mark = load(tmp_path, monkeypatch, f"m {digest} {base64.b64encode(text).decode()}\nb {'c' * 64}\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"imgfan-skip blob {'c' * 64} did not arrive"
    assert not mark.exists()
