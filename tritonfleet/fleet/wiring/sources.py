"""Where the hosts fetch from: the model origin and the image mirror."""

from __future__ import annotations

import re
import socket
from typing import Any

from ...core.errors import TritonfleetError, UsageError
from ...inventory.roster import FleetHost
from ...model_repo import origin as origins
from ...model_repo import render
from ...settings.mirrored import unpinned_images
from .rows import (
    FAIL,
    GROUP_DATA,
    OK,
    WARN,
    Row,
    Wiring,
    distinct,
    grouped,
    hosts_text,
    http_get,
)

# --------------------------------------------------------------------------- model origin


def model_origin_rows(w: Wiring) -> list[Row]:
    """Each model_origin the hosts name: its tunables, the client (boto3 for s3://), the
    credentials this machine uploads with, the origin answering (a path that does not exist on an
    HTTP origin included), uploads accepted, and the objects of the local model repository's
    release when its manifest is there."""
    if not w.hosts:
        return []
    rows, found = [], []
    by: dict[origins.Origin, list[FleetHost]] = {}
    for h in w.hosts:
        try:
            o = origins.from_settings(h)
        except UsageError as e:
            found.append((h.name, FAIL, str(e), f"set it in {GROUP_DATA} (docs/model-origin.md)"))
            continue
        if o:
            by.setdefault(o, []).append(h)
    rows += grouped("model origin", found)
    if not by and not found:
        return [Row(OK, "model origin", "model_origin is not set: releases go to the hosts over SSH")]
    for o, hosts in by.items():
        rows += _origin_rows(o, hosts, w.timeout)
    return rows


def _origin_rows(o: origins.Origin, hosts: list[FleetHost], timeout: float) -> list[Row]:
    where = f"model origin {o.url}"
    names = f" (hosts: {hosts_text([h.name for h in hosts])})"
    try:
        st = origins.store(o)
    except UsageError as e:
        return [Row(FAIL, "model origin", f"{where}: {e}", "as the message says")]
    rows: list[Row] = []
    for f in st.findings():  # what this machine can tell without asking the origin (its credentials)
        row = Row(FAIL if f.fatal else WARN, "model origin", f"{where}: {f.what}{names if f.hosts else ''}", f.fix)
        if f.fatal:
            return [*rows, row]
        rows.append(row)
    root = st.root_url()  # a typo in the path first, where the store has a URL that says so
    if root:
        status, body = http_get(root, timeout, method="HEAD")
        if status in (404, 410) or (status or 0) >= 500:
            return [
                *rows,
                Row(
                    FAIL,
                    "model origin",
                    f"{where}: HEAD {root} answers HTTP {status}: "
                    f"{'no such path on the server' if status in (404, 410) else 'a server error'}{names}",
                    "correct model_origin's path (the directory that holds objects/ and releases/), "
                    "or the server's configuration for it",
                ),
            ]
    try:
        st.check()  # reads, and takes uploads: the empty object PUT and read back (pre-flight's own check)
    except origins.OriginError as e:
        return [
            *rows,
            Row(
                FAIL,
                "model origin",
                f"{e}{names}",
                "as the message says; let this machine write objects/ and releases/ and the hosts read "
                "them (nginx: dav_methods PUT; create_full_put_path on; S3: s3:PutObject on the prefix)",
            ),
        ]
    rows.append(Row(OK, "model origin", f"{where}: answers, and takes uploads{names}"))
    return rows + _published_rows(o, st, hosts, timeout)


def _published_rows(o: origins.Origin, st: Any, hosts: list[FleetHost], timeout: float) -> list[Row]:
    """The local model repository's release for each host: when its manifest is on the origin,
    every object it names is there with its size."""
    releases: dict[str, tuple[dict, list[str]]] = {}
    for h in hosts:
        try:
            _, manifest, rid = render.host_repository(h, h.get("gpu_count"))
        except (OSError, ValueError, TritonfleetError) as e:
            return [
                Row(
                    WARN,
                    "model origin",
                    f"the local model repository cannot be read: {e}",
                    "tritonfleet validate says what is wrong with it",
                )
            ]
        releases.setdefault(rid, (manifest, []))[1].append(h.name)
    rows = []
    for rid, (manifest, names) in releases.items():
        if not _has_manifest(o, st, rid):
            rows.append(
                Row(
                    WARN,
                    "model origin",
                    f"release {rid[:12]} of the local model repository is not on "
                    f"{o.url} yet (hosts: {hosts_text(names)})",
                    "the next deploy uploads it",
                )
            )
            continue
        wanted = origins.objects_of(manifest)
        try:
            have = st.sizes(set(wanted))
        except origins.OriginError as e:
            rows.append(Row(FAIL, "model origin", str(e), "make the origin readable from this machine"))
            continue
        bad = origins.missing(wanted, have)
        if bad:
            shown = ", ".join(f"{wanted[s][1]} ({s[:12]}: {'wrong size' if s in have else 'missing'})" for s in bad[:3])
            rows.append(
                Row(
                    FAIL,
                    "model origin",
                    f"release {rid[:12]} is on {o.url}, but {len(bad)} of its "
                    f"{len(wanted)} objects are missing or the wrong size: {shown}",
                    "run the deploy again (it uploads what the origin lacks), or restore the objects",
                )
            )
        else:
            rows.append(
                Row(
                    OK,
                    "model origin",
                    f"release {rid[:12]}: its manifest and all {len(wanted)} objects are on {o.url} with their sizes",
                )
            )
    return rows


def _has_manifest(o: origins.Origin, st: Any, rid: str) -> bool:
    try:
        return bool(st.has(o.manifest_key(rid)))
    except origins.OriginError:
        return False


# --------------------------------------------------------------------------- image mirror

MIRROR_FORM = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(:\d{1,5})?$")


def image_mirror_rows(w: Wiring) -> list[Row]:
    """image_mirror: written as an image reference names a registry (host[:port]), the name
    resolving here, and every image through it pinned by digest (pre-flight's rule)."""
    if not w.hosts:
        return []
    found = []
    for mirror, hosts in distinct(w.hosts, lambda h: h.get("image_mirror")).items():
        for h in hosts:
            for key, value, upstream in unpinned_images(h):
                found.append(
                    (
                        h.name,
                        FAIL,
                        f"{key} {value} goes through the image mirror {mirror} but is not pinned by digest",
                        f'set {key} = "{upstream}@sha256:<digest>" in {GROUP_DATA} (`skopeo '
                        f"inspect docker://{upstream}` prints the digest)",
                    )
                )
        m = MIRROR_FORM.match(str(mirror))
        if not m:
            found += [
                (
                    h.name,
                    FAIL,
                    f"image_mirror {mirror!r} is not host[:port] (an image reference names the "
                    "registry without a scheme or path)",
                    f'image_mirror = "mirror.example:5000" in {GROUP_DATA}',
                )
                for h in hosts
            ]
            continue
        name = m.group(1).strip("[]")
        try:
            socket.getaddrinfo(name, None)
            found += [(h.name, OK, f"image_mirror {mirror}: resolves here", "") for h in hosts]
        except OSError as e:
            found += [
                (
                    h.name,
                    WARN,
                    f"image_mirror {mirror}: {name} does not resolve on this machine ({e})",
                    "make sure the hosts resolve it (DNS or /etc/hosts)",
                )
                for h in hosts
            ]
    if not found:
        return [Row(OK, "image mirror", "image_mirror is not set: the hosts pull from the registry itself")]
    return grouped("image mirror", found)
