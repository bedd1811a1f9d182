"""The client side of the quarantine receiver: its state for ``tritonfleet status`` and
``tritonfleet quarantine list``, release and hold for ``tritonfleet quarantine``."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

from .planning import QuarantineError


def _request(url: str, method: str = "GET", body: dict | None = None, timeout: float = 10) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {"error": f"HTTP {e.code}"}
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise QuarantineError(f"the quarantine receiver at {url} does not answer: {e} (is `tritonfleet quarantine "
                              "serve` running there? quarantine_url in group data)") from e


def fetch_state(url: str, timeout: float = 5) -> dict:
    status, data = _request(url.rstrip("/") + "/v1/quarantine", timeout=timeout)
    if status != 200:
        raise QuarantineError(f"the quarantine receiver at {url} answered HTTP {status}: {data.get('error', '')}")
    return data


def ask(url: str, host: str, action: str, reason: str = "", by: str = "", timeout: float = 300) -> dict:
    path = f"/v1/hosts/{urllib.parse.quote(host, safe='')}/{action}"
    status, data = _request(url.rstrip("/") + path, "POST", {"reason": reason, "by": by}, timeout=timeout)
    if status == 404 and "error" in data and "no such path" in data["error"]:
        raise QuarantineError(f"{url} is not a quarantine receiver ({data['error']})")
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
