"""The client side of the quarantine receiver: its state for ``tritonfleet status`` and
``tritonfleet quarantine list``, release and hold for ``tritonfleet quarantine``; its token file
(written, and read by both sides) and Alertmanager's address in the one form every command takes."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import stat
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ...core.errors import UsageError
from ...settings.defaults import quarantine_token_file as DEFAULT_TOKEN_FILE
from .latency import since_fault
from .planning import QuarantineError

__all__ = ["DEFAULT_TOKEN_FILE", "ask", "fetch_state", "latency_note", "read_token", "status_line", "write_token"]


def write_token(path: str | Path) -> Path:
    """A new random token in ``path``, mode 0600 from its creation (an old file is replaced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    os.replace(tmp, path)
    return path


def read_token(path: str | Path, private: bool = True) -> str:
    """The token in ``path``. UsageError naming the file and the fix when it is missing, empty,
    or (``private``: the receiver's own files) readable by its group or others."""
    fix = f"write one with `tritonfleet quarantine token --out {path}`"
    try:
        st = os.stat(path)
        text = Path(path).read_text().strip()
    except FileNotFoundError:
        raise UsageError(f"{path}: no quarantine token file: {fix}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the quarantine token: {e}") from None
    if private and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(
            f"{path}: the quarantine token is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"chmod 600 {path}, or {fix}"
        )
    if not text or any(c.isspace() for c in text):
        raise UsageError(f"{path}: the quarantine token file is empty or not one token: {fix}")
    return text


def _request(
    url: str, method: str = "GET", body: dict | None = None, timeout: float = 10, token: str = ""
) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {"error": f"HTTP {e.code}"}
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise QuarantineError(
            f"the quarantine receiver at {url} does not answer: {e} (is `tritonfleet quarantine "
            "serve` running there? quarantine_url in group data)"
        ) from e


def fetch_state(url: str, timeout: float = 5, token: str = "") -> dict:
    status, data = _request(url.rstrip("/") + "/v1/quarantine", timeout=timeout, token=token)
    if status == 401:
        raise QuarantineError(
            f"the quarantine receiver at {url} refuses the token (quarantine_token_file in "
            "group data, or --token-file: the file the receiver was started with)"
        )
    if status != 200:
        raise QuarantineError(f"the quarantine receiver at {url} answered HTTP {status}: {data.get('error', '')}")
    return data


def ask(
    url: str,
    host: str,
    action: str,
    reason: str = "",
    by: str = "",
    timeout: float = 300,
    token: str = "",
    force: bool = False,
) -> dict:
    path = f"/v1/hosts/{urllib.parse.quote(host, safe='')}/{action}"
    body: dict = {"reason": reason, "by": by, **({"force": True} if force else {})}
    status, data = _request(url.rstrip("/") + path, "POST", body, timeout=timeout, token=token)
    if status == 404 and "error" in data and "no such path" in data["error"]:
        raise QuarantineError(f"{url} is not a quarantine receiver ({data['error']})")
    if status == 404 and "not a host of the inventory" in str(data.get("error")):
        raise UsageError(f"{host}: {data['error']}")
    if status == 401:
        raise QuarantineError(
            f"the quarantine receiver at {url} refuses the token (quarantine_token_file in "
            "group data, or --token-file: the file the receiver was started with)"
        )
    if "error" in data:
        raise QuarantineError(f"{host}: {data['error']}")
    return data


def status_line(entry: dict) -> str:
    """One host's quarantine for a table cell: ``quarantined since <time>: <reasons>``."""
    since = str(entry.get("since", "?")).replace("T", " ").rstrip("Z")
    why = "; ".join(entry.get("reasons") or []) or entry.get("held_reason", "")
    state = entry.get("state", "quarantined")
    if entry.get("held") and entry.get("held_reason"):
        why = f"{entry['held_reason']}" + (f" ({why})" if why and why != entry["held_reason"] else "")
    return f"{state} since {since}: {why}".strip()


def latency_note(entry: dict) -> str:
    """A host's times since its fault for a table cell: `` (fault -> alert 0.9 s, out 1.2 s)``, ""
    when its fault's time is not known."""
    parts = [
        f"{label} {took:.1f} s"
        for stage, label in (("alert", "alert"), ("drained", "out"), ("remedied", "reset"))
        if (took := since_fault(entry, stage)) is not None
    ]
    return f" (fault -> {', '.join(parts)})" if parts else ""
