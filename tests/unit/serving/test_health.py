"""The health gate's requests on one kept-alive HTTP session (tritonfleet.serving.health): every
attempt of the wait and the warm inferences share it, so through an SSH tunnel the gate opens one
channel a port rather than one a request. No server: a stand-in session records what is sent."""

from __future__ import annotations

import contextlib

import pytest

from tritonfleet.serving import health, triton_http


class _Answer:
    def __init__(self, status: int, text: str = "") -> None:
        self.status_code, self.text = status, text


class _Session:
    """requests.Session's surface the gate uses; answers from ``ready`` (False: not ready yet)."""

    made: list[_Session] = []

    def __init__(self, ready: list[bool]) -> None:
        self.ready, self.sent = ready, []
        _Session.made.append(self)

    def get(self, url, timeout=None):
        self.sent.append(("GET", url))
        if url.endswith("/metrics"):
            return _Answer(200, "nv_inference_request_success 1")
        return _Answer(200 if self.ready[0] else 503)

    def post(self, url, **_):
        self.sent.append(("POST", url))
        return _Answer(200, '{"outputs": []}')

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture()
def sessions(monkeypatch):
    _Session.made = []
    ready = [False]
    monkeypatch.setattr(triton_http, "session", lambda headers=None: _Session(ready))
    return ready


def test_every_attempt_of_the_wait_on_one_session(sessions, monkeypatch):
    attempts = []

    def not_ready_twice(*args, **kwargs):
        attempts.append(1)
        if len(attempts) == 3:
            sessions[0] = True
        return None

    monkeypatch.setattr(health.time, "sleep", not_ready_twice)
    res = health.wait_healthy("http://h:8000", "http://h:8002", ["m"], timeout=60, interval=0)
    assert res.ok, res.checks
    assert len(_Session.made) == 1, "a session (a new connection) per attempt"
    gets = [u for m, u in _Session.made[0].sent if m == "GET"]
    assert gets.count("http://h:8000/v2/health/live") == 4  # three not ready, then everything


def test_the_gate_and_its_warm_inferences_share_one_session(sessions, monkeypatch):
    sessions[0] = True
    seen = []

    def warm(http_url, session):
        seen.append(session)
        session.post(f"{http_url}/v2/models/m/infer")
        return None

    @contextlib.contextmanager
    def direct(settings, address, transport=None, grpc=False):
        yield triton_http.Endpoints(f"http://{address}:8000", f"http://{address}:8002")

    monkeypatch.setattr(triton_http, "endpoints", direct)
    settings = {"health_timeout": 5, "health_request_timeout": 1}
    res = health.gate(settings, "h", ["m"], warm=warm)  # type: ignore[arg-type]
    assert res.ok, res.checks
    assert len(_Session.made) == 1 and seen == _Session.made
    assert [m for m, _ in _Session.made[0].sent] == ["GET"] * 4 + ["POST"]
