"""tests/support/forked.py: the child of a test process patched for gevent (tests/conftest.py)
runs only its function. A server the parent runs in a thread (a greenlet there) stays the
parent's: its loop never runs in the child, and every request the child makes is answered by the
parent's copy of its state."""

from __future__ import annotations

import http.server
import threading
import time
import urllib.request

from gevent import monkey

from tests.support.forked import forked

LOOPS = [0]  # rounds of the server's loop, in whichever process runs it


class Server(http.server.ThreadingHTTPServer):
    def service_actions(self):
        LOOPS[0] += 1


def _loops_while_waiting() -> int:
    """Rounds the server's loop made in this process while it waited (a cooperative sleep)."""
    before = LOOPS[0]
    time.sleep(0.5)
    return LOOPS[0] - before


def _ask(url: str, n: int) -> list[str]:
    out = []
    for _ in range(n):
        with urllib.request.urlopen(url, timeout=10) as r:
            out.append(r.read().decode())
    return out


def test_the_parents_server_stays_the_parents():
    assert monkey.is_module_patched("threading")  # what makes the parent's threads greenlets
    seen: list[int] = []

    class Count(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(1)
            body = str(len(seen)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = Server(("127.0.0.1", 0), Count)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        assert _loops_while_waiting() > 0  # here, in the parent, it runs
        assert forked(_loops_while_waiting) == 0  # in the child, never
        url = f"http://127.0.0.1:{srv.server_address[1]}/"
        before = len(seen)
        answers = forked(_ask, url, 10)
        assert answers == [str(before + i + 1) for i in range(10)], answers  # the parent answered each
        assert len(seen) == before + 10
    finally:
        srv.shutdown()
        srv.server_close()


def _answer() -> int:
    return 42


def _fail() -> int:
    raise RuntimeError("in the child")


def test_a_child_reaped_by_another_waiter_still_gives_its_result(monkeypatch):
    # what the test process's event loop does when a child exits while it runs (libev reaps every
    # child): the child's status is gone before forked() asks for it
    from tests.support import forked as mod

    real = mod.os.waitpid

    def reaped_first(pid, options):
        real(pid, 0)  # someone else waited for it
        raise ChildProcessError(10, "No child processes")

    monkeypatch.setattr(mod.os, "waitpid", reaped_first)
    assert forked(_answer) == 42
    try:
        forked(_fail)
    except AssertionError as e:
        assert "failed in the child" in str(e)
    else:
        raise AssertionError("a child whose function raised was taken for a success")
