"""`tritonfleet check`: everything an operator wired around the fleet, checked from the control
machine without touching a host (no SSH): the inventory and its settings, the model origin, the
image mirror, pull mode's origin and signing key, Prometheus's and Alertmanager's files, the
quarantine receiver and the load balancer's runtime API.

A check is a function of :class:`Wiring` that returns :class:`Row` s (ok / warn / fail, what it
found, the fix); :data:`CHECKS` is their table, in the order they run and print. Adding a check is
one function and one line there. Read-side only: nothing here imports operations or steps
(tests/unit/test_layers.py), and nothing changes a host. The one write is to the model origin:
the empty object under its own sha256 (content-addressed, so harmless), which proves uploads work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import TritonfleetError, UsageError
from ..model_repo import origin as origins
from ..serving import drain
from ..settings.mirrored import unpinned_images
from . import pull
from .inventory import FleetHost

OK, WARN, FAIL = "ok", "warn", "fail"
#: the quarantine receiver's bearer token, where the tunable quarantine_token_file is not set
DEFAULT_TOKEN_FILE = "/etc/tritonfleet/quarantine.token"
#: sha256 of no bytes: the object the origin's write check puts (any release may hold it)
EMPTY_SHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
GROUP_DATA = "inventories/group_data/all.py"


@dataclass(frozen=True)
class Row:
    """One finding: ``status`` ok / warn / fail, the ``check`` it belongs to, ``what`` was found
    and the ``fix`` ("" when there is nothing to do)."""

    status: str
    check: str
    what: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Wiring:
    """What `tritonfleet check` was given: the loaded hosts (None: the inventory did not load,
    ``load_rows`` say why) and the paths the inventory does not know."""

    inventory: str
    hosts: list[FleetHost] | None
    load_rows: list[Row] = field(default_factory=list)
    pull_origin: Path | None = None
    sign_key: Path | None = None
    prometheus_dir: Path | None = None
    timeout: float = 5.0


def _hosts_text(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")


def grouped(check: str, found: list[tuple[str, str, str, str]]) -> list[Row]:
    """Rows of per-host findings ``(host, status, what, fix)``: hosts with the same finding on
    one row (``what (hosts: a, b)``), in the order first found."""
    by: dict[tuple[str, str, str], list[str]] = {}
    for host, status, what, fix in found:
        by.setdefault((status, what, fix), []).append(host)
    return [Row(status, check, f"{what} (hosts: {_hosts_text(names)})", fix) for (status, what, fix), names in by.items()]


def _distinct(hosts: list[FleetHost], key: Callable[[FleetHost], Any]) -> dict[Any, list[FleetHost]]:
    out: dict[Any, list[FleetHost]] = {}
    for h in hosts:
        value = key(h)
        if value:
            out.setdefault(value, []).append(h)
    return out


def http_get(url: str, timeout: float, headers: dict[str, str] | None = None,
             method: str = "GET", limit: int = 2000) -> tuple[int | None, str]:
    """(HTTP status, body's start) of a request to ``url`` with no proxy; (None, why) when
    nothing answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        req = urllib.request.Request(url, headers=headers or {}, method=method)
        with opener.open(req, timeout=timeout) as r:
            return r.status, r.read(limit).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(limit).decode(errors="replace")
    except (OSError, ValueError) as e:
        return None, str(getattr(e, "reason", e))


# --------------------------------------------------------------------------- inventory

def inventory_rows(w: Wiring) -> list[Row]:
    """The inventory and every setting load (tritonfleet.fleet.inventory, tritonfleet.settings.check):
    one row a refusal, from the loader's own message."""
    if w.hosts is None:
        return w.load_rows
    return [Row(OK, "inventory", f"{w.inventory}: {len(w.hosts)} host(s), every setting accepted")]


def load_rows(inventory: str, error: TritonfleetError) -> list[Row]:
    """The loader's refusal as rows: one a refused setting (the settings check's lines)."""
    lines = str(error).splitlines()
    if len(lines) > 1 and lines[0].startswith("settings refused"):
        return [Row(FAIL, "inventory", line.strip(), f"change the setting where the line says ({inventory}, "
                    "its group data or --data)") for line in lines[1:] if line.strip()]
    return [Row(FAIL, "inventory", str(error), f"fix {inventory} (or its group data) as the message says")]


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
    names = f" (hosts: {_hosts_text([h.name for h in hosts])})"
    try:
        st = origins.store(o)
    except UsageError as e:
        return [Row(FAIL, "model origin", f"{where}: {e}", "as the message says")]
    rows = []
    if o.kind == "s3":
        import boto3

        if boto3.session.Session().get_credentials() is None:
            return [Row(FAIL, "model origin", f"{where}: this machine has no S3 credentials (boto3 found none)",
                        "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, write ~/.aws/credentials, or give "
                        "this machine an instance role that may read and write the bucket")]
        if o.auth == "host":
            rows.append(Row(WARN, "model origin", f"{where}: the hosts sign their own requests with the credentials "
                            f"in {o.credentials_file}: not checked here (no SSH){names}",
                            "make sure every host has that file (a fetch names a missing one)"))
    try:
        st.check()
    except origins.OriginError as e:
        return [*rows, Row(FAIL, "model origin", f"{e}{names}", "make the model origin reachable from this machine "
                           "and the hosts (or set model_origin = None to push releases over SSH)")]
    if o.kind == "http":
        status, body = http_get(f"{o.base}/", timeout, method="HEAD")
        if status in (404, 410) or (status or 0) >= 500:
            return [*rows, Row(FAIL, "model origin", f"{where}: HEAD {o.base}/ answers HTTP {status}: "
                               f"{'no such path on the server' if status in (404, 410) else 'a server error'}{names}",
                               "correct model_origin's path (the directory that holds objects/ and releases/), "
                               "or the server's configuration for it")]
    try:
        if o.kind == "http":
            st._put(st._object(st.upload, EMPTY_SHA), b"")
        else:
            st.put_bytes(o.object_key(EMPTY_SHA), b"")
    except origins.OriginError as e:
        return [*rows, Row(FAIL, "model origin", f"{where}: uploads are refused: {e}",
                           "let this machine write objects/ and releases/ (nginx: dav_methods PUT; "
                           "create_full_put_path on; S3: s3:PutObject on the prefix)")]
    rows.append(Row(OK, "model origin", f"{where}: answers, and takes uploads{names}"))
    return rows + _published_rows(o, st, hosts, timeout)


def _published_rows(o: origins.Origin, st: Any, hosts: list[FleetHost], timeout: float) -> list[Row]:
    """The local model repository's release for each host: when its manifest is on the origin,
    every object it names is there with its size."""
    from ..model_repo import render

    releases: dict[str, tuple[dict, list[str]]] = {}
    for h in hosts:
        try:
            _, manifest, rid = render.host_repository(h, h.get("gpu_count"))
        except (OSError, ValueError, TritonfleetError) as e:
            return [Row(WARN, "model origin", f"the local model repository cannot be read: {e}",
                        "tritonfleet validate says what is wrong with it")]
        releases.setdefault(rid, (manifest, []))[1].append(h.name)
    rows = []
    for rid, (manifest, names) in releases.items():
        if not _has_manifest(o, st, rid, timeout):
            rows.append(Row(WARN, "model origin", f"release {rid[:12]} of the local model repository is not on "
                            f"{o.url} yet (hosts: {_hosts_text(names)})", "the next deploy uploads it"))
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
            rows.append(Row(FAIL, "model origin", f"release {rid[:12]} is on {o.url}, but {len(bad)} of its "
                            f"{len(wanted)} objects are missing or the wrong size: {shown}",
                            "run the deploy again (it uploads what the origin lacks), or restore the objects"))
        else:
            rows.append(Row(OK, "model origin", f"release {rid[:12]}: its manifest and all {len(wanted)} objects are "
                            f"on {o.url} with their sizes"))
    return rows


def _has_manifest(o: origins.Origin, st: Any, rid: str, timeout: float) -> bool:
    if o.kind == "http":
        return http_get(f"{o.base}/{origins.RELEASES}/{rid}.json", timeout, method="HEAD")[0] == 200
    try:
        st.client.head_object(Bucket=o.bucket, Key=o.manifest_key(rid))
        return True
    except st._errors():
        return False


# --------------------------------------------------------------------------- image mirror

MIRROR_FORM = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(:\d{1,5})?$")


def image_mirror_rows(w: Wiring) -> list[Row]:
    """image_mirror: written as an image reference names a registry (host[:port]), the name
    resolving here, and every image through it pinned by digest (pre-flight's rule)."""
    if not w.hosts:
        return []
    found = []
    for mirror, hosts in _distinct(w.hosts, lambda h: h.get("image_mirror")).items():
        for h in hosts:
            for key, value, upstream in unpinned_images(h):
                found.append((h.name, FAIL, f"{key} {value} goes through the image mirror {mirror} but is not pinned "
                              "by digest", f"set {key} = \"{upstream}@sha256:<digest>\" in {GROUP_DATA} (`skopeo "
                              f"inspect docker://{upstream}` prints the digest)"))
        m = MIRROR_FORM.match(str(mirror))
        if not m:
            found += [(h.name, FAIL, f"image_mirror {mirror!r} is not host[:port] (an image reference names the "
                       "registry without a scheme or path)", f"image_mirror = \"mirror.example:5000\" in {GROUP_DATA}")
                      for h in hosts]
            continue
        name = m.group(1).strip("[]")
        try:
            socket.getaddrinfo(name, None)
            found += [(h.name, OK, f"image_mirror {mirror}: resolves here", "") for h in hosts]
        except OSError as e:
            found += [(h.name, WARN, f"image_mirror {mirror}: {name} does not resolve on this machine ({e})",
                       "make sure the hosts resolve it (DNS or /etc/hosts)") for h in hosts]
    if not found:
        return [Row(OK, "image mirror", "image_mirror is not set: the hosts pull from the registry itself")]
    return grouped("image mirror", found)


# --------------------------------------------------------------------------- pull mode

def pull_origin_rows(w: Wiring) -> list[Row]:
    """--pull-origin DIR (and --sign-key KEY): the origin's layout, the key's two halves, each
    host's pointer (readable, for that host, naming a release that is there, signed by KEY) and
    report (readable). The one place that reads tritonfleet.fleet.pull's files for the check."""
    if w.pull_origin is None:
        return []
    c = "pull origin"
    try:
        origin = pull.Origin(w.pull_origin)
    except UsageError as e:
        return [Row(FAIL, c, str(e), "give the directory the hosts' origin URL serves")]
    rows = [Row(WARN, c, f"{w.pull_origin} has no {d}/", f"`tritonfleet {how}` writes it")
            for d, how in (("releases", "pull publish"), ("desired", "pull publish"), ("dist", "bootstrap"))
            if not (w.pull_origin / d).is_dir()]
    signers = None
    if w.sign_key is not None:
        key_rows, signers = _key_halves(w.sign_key)
        rows += key_rows
    found = []
    reports = pull.Reports(origin)
    try:
        for h in w.hosts or []:
            found += _pointer_findings(origin, h.name, signers, w.sign_key)
            if origin.report(h.name).exists() and reports.read(h.name) is None:
                found.append((h.name, FAIL, f"reports/{h.name}.json is unreadable (not a JSON report of this host)",
                              "the host writes it again at its next run; only the hosts may PUT under reports/"))
            elif not origin.report(h.name).exists():
                found.append((h.name, WARN, "no report yet", "a host reports after its first run (bootstrap it)"))
    finally:
        if signers:
            signers.unlink()
    rows += grouped(c, found)
    if not any(r.status != OK for r in rows):
        rows.append(Row(OK, c, f"{w.pull_origin}: laid out, {len(w.hosts or [])} pointer(s) and report(s) read"))
    return rows


def _key_halves(key: Path) -> tuple[list[Row], Path | None]:
    """The public half derived from KEY (ssh-keygen -y) against KEY.pub; a signers file for it."""
    c = "pull origin"
    res = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=30)
    if res.returncode != 0:
        fix = (f"give the private half to --sign-key ({str(key)[:-4]}, not {key})" if str(key).endswith(".pub") else
               "give the private half to --sign-key (a key with a passphrase: compare `ssh-keygen -y -f KEY` with "
               "KEY.pub by hand)")
        return [Row(FAIL, c, f"signing key {key}: ssh-keygen -y cannot read it: {res.stderr.strip()[-200:]}", fix)], None
    derived = res.stdout.split()[:2]
    pub = Path(f"{key}.pub")
    rows = []
    if pub.is_file() and pub.read_text().split()[:2] != derived:
        rows.append(Row(FAIL, c, f"{pub} is not the public half of {key} (ssh-keygen -y {key} derives another key)",
                        f"write it again: ssh-keygen -y -f {key} > {pub}; hosts bootstrapped with the wrong "
                        "half trust no pointer (bootstrap them again)"))
    fd, name = tempfile.mkstemp(prefix="tritonfleet-signers-")
    with os.fdopen(fd, "w") as f:
        f.write(f'{pull.SIGNER} namespaces="{pull.NAMESPACE}" {" ".join(derived)}\n')
    return rows, Path(name)


def _pointer_findings(origin: pull.Origin, host: str, signers: Path | None,
                      key: Path | None) -> list[tuple[str, str, str, str]]:
    path = origin.pointer(host)
    if not path.exists():
        return [(host, WARN, "no pointer under desired/", "tritonfleet pull publish (or pull rollout) writes it")]
    payload = pull.read_pointer(path)
    if not isinstance(payload, dict) or payload.get("host") != host or not payload.get("release"):
        return [(host, FAIL, f"desired/{host}.json is not a release pointer for this host",
                 "publish it again: tritonfleet pull publish")]
    out = []
    if not origin.release(str(payload["release"])).is_file():
        out.append((host, FAIL, f"its pointer names release {str(payload['release'])[:12]}, which is not under "
                    "releases/", "publish the release again (tritonfleet pull publish)"))
    if signers is not None:
        doc = json.loads(path.read_bytes())
        why = pull.verify(signers, str(doc.get("payload", "")).encode(), str(doc.get("signature", "")))
        if why:
            out.append((host, FAIL, f"its pointer's signature does not verify against {key}: {why.splitlines()[-1]}",
                        f"publish again with the key the hosts trust (tritonfleet pull publish --sign-key {key})"))
    return out


# --------------------------------------------------------------------------- Prometheus, Alertmanager

def prometheus_rows(w: Wiring) -> list[Row]:
    """--prometheus-dir DIR (what `tritonfleet prometheus --out DIR` wrote): promtool and amtool
    accept the files, prometheus.yml sends alerts to an Alertmanager when alertmanager.yml routes
    quarantine alerts (otherwise nothing is ever quarantined), Alertmanager's address is host:port
    in prometheus.yml and the webhook a URL in alertmanager.yml, and each answers."""
    if w.prometheus_dir is None:
        return []
    import yaml

    c, d = "prometheus", w.prometheus_dir
    prom, am = d / "prometheus.yml", d / "alertmanager.yml"
    if not prom.is_file():
        return [Row(FAIL, c, f"{d} has no prometheus.yml", f"tritonfleet prometheus {w.inventory} --out {d}")]
    rows = [_tool_row(c, "promtool", ["check", "config", str(prom)], prom)]
    targets: list[str] = []
    try:
        config = yaml.safe_load(prom.read_text()) or {}
        for am_cfg in (config.get("alerting") or {}).get("alertmanagers") or []:
            for sc in am_cfg.get("static_configs") or []:
                targets += [str(t) for t in sc.get("targets") or []]
    except (yaml.YAMLError, AttributeError) as e:
        return [*rows, Row(FAIL, c, f"{prom}: not a Prometheus configuration: {e}", "write it again with tritonfleet "
                           "prometheus")]
    hooks: list[str] = []
    if am.is_file():
        rows.append(_tool_row(c, "amtool", ["check-config", str(am)], am))
        try:
            for rec in (yaml.safe_load(am.read_text()) or {}).get("receivers") or []:
                hooks += [str(h.get("url")) for h in rec.get("webhook_configs") or []]
        except (yaml.YAMLError, AttributeError) as e:
            rows.append(Row(FAIL, c, f"{am}: not an Alertmanager configuration: {e}", "write it again"))
    fix_both = (f"tritonfleet prometheus {w.inventory} --out {d} --alertmanager HOST:PORT --quarantine-url "
                "http://HOST:PORT")
    if hooks and not targets:
        rows.append(Row(FAIL, c, f"alertmanager.yml routes quarantine alerts to {hooks[0]}, but prometheus.yml has no "
                        "alerting: section: no alert reaches Alertmanager, nothing is ever quarantined", fix_both))
    for t in targets:
        if "://" in t or "/" in t:
            rows.append(Row(FAIL, c, f"prometheus.yml names Alertmanager as {t!r}: Prometheus wants host:port there",
                            f"--alertmanager {t.split('://')[-1].split('/')[0]} (host:port)"))
            continue
        status, why = http_get(f"http://{t}/-/ready", w.timeout)
        rows.append(Row(OK, c, f"Alertmanager at {t} answers") if status == 200 else
                    Row(FAIL, c, f"Alertmanager at {t} (prometheus.yml's alerting) does not answer: "
                        f"{why if status is None else f'HTTP {status}'}",
                        "start Alertmanager there, or give its address to --alertmanager"))
    for hook in hooks:
        if not re.match(r"^https?://[^/]+", hook):
            rows.append(Row(FAIL, c, f"alertmanager.yml's webhook {hook!r} is not a URL: Alertmanager wants "
                            "http://host:port/alerts", "--quarantine-url http://HOST:PORT (a URL)"))
    for url in sorted({str(h.get("canary_prometheus_url")) for h in w.hosts or [] if h.get("canary_prometheus_url")}):
        status, why = http_get(f"{url.rstrip('/')}/-/ready", w.timeout)
        rows.append(Row(OK, c, f"Prometheus at {url} answers") if status == 200 else
                    Row(FAIL, c, f"Prometheus at {url} (canary_prometheus_url) does not answer: "
                        f"{why if status is None else f'HTTP {status}'}", "start it, or correct canary_prometheus_url"))
    return rows


def _tool_row(c: str, tool: str, args: list[str], path: Path) -> Row:
    exe = shutil.which(tool)
    if not exe:
        return Row(WARN, c, f"{tool} is not installed here: {path.name} was not checked by it",
                   f"install {tool} (Debian: {'prometheus' if tool == 'promtool' else 'prometheus-alertmanager'})")
    res = subprocess.run([exe, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if res.returncode != 0:
        said = (res.stderr.strip() or res.stdout.strip()).splitlines()
        return Row(FAIL, c, f"{tool} {' '.join(args[:-1])} refuses {path}: {' '.join(said[-2:])}",
                   f"write it again with tritonfleet prometheus, or correct {path.name}")
    return Row(OK, c, f"{tool} accepts {path}")


# --------------------------------------------------------------------------- quarantine receiver

def quarantine_rows(w: Wiring) -> list[Row]:
    """quarantine_url: the receiver answers, refuses a request without the bearer token and takes
    one with the token of quarantine_token_file (a file of mode 0600), and reads Alertmanager
    at a URL (its own events say when it cannot)."""
    if not w.hosts:
        return []
    rows = []
    by = _distinct(w.hosts, lambda h: h.get("quarantine_url") and (
        h.get("quarantine_url"), h.get("quarantine_token_file", DEFAULT_TOKEN_FILE)))
    if not by:
        return [Row(OK, "quarantine", "quarantine_url is not set: status does not ask a receiver")]
    for (url, token_file), hosts in by.items():
        rows += _receiver_rows(str(url).rstrip("/"), str(token_file), [h.name for h in hosts], w)
    return rows


def _receiver_rows(url: str, token_file: str, names: list[str], w: Wiring) -> list[Row]:
    c, api = "quarantine", f"{url}/v1/quarantine"
    status, body = http_get(api, w.timeout)
    if status is None:
        return [Row(FAIL, c, f"the quarantine receiver at {url} does not answer: {body} (hosts: {_hosts_text(names)})",
                    "start it (tritonfleet quarantine unit writes its systemd unit), or correct quarantine_url")]
    if status == 200:
        return [Row(FAIL, c, f"the receiver at {url} accepts requests without a token: anyone who reaches it can "
                    "hold every host", "upgrade/restart it (its token in quarantine_token_file)")]
    if status != 401:
        return [Row(FAIL, c, f"{api} answers HTTP {status}: not a quarantine receiver",
                    "correct quarantine_url (the receiver's http://host:port)")]
    try:
        st = os.stat(token_file)
        token = Path(token_file).read_text().strip()
    except OSError as e:
        return [Row(FAIL, c, f"the receiver at {url} wants a token, but {token_file} cannot be read: "
                    f"{e.strerror or e}", f"write the receiver's token into {token_file} (mode 0600), or set "
                    "quarantine_token_file")]
    rows = []
    if stat.S_IMODE(st.st_mode) & 0o077:
        rows.append(Row(FAIL, c, f"{token_file} is mode {stat.S_IMODE(st.st_mode):04o}: others can read the token",
                        f"chmod 600 {token_file}"))
    status, body = http_get(api, w.timeout, {"Authorization": f"Bearer {token}"}, limit=1 << 20)
    if status == 401:
        return [*rows, Row(FAIL, c, f"token refused: the receiver at {url} does not take the token in {token_file}",
                           f"write the receiver's token into {token_file}, or restart the receiver with it")]
    if status != 200:
        return [*rows, Row(FAIL, c, f"{api} with the token answers HTTP {status}", "look at the receiver's journal")]
    rows.append(Row(OK, c, f"the receiver at {url} answers, refuses requests without a token and takes {token_file}'s"))
    try:
        events = json.loads(body).get("events") or []
    except (ValueError, AttributeError):
        events = []
    for ev in events[-50:]:
        if isinstance(ev, dict) and ev.get("action") == "alertmanager" and "unknown url type" in str(ev.get("text")):
            rows.append(Row(FAIL, c, f"the receiver cannot read Alertmanager: {ev.get('text')}",
                            "its --alertmanager takes a URL (http://HOST:PORT), not host:port: fix the unit "
                            "(tritonfleet quarantine unit ... --alertmanager http://HOST:PORT)"))
            break
    return rows


# --------------------------------------------------------------------------- load balancer

def load_balancer_rows(w: Wiring) -> list[Row]:
    """lb = 'haproxy': every lb_haproxy_sockets answers `show info`, and each host's server is
    in its backend there (tritonfleet.serving.drain, the rollout's own reads)."""
    if not w.hosts:
        return []
    c = "load balancer"
    hap = [h for h in w.hosts if h.get("lb") == "haproxy"]
    rows = [Row(OK, c, f"lb = {lb}: its commands are not run by check (hosts: {_hosts_text([h.name for h in hs])})")
            for lb, hs in _distinct([h for h in w.hosts if h not in hap], lambda h: h.get("lb")).items()]
    if not hap:
        return rows or [Row(OK, c, "lb is not set: no load balancer is drained")]
    answering: dict[str, bool] = {}
    for sock in dict.fromkeys(s for h in hap for s in h.get("lb_haproxy_sockets") or []):
        try:
            info = drain.RuntimeAPI(sock, w.timeout).command("show info")
            answering[sock] = "Name:" in info
            rows.append(Row(OK, c, f"HAProxy's runtime API at {sock} answers") if answering[sock] else
                        Row(FAIL, c, f"{sock} answered `show info` with {info[:80]!r}: not HAProxy's runtime API",
                            "lb_haproxy_sockets names the `stats socket ... level admin` of HAProxy's global section"))
        except drain.DrainError as e:
            answering[sock] = False
            rows.append(Row(FAIL, c, f"{e}", "start HAProxy, or correct lb_haproxy_sockets (the `stats socket ... "
                            "level admin` of HAProxy's global section)"))
    found, served = [], []
    for h in hap:
        sockets = [s for s in h.get("lb_haproxy_sockets") or [] if answering.get(s)]
        if not h.get("lb_haproxy_sockets"):
            found.append((h.name, FAIL, "lb = 'haproxy' without lb_haproxy_sockets", f"set it in {GROUP_DATA}"))
            continue
        if len(sockets) < len(h.get("lb_haproxy_sockets")):
            continue  # said above, once a socket
        server = h.get("lb_haproxy_server") or h.name
        try:
            drain.HAProxy(sockets, str(h.get("lb_haproxy_backend")), str(server), w.timeout).state()
            served.append(h.name)
        except drain.DrainError as e:
            found.append((h.name, FAIL, str(e), "add the server to HAProxy's backend, or set lb_haproxy_backend / "
                          "lb_haproxy_server"))
    if served:
        rows.append(Row(OK, c, f"{len(served)} host(s) have their server in HAProxy's backend"))
    return rows + grouped(c, found)


#: the checks, in the order they run and print: (name, function)
CHECKS: list[tuple[str, Callable[[Wiring], list[Row]]]] = [
    ("inventory", inventory_rows),
    ("model origin", model_origin_rows),
    ("image mirror", image_mirror_rows),
    ("pull origin", pull_origin_rows),
    ("prometheus", prometheus_rows),
    ("quarantine", quarantine_rows),
    ("load balancer", load_balancer_rows),
]


def run(w: Wiring) -> list[Row]:
    """Every check's rows; a check that raises a TritonfleetError is one failed row of its own."""
    rows = []
    for name, fn in CHECKS:
        try:
            rows += fn(w)
        except TritonfleetError as e:
            rows.append(Row(FAIL, name, str(e), "as the message says"))
    return rows


def exit_status(rows: list[Row]) -> int:
    """0: nothing failed (warnings allowed); 1: some check failed."""
    return 1 if any(r.status == FAIL for r in rows) else 0


def table(rows: list[Row]) -> str:
    """One line a row: STATUS  CHECK  what, then the fix indented on the next line."""
    width = max((len(r.check) for r in rows), default=0)
    out = []
    for r in rows:
        out.append(f"{r.status.upper():<4}  {r.check:<{width}}  {r.what}")
        if r.fix and r.status != OK:
            out.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    return "\n".join(out)
