"""The release's torrent (tritonfleet.model_repo.torrent): BitTorrent's encoding, pieces over
objects laid end to end, the web seed's URL, who seeds."""

from __future__ import annotations

import hashlib
import io

from hypothesis import given
from hypothesis import strategies as st

from tritonfleet.model_repo import torrent


def test_bencode_is_bep3s():
    assert torrent.bencode({"spam": ["a", 1], "cow": b"moo"}) == b"d3:cow3:moo4:spaml1:ai1eee"
    assert torrent.bencode(-3) == b"i-3e" and torrent.bencode("") == b"0:"


@given(st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=6), st.sampled_from([16384, 32768]))
def test_pieces_are_the_sha1_of_the_objects_laid_end_to_end(blobs, piece):
    objs = {hashlib.sha256(b).hexdigest(): b for b in blobs}
    if not any(objs.values()):
        return
    t = torrent.make({s: len(b) for s, b in objs.items()}, lambda s: io.BytesIO(objs[s]), piece)
    stream = b"".join(objs[s] for s in sorted(objs) if objs[s])
    want = b"".join(hashlib.sha1(stream[i:i + piece]).digest() for i in range(0, len(stream), piece))
    assert t.info["pieces"] == want
    assert [f["path"][0] for f in t.info["files"]] == list(t.files) == sorted(s for s in objs if objs[s])
    # the swarm's name does not depend on the tracker or the web seed
    assert torrent.bencode(t.info) in t.metainfo("http://t/announce", "http://o/objects/")
    assert hashlib.sha1(torrent.bencode(t.info)).hexdigest() == t.info_hash


@given(st.lists(st.binary(min_size=1, max_size=2000), min_size=1, max_size=4),
       st.sampled_from([("sha256", ""), ("blobs", "sha256:")]))
def test_a_layout_names_the_files_and_not_the_pieces(blobs, layout):
    """An image's torrent (``blobs/sha256:<hex>``, the registry's blob URLs) and a release's
    (``sha256/<hex>``) of the same bytes: the same pieces, the same files in the same order, each
    path the layout's; only the name and paths (so the info hash) differ."""
    objs = {hashlib.sha256(b).hexdigest(): b for b in blobs}
    name, prefix = layout
    plain = torrent.make({s: len(b) for s, b in objs.items()}, lambda s: io.BytesIO(objs[s]), 16384)
    laid = torrent.make({s: len(b) for s, b in objs.items()}, lambda s: io.BytesIO(objs[s]), 16384, name, prefix)
    assert laid.info["pieces"] == plain.info["pieces"] and laid.files == plain.files
    assert laid.info["name"] == name and [f["path"] for f in laid.info["files"]] == [[prefix + s] for s in laid.files]
    assert (laid.info_hash == plain.info_hash) == (layout == ("sha256", ""))


def test_web_seed_only_from_a_plain_object_url():
    sha = "ab" * 32
    assert torrent.web_seed(f"http://o:8080/models/objects/sha256/{sha}", sha) == "http://o:8080/models/objects/"
    assert torrent.web_seed(f"https://s3/b/objects/sha256/{sha}?X-Amz-Signature=1", sha) is None
    assert torrent.web_seed("http://o/elsewhere", sha) is None


def test_seeds_without_topology_one_for_the_wave():
    assert torrent.seeds([("b", None, None), ("a", None, None), ("c", None, None)]) == {"a"}


def test_seeds_one_per_zone_unless_the_inventory_names_them():
    hosts = [("r1-a", "r1", None), ("r1-b", "r1", None), ("r2-a", "r2", False), ("r2-b", "r2", None),
             ("r3-a", "r3", None), ("r3-b", "r3", True), ("r3-c", "r3", True)]
    assert torrent.seeds(hosts) == {"r1-a", "r2-b", "r3-b", "r3-c"}


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from([None, "z1", "z2"]),
                          st.sampled_from([None, True, False])), unique_by=lambda h: h[0], min_size=1))
def test_every_zone_with_a_willing_host_has_a_seed(hosts):
    chosen = torrent.seeds(hosts)
    for zone in {z for _, z, _ in hosts}:
        members = [(n, s) for n, z, s in hosts if z == zone]
        if any(s is not False for _, s in members):
            assert any(n in chosen for n, _ in members)
    assert not any(n in chosen for n, _, s in hosts if s is False)
