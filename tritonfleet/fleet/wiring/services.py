"""The services around the fleet: Prometheus and Alertmanager, the quarantine receiver, HAProxy's
runtime API."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import yaml

from ...serving import drain
from .rows import (
    DEFAULT_TOKEN_FILE,
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

# --------------------------------------------------------------------------- Prometheus, Alertmanager


def prometheus_rows(w: Wiring) -> list[Row]:
    """--prometheus-dir DIR (what `tritonfleet prometheus --out DIR` wrote): promtool and amtool
    accept the files, prometheus.yml sends alerts to an Alertmanager when alertmanager.yml routes
    quarantine alerts (otherwise nothing is ever quarantined), Alertmanager's address is host:port
    in prometheus.yml and the webhook a URL in alertmanager.yml, and each answers."""
    if w.prometheus_dir is None:
        return []
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
        return [
            *rows,
            Row(FAIL, c, f"{prom}: not a Prometheus configuration: {e}", "write it again with tritonfleet prometheus"),
        ]
    hooks: list[str] = []
    if am.is_file():
        rows.append(_tool_row(c, "amtool", ["check-config", str(am)], am))
        try:
            for rec in (yaml.safe_load(am.read_text()) or {}).get("receivers") or []:
                hooks += [str(h.get("url")) for h in rec.get("webhook_configs") or []]
        except (yaml.YAMLError, AttributeError) as e:
            rows.append(Row(FAIL, c, f"{am}: not an Alertmanager configuration: {e}", "write it again"))
    fix_both = (
        f"tritonfleet prometheus {w.inventory} --out {d} --alertmanager HOST:PORT --quarantine-url http://HOST:PORT"
    )
    if hooks and not targets:
        rows.append(
            Row(
                FAIL,
                c,
                f"alertmanager.yml routes quarantine alerts to {hooks[0]}, but prometheus.yml has no "
                "alerting: section: no alert reaches Alertmanager, nothing is ever quarantined",
                fix_both,
            )
        )
    for t in targets:
        if "://" in t or "/" in t:
            rows.append(
                Row(
                    FAIL,
                    c,
                    f"prometheus.yml names Alertmanager as {t!r}: Prometheus wants host:port there",
                    f"--alertmanager {t.split('://')[-1].split('/')[0]} (host:port)",
                )
            )
            continue
        status, why = http_get(f"http://{t}/-/ready", w.timeout)
        rows.append(
            Row(OK, c, f"Alertmanager at {t} answers")
            if status == 200
            else Row(
                FAIL,
                c,
                f"Alertmanager at {t} (prometheus.yml's alerting) does not answer: "
                f"{why if status is None else f'HTTP {status}'}",
                "start Alertmanager there, or give its address to --alertmanager",
            )
        )
    for hook in hooks:
        if not re.match(r"^https?://[^/]+", hook):
            rows.append(
                Row(
                    FAIL,
                    c,
                    f"alertmanager.yml's webhook {hook!r} is not a URL: Alertmanager wants http://host:port/alerts",
                    "--quarantine-url http://HOST:PORT (a URL)",
                )
            )
    for url in sorted({str(h.get("canary_prometheus_url")) for h in w.hosts or [] if h.get("canary_prometheus_url")}):
        status, why = http_get(f"{url.rstrip('/')}/-/ready", w.timeout)
        rows.append(
            Row(OK, c, f"Prometheus at {url} answers")
            if status == 200
            else Row(
                FAIL,
                c,
                f"Prometheus at {url} (canary_prometheus_url) does not answer: "
                f"{why if status is None else f'HTTP {status}'}",
                "start it, or correct canary_prometheus_url",
            )
        )
    return rows


def _tool_row(c: str, tool: str, args: list[str], path: Path) -> Row:
    exe = shutil.which(tool)
    if not exe:
        return Row(
            WARN,
            c,
            f"{tool} is not installed here: {path.name} was not checked by it",
            f"install {tool} (Debian: {'prometheus' if tool == 'promtool' else 'prometheus-alertmanager'})",
        )
    res = subprocess.run([exe, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    if res.returncode != 0:
        said = (res.stderr.strip() or res.stdout.strip()).splitlines()
        return Row(
            FAIL,
            c,
            f"{tool} {' '.join(args[:-1])} refuses {path}: {' '.join(said[-2:])}",
            f"write it again with tritonfleet prometheus, or correct {path.name}",
        )
    return Row(OK, c, f"{tool} accepts {path}")


# --------------------------------------------------------------------------- quarantine receiver


def quarantine_rows(w: Wiring) -> list[Row]:
    """quarantine_url: the receiver answers, refuses a request without the bearer token and takes
    one with the token of quarantine_token_file (a file of mode 0600), and reads Alertmanager
    at a URL (its own events say when it cannot)."""
    if not w.hosts:
        return []
    rows: list[Row] = []
    by = distinct(
        w.hosts,
        lambda h: (
            h.get("quarantine_url") and (h.get("quarantine_url"), h.get("quarantine_token_file", DEFAULT_TOKEN_FILE))
        ),
    )
    if not by:
        return [Row(OK, "quarantine", "quarantine_url is not set: status does not ask a receiver")]
    for (url, token_file), hosts in by.items():
        rows += _receiver_rows(str(url).rstrip("/"), str(token_file), [h.name for h in hosts], w)
    return rows


def _receiver_rows(url: str, token_file: str, names: list[str], w: Wiring) -> list[Row]:
    c, api = "quarantine", f"{url}/v1/quarantine"
    status, body = http_get(api, w.timeout)
    if status is None:
        return [
            Row(
                FAIL,
                c,
                f"the quarantine receiver at {url} does not answer: {body} (hosts: {hosts_text(names)})",
                "start it (tritonfleet quarantine unit writes its systemd unit), or correct quarantine_url",
            )
        ]
    if status == 200:
        return [
            Row(
                FAIL,
                c,
                f"the receiver at {url} accepts requests without a token: anyone who reaches it can hold every host",
                "upgrade/restart it (its token in quarantine_token_file)",
            )
        ]
    if status != 401:
        return [
            Row(
                FAIL,
                c,
                f"{api} answers HTTP {status}: not a quarantine receiver",
                "correct quarantine_url (the receiver's http://host:port)",
            )
        ]
    try:
        st = os.stat(token_file)
        token = Path(token_file).read_text().strip()
    except OSError as e:
        return [
            Row(
                FAIL,
                c,
                f"the receiver at {url} wants a token, but {token_file} cannot be read: {e.strerror or e}",
                f"write the receiver's token into {token_file} (mode 0600), or set quarantine_token_file",
            )
        ]
    rows = []
    if stat.S_IMODE(st.st_mode) & 0o077:
        rows.append(
            Row(
                FAIL,
                c,
                f"{token_file} is mode {stat.S_IMODE(st.st_mode):04o}: others can read the token",
                f"chmod 600 {token_file}",
            )
        )
    status, body = http_get(api, w.timeout, {"Authorization": f"Bearer {token}"}, limit=1 << 20)
    if status == 401:
        return [
            *rows,
            Row(
                FAIL,
                c,
                f"token refused: the receiver at {url} does not take the token in {token_file}",
                f"write the receiver's token into {token_file}, or restart the receiver with it",
            ),
        ]
    if status != 200:
        return [*rows, Row(FAIL, c, f"{api} with the token answers HTTP {status}", "look at the receiver's journal")]
    rows.append(Row(OK, c, f"the receiver at {url} answers, refuses requests without a token and takes {token_file}'s"))
    try:
        events = json.loads(body).get("events") or []
    except (ValueError, AttributeError):
        events = []
    for ev in events[-50:]:
        if isinstance(ev, dict) and ev.get("action") == "alertmanager" and "unknown url type" in str(ev.get("text")):
            rows.append(
                Row(
                    FAIL,
                    c,
                    f"the receiver cannot read Alertmanager: {ev.get('text')}",
                    "its --alertmanager takes a URL (http://HOST:PORT), not host:port: fix the unit "
                    "(tritonfleet quarantine unit ... --alertmanager http://HOST:PORT)",
                )
            )
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
    rows = [
        Row(OK, c, f"lb = {lb}: its commands are not run by check (hosts: {hosts_text([h.name for h in hs])})")
        for lb, hs in distinct([h for h in w.hosts if h not in hap], lambda h: h.get("lb")).items()
    ]
    if not hap:
        return rows or [Row(OK, c, "lb is not set: no load balancer is drained")]
    answering: dict[str, bool] = {}
    for sock in dict.fromkeys(s for h in hap for s in h.get("lb_haproxy_sockets") or []):
        try:
            info = drain.RuntimeAPI(sock, w.timeout).command("show info")
            answering[sock] = "Name:" in info
            rows.append(
                Row(OK, c, f"HAProxy's runtime API at {sock} answers")
                if answering[sock]
                else Row(
                    FAIL,
                    c,
                    f"{sock} answered `show info` with {info[:80]!r}: not HAProxy's runtime API",
                    "lb_haproxy_sockets names the `stats socket ... level admin` of HAProxy's global section",
                )
            )
        except drain.DrainError as e:
            answering[sock] = False
            rows.append(
                Row(
                    FAIL,
                    c,
                    f"{e}",
                    "start HAProxy, or correct lb_haproxy_sockets (the `stats socket ... "
                    "level admin` of HAProxy's global section)",
                )
            )
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
            found.append(
                (
                    h.name,
                    FAIL,
                    str(e),
                    "add the server to HAProxy's backend, or set lb_haproxy_backend / lb_haproxy_server",
                )
            )
    if served:
        rows.append(Row(OK, c, f"{len(served)} host(s) have their server in HAProxy's backend"))
    return rows + grouped(c, found)
