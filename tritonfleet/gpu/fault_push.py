"""The GPU fault collector's direct path to the quarantine receiver: a critical Xid report is
POSTed at once to ``<receiver>/v1/hosts/<host>/fault``, beside the Prometheus and Alertmanager
path (scrape, evaluation, notification: up to two intervals more), which stays the record and the
keeper of the budget (docs/operations.md, "The direct path").

Standard library only: the telemetry step puts this file on the host as ``gpu_fault_push.py`` next
to the collector (tritonfleet.gpu.telemetry). The receiver, the deploy step and the collector
share :func:`host_token`: each host carries its own token, an HMAC of its inventory name under the
receiver's push secret, so a host can report faults of itself only, and may do nothing else there.

A push is best effort: a thread per report, a few tries with short pauses (a receiver busy with a
storm answers 503), then it is said in the collector's log and left to the Prometheus path. Only
the first report of each distinct event is pushed (the Xid ledger's NEW), never a repeated line.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

#: the name of this file's copy on the host, next to the collector
MODULE_FILE = "gpu_fault_push.py"
#: pauses (seconds) before the second, third, ... try of a push
RETRY_PAUSES = (0.2, 0.5, 1.0, 2.0)
#: seconds one try may take
TIMEOUT = 3.0


def host_token(secret: str, host: str) -> str:
    """The bearer token of ``host``'s pushes: HMAC-SHA256 of its inventory name under the
    receiver's push secret, hexadecimal."""
    return hmac.new(secret.strip().encode(), host.encode(), hashlib.sha256).hexdigest()


def fault_url(base: str, host: str) -> str:
    return f"{base.rstrip('/')}/v1/hosts/{urllib.parse.quote(host, safe='')}/fault"


class Pusher:
    """Pushes the reports whose catalog action (or Xid number) quarantines, each in its own thread."""

    def __init__(
        self,
        url: str,
        host: str,
        token: str,
        actions: set[str],
        xids: frozenset[int] | set[int] = frozenset(),
        say: Callable[[str], None] = print,
        pauses: tuple[float, ...] = RETRY_PAUSES,
    ):
        self.url, self.host, self.token = fault_url(url, host), host, token
        self.actions, self.xids, self.say, self.pauses = set(actions), set(xids), say, pauses
        self.threads: list[threading.Thread] = []

    def wanted(self, xid: int, action: str) -> bool:
        return action in self.actions or xid in self.xids

    def body(self, xid: int, pci: str, action: str, seen: float, text: str) -> bytes:
        return json.dumps(
            {"xid": xid, "pci": pci, "action": action, "seen": round(seen, 3), "text": text[:300]}
        ).encode()

    def send(self, data: bytes) -> tuple[bool, str]:
        """One report, tried until it is taken or the tries are spent: (taken, the last answer)."""
        why = ""
        for pause in (0.0, *self.pauses):
            if pause:
                time.sleep(pause)
            req = urllib.request.Request(
                self.url,
                data=data,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                    r.read()
                    return True, f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                why = f"HTTP {e.code}: {e.read(300).decode('utf-8', 'replace').strip()}"
                if e.code not in (429, 502, 503, 504):  # refused for good: trying again changes nothing
                    break
            except OSError as e:
                why = str(e)
        return False, why

    def push(self, xid: int, pci: str, action: str, seen: float, text: str) -> threading.Thread | None:
        """Send the report in a thread of its own (the collector's reading never waits)."""
        if not self.wanted(xid, action):
            return None
        data = self.body(xid, pci, action, seen, text)

        def run() -> None:
            ok, why = self.send(data)
            if not ok:
                self.say(f"Xid {xid} on {pci}: not pushed to {self.url} ({why}); the Prometheus path reports it")

        t = threading.Thread(target=run, name=f"push-{xid}-{pci}", daemon=True)
        t.start()
        self.threads = [x for x in self.threads if x.is_alive()] + [t]
        return t


def read_token(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()
