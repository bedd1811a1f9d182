"""bench/fakefleet.py, the fake fleet the scale benchmark measures the control side against: a
command with no recorded answer fails loudly (never a silent success), recorded answers come
back per host, and the normalisation of per-host values is exact."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fakefleet", ROOT / "bench" / "fakefleet.py")
ff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ff)


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


@pytest.fixture
def fleet():
    answers = ff.Answers()
    # recorded on a host called "rec" at 127.0.0.9
    answers.add("hostname; echo rec 127.0.0.9", "rec", "127.0.0.9", "rec\nrec 127.0.0.9\n", "", 0)
    answers.add("false", "rec", "127.0.0.9", "", "oops\n", 1)
    hosts = [("fake-0001", "127.0.0.1"), ("fake-0002", "127.0.0.2")]
    port = _free_port("127.0.0.1")
    f = ff.FakeFleet(hosts, answers, port=port)
    f.start()
    yield f, hosts, port
    f.stop()


def _run(addr: str, port: int, command: str) -> tuple[str, str, int]:
    c = paramiko.SSHClient()
    c.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    c.connect(addr, port=port, username="root", password="x", allow_agent=False, look_for_keys=False, timeout=10)
    try:
        _, so, se = c.exec_command(command, timeout=10)
        out, err = so.read().decode(), se.read().decode()
        return out, err, so.channel.recv_exit_status()
    finally:
        c.close()


def test_recorded_answers_per_host(fleet):
    f, hosts, port = fleet
    for name, addr in hosts:
        assert _run(addr, port, f"hostname; echo {name} {addr}") == (f"{name}\n{name} {addr}\n", "", 0)
    assert _run("127.0.0.1", port, "false") == ("", "oops\n", 1)
    assert f.failures == []
    assert f.answers.counts == {"fake-0001": 2, "fake-0002": 1}


def test_unknown_command_fails_loudly(fleet):
    f, _hosts, port = fleet
    out, err, status = _run("127.0.0.2", port, "systemctl restart tritonserver")
    assert status == 255 and out == ""
    assert "no recorded answer" in err and "fake-0002" in err and "systemctl restart tritonserver" in err
    assert len(f.failures) == 1 and "systemctl restart tritonserver" in f.failures[0]
    # another host's own name in a command is not this host's recorded command
    _out, _err, status = _run("127.0.0.2", port, "hostname; echo fake-0001 127.0.0.1")
    assert status == 255 and len(f.failures) == 2


def test_serve_exits_non_zero_on_unknown(tmp_path, monkeypatch):
    """The server's exit status reports what it could not answer."""
    import threading

    ff.Answers(meta={"group": "t4", "data": {}}).save(tmp_path / "a.json")
    monkeypatch.setenv("TRITONFLEET_TESTBED", "0")
    port = _free_port("127.0.0.1")
    args = type("A", (), {"answers": str(tmp_path / "a.json"), "hosts": 1, "port": port,
                          "hosts_file": str(tmp_path / "h.json"), "counts_file": str(tmp_path / "c.json"),
                          "shard": 0, "shards": 1})
    stop, result = threading.Event(), {}
    t = threading.Thread(target=lambda: result.setdefault("rc", ff.serve(args, stop)))
    t.start()
    for _ in range(200):
        if (tmp_path / "h.json").exists():
            break
        stop.wait(0.05)
    try:
        assert _run("127.100.0.1", port, "uptime")[2] == 255
    finally:
        stop.set()
        t.join(10)
    assert result["rc"] == 3
    assert "uptime" in (tmp_path / "c.json").read_text()


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_name = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
_addr = st.tuples(*[st.integers(0, 255)] * 3).map(lambda t: f"127.{t[0]}.{t[1]}.{t[2]}")


@given(_text, _text, _name, _addr, _name, _addr)
def test_normalise_round_trip(a: str, b: str, rec: str, rec_addr: str, host: str, addr: str):
    """A command recorded on one host matches the same command on any other host, and the
    answer comes back with that host's own values."""
    if rec in rec_addr or "@@" in a + b or rec in a + b or rec_addr in a + b or host in a + b or addr in a + b:
        return
    if "/tmp/pyinfra-" in a + b or "=" in a + b:
        return
    recorded = f"{a}{rec}{b}{rec_addr}"
    asked = f"{a}{host}{b}{addr}"
    assert ff.normalise(recorded, rec, rec_addr) == ff.normalise(asked, host, addr)
    assert ff.personalise(ff.normalise(recorded, rec, rec_addr), host, addr) == asked


def test_normalise_masks_volatile_parts():
    assert ff.normalise("cat /tmp/pyinfra-0a1b2c > x", "h", "127.0.0.1") == \
        ff.normalise("cat /tmp/pyinfra-ffee > x", "h", "127.0.0.1")
    assert ff.normalise("echo fake-0001", "fake-0001", "127.0.0.1") == "echo @@HOST@@"
    # the address is replaced whole even where the name is part of it
    assert ff.normalise("ping 127.0.0.12", "12", "127.0.0.12") == "ping @@ADDR@@"


def test_addresses_per_testbed():
    a, b = ff.addresses(600, 1), ff.addresses(600, 2)
    assert len({x for _, x in a}) == 600 and not {x for _, x in a} & {x for _, x in b}
    assert all(x.startswith("127.") and int(x.rsplit(".", 1)[1]) >= 1 for _, x in a)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 600), st.integers(1, 8))
def test_shards_split_the_fleet_exactly(n, k):
    """bench/scale.py splits a fleet over k fake-fleet processes: every host in exactly one."""
    hosts = ff.addresses(n, 7)
    parts = [ff.shard(hosts, i, k) for i in range(k)]
    flat = [h for p in parts for h in p]
    assert sorted(flat) == sorted(hosts) and len(flat) == len(set(flat))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(SystemExit):
        ff.shard(hosts, k, k)
