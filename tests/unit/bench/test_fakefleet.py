"""bench/fakefleet.py, the fake fleet the scale benchmark measures the control side against: a
command with no recorded answer fails loudly (never a silent success), recorded answers come
back per host, and the normalisation of per-host values is exact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet_testbed.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("fakefleet", ROOT / "bench" / "fakefleet.py")
ff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ff)


@pytest.fixture
def fleet():
    answers = ff.Answers()
    # recorded on a host called "rec" at 127.0.0.9
    answers.add("hostname; echo rec 127.0.0.9", "rec", "127.0.0.9", "rec\nrec 127.0.0.9\n", "", 0)
    answers.add("false", "rec", "127.0.0.9", "", "oops\n", 1)
    hosts = [("fake-0001", "127.0.0.1"), ("fake-0002", "127.0.0.2")]
    port = free_port("127.0.0.1")
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
    """The server's exit status reports what it could not answer; --log has every command
    exactly as it was received, answered or not."""
    import json
    import threading

    answers = ff.Answers(meta={"group": "t4", "data": {}})
    answers.add("hostname", "rec", "127.0.0.9", "rec\n", "", 0)
    answers.save(tmp_path / "a.json")
    monkeypatch.setenv("TRITONFLEET_TESTBED", "0")
    port = free_port("127.0.0.1")
    args = type("A", (), {"answers": str(tmp_path / "a.json"), "hosts": 1, "port": port,
                          "hosts_file": str(tmp_path / "h.json"), "counts_file": str(tmp_path / "c.json"),
                          "shard": 0, "shards": 1, "log": str(tmp_path / "received.jsonl")})
    stop, result = threading.Event(), {}
    t = threading.Thread(target=lambda: result.setdefault("rc", ff.serve(args, stop)))
    t.start()
    for _ in range(200):
        if (tmp_path / "h.json").exists():
            break
        stop.wait(0.05)
    try:
        assert _run("127.100.0.1", port, "hostname") == ("fake-0001\n", "", 0)
        assert _run("127.100.0.1", port, "uptime")[2] == 255
    finally:
        stop.set()
        t.join(10)
    assert result["rc"] == 3
    assert "uptime" in (tmp_path / "c.json").read_text()
    lines = [json.loads(line) for line in (tmp_path / "received.jsonl").read_text().splitlines()]
    assert [(x["host"], x["kind"], x["request"], x["answered"], x["status"]) for x in lines] == [
        ("fake-0001", "ssh", "hostname", True, 0), ("fake-0001", "ssh", "uptime", False, 255)]
    assert ff.command_log([tmp_path / "received.jsonl"]) == "fake-0001\tssh hostname\nfake-0001\tssh uptime\n"


def _log(path: Path, sent: list[tuple[str, str, str]]) -> Path:
    """A --log file of what ``sent`` (host, address, command) would have written."""
    import json

    path.write_text("".join(json.dumps({"time": 0, "host": h, "kind": "ssh", "answered": True, "status": 0,
                                        "request": c, "key": ff.Answers.command_key(c, h, a)}) + "\n"
                            for h, a, c in sent))
    return path


def test_the_command_log_is_the_same_for_the_same_deploy(tmp_path):
    """The oracle of a refactor: what each host was sent, as matched (its own name and address,
    temporary names, a failure record's time masked), per host in order, hosts interleaved as
    they come; any other command, or another order on one host, is another text."""
    def run(stamp: str, tmp: str, interleave: bool) -> list[tuple[str, str, str]]:
        a = [("fake-0001", "127.100.0.1", f"hostname; echo fake-0001 127.100.0.1 /tmp/pyinfra-{tmp}"),
             ("fake-0001", "127.100.0.1", f'echo \'{{"time": "{stamp}", "host": "fake-0001"}}\' > /var/lib/f')]
        b = [("fake-0002", "127.100.0.2", "hostname; echo fake-0002 127.100.0.2 /tmp/pyinfra-00"),
             ("fake-0002", "127.100.0.2", "uptime")]
        return [a[0], b[0], a[1], b[1]] if interleave else a + b

    first = ff.command_log([_log(tmp_path / "1.jsonl", run("2025-01-01T00:00:00Z", "ab12", True))])
    again = ff.command_log([_log(tmp_path / "2.jsonl", run("2025-06-30T12:34:56Z", "cd34", False))])
    assert first == again and first.count("\n") == 4 and "@@HOST@@" in first and "@@TIME@@" in first
    sent = run("2025-01-01T00:00:00Z", "ab12", False)
    hosts_swapped = sent[2:] + sent[:2]
    assert ff.command_log([_log(tmp_path / "3.jsonl", hosts_swapped)]) == first  # the hosts' order: the same
    one_host_swapped = [sent[1], sent[0]] + sent[2:]
    assert ff.command_log([_log(tmp_path / "4.jsonl", one_host_swapped)]) != first  # one host's order: not
    changed = run("2025-01-01T00:00:00Z", "ab12", True)
    changed[3] = ("fake-0002", "127.100.0.2", "uptime -p")
    assert ff.command_log([_log(tmp_path / "5.jsonl", changed)]) != first
    # lines already seen (an earlier check's) are left out
    log = _log(tmp_path / "6.jsonl", run("x", "ab12", True))
    assert ff.command_log([log], {log: 3}) == "fake-0002\tssh uptime\n"


def test_replay_names_no_build_artefact_of_the_recording_machine(tmp_path):
    """The recorded host's image archives are files of the machine it was recorded on, rebuilt
    with other image IDs elsewhere: the fake hosts never get them (a replay would take the
    `docker load` path on every other machine), and get a client key of their own."""
    import json

    answers = ff.Answers(meta={"group": "l4", "data": {
        "image_archives": {"nvcr.io/nvidia/tritonserver:24.08-py3": "/var/cache/x/triton-image-1.tar.gz"},
        "ssh_key": "/var/lib/elsewhere/id_ed25519", "gpu_class": "L4"}})
    ff.write_hosts(tmp_path / "h.json", [("fake-0001", "127.0.0.1")], answers, 2222)
    data = json.loads((tmp_path / "h.json").read_text())["data"]
    assert "image_archives" not in data and data["gpu_class"] == "L4"
    assert data["ssh_key"] == str(tmp_path / "fakefleet-client-key") and Path(data["ssh_key"]).is_file()


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


_body = st.one_of(_text, st.sampled_from(["/tmp/pyinfra-0a1b run_id=7 ", '{"inputs": [0.0, 0.0]}', "127.0.0.5"]))


@given(st.lists(st.tuples(st.lists(_body, max_size=4).map("".join), _name, _addr), min_size=1, max_size=6))
def test_http_body_digest_is_the_normalised_bodys(asks):
    """An HTTP body's digest, kept per body for bodies that name no host, is at every ask (the
    same body asked by several hosts, bodies that name the asking host or its address) the
    digest of the body as normalised for that host."""
    import hashlib

    for _ in range(2):  # the second round finds the kept digests
        for text, host, addr in asks:
            body = (text + host if len(text) % 3 == 1 else text).encode()
            want = hashlib.sha256(ff.normalise(body.decode(errors="replace"), host, addr).encode()).hexdigest()[:16]
            assert ff.body_digest(body, host, addr) == want


def test_normalise_masks_volatile_parts():
    assert ff.normalise("cat /tmp/pyinfra-0a1b2c > x", "h", "127.0.0.1") == \
        ff.normalise("cat /tmp/pyinfra-ffee > x", "h", "127.0.0.1")
    assert ff.normalise("echo fake-0001", "fake-0001", "127.0.0.1") == "echo @@HOST@@"
    # the address is replaced whole even where the name is part of it
    assert ff.normalise("ping 127.0.0.12", "12", "127.0.0.12") == "ping @@ADDR@@"
    # the deploy lock's holder line, in an answer too (the line the holder found, the read's): the
    # line alone, not what follows it
    line = "ops@ctl1 pid 42, started 2026-12-07 00:50:01 UTC, run 20261207T005001-42-1: pyinfra -y inv.py d.py"
    assert ff.normalise(f"prev {line}\nlocked\n", "h", "127.0.0.1") == "prev @@HOLDER@@\nlocked\n"


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


# --- Ansible's pipelined modules (bench/ansible_scale.py's anchor) ----------------------------

ANSIBLE_CMD = "/bin/sh -c '/usr/bin/python3 && sleep 0'"


def _payload(args: dict, zip_time=(2026, 12, 4, 13, 0, 0), code: bytes = b"def main():\n    pass\n",
             tmp: str = "ansible-tmp-1796391278.9944007-6435-226699553244999", basename: str = ".6tzosjin") -> bytes:
    """A small AnsiballZ-shaped module payload, as Ansible sends it on stdin with pipelining
    (ansible/executor/module_common.py's template: the zip, its entry time, the module, its args)."""
    import base64
    import io
    import json
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(zipfile.ZipInfo("ansible/modules/stat.py", date_time=zip_time), code)
    params = json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_original_basename": basename,
                                                 "_ansible_tmpdir": f"/root/.ansible/tmp/{tmp}/"}})
    return (f"ZIPDATA = {base64.b64encode(buf.getvalue()).decode()!r}\n"
            f"        zinfo.date_time = {zip_time}\n"
            "        temp_path = tempfile.mkdtemp(prefix='ansible_' + 'ansible.legacy.stat' + '_payload_')\n"
            f"    ANSIBALLZ_PARAMS = {params!r}\n").encode()


def _run_stdin(addr: str, port: int, command: str, data: bytes = b"", eof: bool = True) -> tuple[str, str, int]:
    c = paramiko.SSHClient()
    c.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    c.connect(addr, port=port, username="root", password="x", allow_agent=False, look_for_keys=False, timeout=10)
    try:
        chan = c.get_transport().open_session()
        chan.settimeout(20)
        chan.exec_command(command)
        if data:
            chan.sendall(data)
        if eof:
            chan.shutdown_write()
        out, err = chan.makefile("rb").read().decode(), chan.makefile_stderr("rb").read().decode()
        return out, err, chan.recv_exit_status()
    finally:
        c.close()


@pytest.fixture
def ansible_fleet():
    answers = ff.Answers()
    # recorded on "rec" at 127.0.0.9: a stat of /etc/x, and the temp directory Ansible makes
    answers.add(ANSIBLE_CMD, "rec", "127.0.0.9", '{"stat": {"exists": true}, "host": "rec"}\n', "", 0,
                stdin=_payload({"path": "/etc/x"}))
    mkdir = "/bin/sh -c 'mkdir /root/.ansible/tmp/ansible-tmp-1796391278.99-6435-2266 && echo ansible-tmp-1796391278.99-6435-2266=/root/.ansible/tmp/ansible-tmp-1796391278.99-6435-2266 && sleep 0'"
    answers.add(mkdir, "rec", "127.0.0.9", "ansible-tmp-1796391278.99-6435-2266=/root/.ansible/tmp/"
                "ansible-tmp-1796391278.99-6435-2266\n", "", 0)
    hosts = [("fake-0001", "127.0.0.1")]
    port = free_port("127.0.0.1")
    f = ff.FakeFleet(hosts, answers, port=port)
    f.start()
    yield f, port
    f.stop()


def test_pipelined_module_answered_by_its_stdin(ansible_fleet):
    """A pipelined command's stdin is read to EOF and keys the answer: the same module and
    arguments from another run (another zip time, temp names) get the recorded answer."""
    f, port = ansible_fleet
    later = _payload({"path": "/etc/x"}, zip_time=(2027, 1, 2, 3, 4, 5), tmp="ansible-tmp-1800000000.5-77-123",
                     basename=".k2j4h5g6")
    assert _run_stdin("127.0.0.1", port, ANSIBLE_CMD, later) == ('{"stat": {"exists": true}, "host": "fake-0001"}\n',
                                                                 "", 0)
    assert f.failures == []
    # Ansible's temp directory: the answer names the directory this run asked for
    asked = "ansible-tmp-1800000000.5-77-123"
    out, _err, status = _run_stdin("127.0.0.1", port, f"/bin/sh -c 'mkdir /root/.ansible/tmp/{asked} && echo "
                                   f"{asked}=/root/.ansible/tmp/{asked} && sleep 0'")
    assert (out, status) == (f"{asked}=/root/.ansible/tmp/{asked}\n", 0)


@pytest.mark.parametrize("changed", [
    {"args": {"path": "/etc/y"}},                    # another file
    {"args": {"path": "/etc/x"}, "code": b"def main():\n    return 1\n"},  # another module version
])
def test_unknown_payload_fails_loudly(ansible_fleet, changed):
    f, port = ansible_fleet
    out, err, status = _run_stdin("127.0.0.1", port, ANSIBLE_CMD, _payload(changed["args"], code=changed.get(
        "code", b"def main():\n    pass\n")))
    assert status == 255 and out == "" and "no recorded answer" in err
    assert len(f.failures) == 1 and "Ansible module ansible.legacy.stat" in f.failures[0]
    assert changed["args"]["path"] in f.failures[0]


def test_stdin_never_closed_fails_loudly(ansible_fleet, monkeypatch):
    """A pipelined command whose client never sends EOF is an error, not a hang."""
    f, port = ansible_fleet
    monkeypatch.setattr(ff, "STDIN_TIMEOUT", 1)
    _out, err, status = _run_stdin("127.0.0.1", port, ANSIBLE_CMD, _payload({"path": "/etc/x"}), eof=False)
    assert status == 255 and "stdin" in err
    assert len(f.failures) == 1 and "no end of its stdin" in f.failures[0]


def test_only_pipelined_commands_wait_for_stdin(ansible_fleet):
    """pyinfra's commands never send EOF (the deploy lock keeps stdin open): they are answered
    without waiting; only Ansible's pipelined module runs and piped transfers read stdin."""
    f, port = ansible_fleet
    f.answers.add("uptime", "rec", "127.0.0.9", "up\n", "", 0)
    assert _run_stdin("127.0.0.1", port, "uptime", eof=False) == ("up\n", "", 0)
    for cmd in (ANSIBLE_CMD, "/bin/sh -c '/usr/bin/python3.11 && sleep 0'", "/bin/sh -c 'python3 && sleep 0'",
                "dd of=/root/.ansible/tmp/ansible-tmp-1.2-3-4/.source bs=65536"):
        assert ff.PIPELINED.fullmatch(cmd), cmd
    for cmd in ("/bin/sh -c '/usr/bin/python3 -c \"print(1)\" && sleep 0'", "sh -c 'python3'", "python3",
                "flock -n /run/lock/tritonfleet.lock -c 'echo locked; while read -r -t 90 _; do :; done'",
                "/bin/sh -c 'echo ~root && sleep 0'", "dd if=/etc/x bs=65536"):
        assert not ff.PIPELINED.fullmatch(cmd), cmd


_dt = st.tuples(st.integers(1980, 2100), st.integers(1, 12), st.integers(1, 28), st.integers(0, 23),
                st.integers(0, 59), st.integers(0, 59))
_tmp = st.tuples(st.integers(10**9, 2 * 10**9), st.integers(0, 10**7), st.integers(1, 2**32), st.integers(1, 2**48))


@given(_dt, _dt, _tmp, _tmp, st.from_regex(r"\.[a-z0-9_]{8}|tmp[a-z0-9_]{4,10}", fullmatch=True))
def test_ansible_volatile_parts_masked(t1, t2, a, b, basename):
    """What differs between two runs of the same module (zip entry times, the remote temp
    directory, a copy's local temp file) is masked; its code and arguments are not."""
    tmp_a, tmp_b = (f"ansible-tmp-{x[0]}.{x[1]}-{x[2]}-{x[3]}" for x in (a, b))
    host = ("fake-0001", "127.103.0.1")  # per-host values are replaced first: names as the fleet's
    one = ff.normalise_stdin(_payload({"path": "/etc/x"}, zip_time=t1, tmp=tmp_a), *host)
    two = ff.normalise_stdin(_payload({"path": "/etc/x"}, zip_time=t2, tmp=tmp_b, basename=basename), *host)
    assert one == two
    assert "ZIPDATA = @@ZIP " in one
    assert ff.normalise_stdin(_payload({"path": "/etc/y"}, zip_time=t1, tmp=tmp_a), *host) != one
    assert ff.normalise_stdin(_payload({"path": "/etc/x"}, zip_time=t1, tmp=tmp_a, code=b"x = 1\n"), *host) != one


def test_ansible_answers_merged_pyinfra_first(tmp_path, monkeypatch):
    """The default answers file brings the Ansible recording with it; where both recorded the
    same request (the health gate's), the pyinfra recording's answer stays."""
    main, extra = tmp_path / "fakefleet.json", tmp_path / "fakefleet-ansible.json"
    ff.Answers({"uptime": {"stdout": "a", "stderr": "", "status": 0}}, {"group": "t4"},
               {"8000 GET /v2/health/live x": {"status": 200, "type": "", "body": "pyinfra"}}).save(main)
    ff.Answers({"echo ~root": {"stdout": "/root\n", "stderr": "", "status": 0}}, {"vars": {}},
               {"8000 GET /v2/health/live x": {"status": 200, "type": "", "body": "ansible"}}).save(extra)
    monkeypatch.setattr(ff, "ANSWERS", main)
    monkeypatch.setattr(ff, "ANSIBLE_ANSWERS", extra)
    a = ff.Answers.load(main)
    assert set(a.commands) == {"uptime", "echo ~root"} and a.meta == {"group": "t4"}
    assert a.http["8000 GET /v2/health/live x"]["body"] == "pyinfra"
    other = tmp_path / "other.json"  # any other file: itself alone
    main.rename(other)
    assert set(ff.Answers.load(other).commands) == {"uptime"}


_spec_a = importlib.util.spec_from_file_location("ansible_scale", ROOT / "bench" / "ansible_scale.py")
ans = importlib.util.module_from_spec(_spec_a)
_spec_a.loader.exec_module(ans)

_RECAP = ("PLAY RECAP *********\n"
          "fake-0001                  : ok=29   changed={c}    unreachable={u}    failed={f}    skipped=8    rescued=0    ignored=0\n"
          "fake-0002                  : ok=29   changed=0    unreachable=0    failed=0    skipped=8    rescued=0    ignored=0\n")


def test_ansible_clean_noop_from_the_recap():
    assert ans.clean_noop(_RECAP.format(c=0, u=0, f=0), 2) == ""
    for bad in ({"c": 1, "u": 0, "f": 0}, {"c": 0, "u": 1, "f": 0}, {"c": 0, "u": 0, "f": 2}):
        assert "fake-0001" in ans.clean_noop(_RECAP.format(**bad), 2)
    assert "1 of 2 hosts" in ans.clean_noop(_RECAP.format(c=0, u=0, f=0).splitlines(True)[0] +
                                            _RECAP.format(c=0, u=0, f=0).splitlines(True)[1], 2)
    assert ans.clean_noop("", 1) == "0 of 1 hosts in the play recap"


def test_ansible_forks_and_inventory(tmp_path, monkeypatch):
    monkeypatch.setattr(ans.os, "cpu_count", lambda: 2)
    assert ans.parse_forks("5,auto") == [5, 40] and ans.parse_forks("none") == [] and ans.parse_forks("8") == [8]
    hosts_file = tmp_path / "hosts.json"
    hosts_file.write_text('{"group": "t4", "data": {"ssh_key": "/k/key", "ssh_user": "root"}, "port": 2222, '
                          '"hosts": [["fake-0001", "127.103.0.1"], ["fake-0002", "127.103.0.2"]]}')
    recorded = ans.recorded_vars({"ansible_host": "10.77.3.11", "ansible_ssh_private_key_file": "/real/key",
                                  "tf_validate_command": f"{ROOT}/.venv/bin/tritonfleet validate /tmp/rendered/x",
                                  "tf_model_repository": "/tmp/rendered/x", "tf_release": "r1"},
                                 ROOT / "files" / "model_repository")
    assert "10.77.3.11" not in str(recorded) and str(ROOT) not in str(recorded)
    cfg = ans.write_inventory(tmp_path / "inv", hosts_file, recorded)
    import json

    inv = json.loads((tmp_path / "inv" / "inventory.json").read_text())["gpu"]
    assert inv["hosts"] == {"fake-0001": {"ansible_host": "127.103.0.1"}, "fake-0002": {"ansible_host": "127.103.0.2"}}
    assert inv["vars"]["ansible_port"] == 2222 and inv["vars"]["ansible_ssh_private_key_file"] == "/k/key"
    assert inv["vars"]["tf_validate_command"] == f"{ROOT}/.venv/bin/tritonfleet validate {ROOT}/files/model_repository"
    text = cfg.read_text()
    assert f"inventory = {tmp_path / 'inv' / 'inventory.json'}" in text and "pipelining = True" in text
