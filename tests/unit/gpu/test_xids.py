"""The Xid reports (tritonfleet.gpu.xids): NVIDIA's Xid catalog tested row by row (every Xid it
lists has an action the health rules know, and its sources), the ledger's counts per line and
per distinct event over generated kernel logs, read through the collector's bounded reads as
they grow, its memory bound, the catalog's cancelling pair, and the collector's log of a flood."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritonfleet.gpu import signals as S
from tritonfleet.gpu import telemetry as t
from tritonfleet.gpu import xids as X
from tritonfleet.inventory.roster import load_inventory
from tritonfleet.observability import gpu_health_rules as ghr

CATALOG = json.loads((Path(X.__file__).parents[1] / "data" / X.CATALOG_FILE).read_text())
URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
#: where NVSentinel's mapping (its xiderrorsmapping.csv) differs from the catalog's immediate action,
#: besides the catalog's unused Xids (CONTACT_SUPPORT there, UNEXPECTED_ERR_REPORT_ISSUE in NVSentinel);
#: docs/operations.md lists them
NVSENTINEL_DIFFERS = {108, 142, 154, 160, 162}


# ---- NVIDIA's catalog, every row ---------------------------------------------------------------

def test_the_catalog_names_its_sources():
    assert CATALOG["sources"]["catalog"] == URL
    assert CATALOG["sources"]["nvsentinel"].startswith("NVIDIA/NVSentinel ")
    for rule in CATALOG["correlations"] + CATALOG["cancels"]:
        assert rule["sources"] and rule["sources"][0].startswith(URL), rule


@pytest.mark.parametrize("row", CATALOG["xids"], ids=lambda r: f"xid{r['xid']}")
def test_every_catalogued_xid_has_an_action_the_rules_know(row):
    assert row["action"] in S.XID_ACTIONS, f"Xid {row['xid']}: {row['action']} is unknown to the health rules"
    assert row["mnemonic"] and row["description"]
    assert set(row["applies_to"]) <= {"A100", "H100", "B100", "GB200"}
    if row["description"].startswith("Unused") and row["xid"] not in (14, 108):
        assert row["action"] == "CONTACT_SUPPORT" and row["nvsentinel_action"] == "UNEXPECTED_ERR_REPORT_ISSUE"
    elif row["nvsentinel_action"] is not None and row["xid"] not in NVSENTINEL_DIFFERS:
        assert row["nvsentinel_action"] == row["action"], row


def test_the_catalog_is_whole_and_each_xid_once():
    numbers = [r["xid"] for r in CATALOG["xids"]]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) == 172
    assert set(X.load_catalog().actions) == set(numbers)


def test_every_action_the_rules_know_raises_one_alert_of_the_spec():
    alerts = {a.name for a in S.ALERTS}
    assert {v for v in S.XID_ACTIONS.values() if v} <= alerts
    assert set(S.XID_ACTIONS) >= {r["action"] for r in CATALOG["xids"]} | {X.UNKNOWN}


@pytest.mark.parametrize(("xid", "alert"), [
    # what quarantined before the catalog, by its number, and still does, by its action
    (48, S.XID_QUARANTINE), (64, S.XID_QUARANTINE), (79, S.XID_QUARANTINE), (95, S.XID_QUARANTINE),
    # what the catalog adds: a reset or a reboot needed
    (74, S.XID_QUARANTINE), (119, S.XID_QUARANTINE), (120, S.XID_QUARANTINE), (62, S.XID_QUARANTINE),
    # the application's, and what the catalog says to ignore
    (13, S.XID_WARNING), (31, S.XID_WARNING), (94, S.XID_WARNING), (45, S.XID_WARNING), (43, None), (63, None),
    # unused on current GPUs
    (1, S.XID_SUPPORT), (999, S.XID_WARNING),
])
def test_the_rules_follow_the_catalog(xid, alert):
    assert S.XID_ACTIONS[X.load_catalog().action(xid)] == alert


def test_the_xid_rules_select_exactly_the_actions_of_each_alert():
    hosts = load_inventory(Path(X.__file__).parents[2] / "inventories" / "prod.py")
    rules = {r["alert"]: r["expr"] for r in ghr.rules(hosts, "triton", "1m")["rules"]}
    for alert in (S.XID_QUARANTINE, S.XID_SUPPORT, S.XID_WARNING):
        selected = rules[alert].split('action=~"', 1)[1].split('"', 1)[0].split("|")
        assert sorted(selected) == S.xid_actions(alert), alert
    assert 'xid="31"} >= 2' in rules["GpuXidRepeated"]


# ---- the ledger -----------------------------------------------------------------------------

PCI = st.sampled_from(["0000:00:1e", "0000:3b:00", "0001:c1:00"])
MESSAGE = st.builds(
    lambda pci, xid, form, pid, tail: (pci, xid, {
        "pid": f"NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name=tritonserver, {tail}",
        "nopid": f"NVRM: Xid (PCI:{pci}): {xid}, {tail}",
        "mig": f"NVRM: Xid (PCI:{pci} GPU-I:03 GPU-CI:01): {xid}, pid={pid}, name=x, {tail}",
        "old": f"NVRM: Xid ({pci}): {xid}, {tail}"}[form]),
    PCI, st.sampled_from([13, 31, 48, 79, 95, 162, 163, 200]), st.sampled_from(["pid", "nopid", "mig", "old"]),
    st.integers(1, 99), st.sampled_from(["Uncontained: FBHUB. RST: Yes, D-RST: No", "Ch 00000008",
                                         "GPU has fallen off the bus.", "Graphics SM Warp Exception"]))
NOISE = st.sampled_from(["NVRM: loading NVIDIA UNIX Open Kernel Module", "nvidia-nvlink: Nvlink Core is being "
                         "initialized", "NVRM: GPU at PCI:0000:00:1e: GPU-8214eaab", "eth0: link up"])


def expected(lines: list[str]) -> tuple[dict, dict]:
    lines_per, texts_per = {}, {}
    for text in lines:
        ev = X.parse_xid(text)
        if ev:
            key = (ev.pci, ev.xid)
            lines_per[key] = lines_per.get(key, 0) + 1
            texts_per.setdefault(key, set()).add(text)
    return lines_per, {k: len(v) for k, v in texts_per.items()}


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(MESSAGE, min_size=1, max_size=12, unique_by=lambda m: m[2]),
       repeats=st.lists(st.integers(1, 40), min_size=12, max_size=12), noise=st.lists(NOISE, max_size=20),
       seed=st.integers(0, 2**32 - 1))
def test_a_repeated_line_is_one_event_and_every_line_is_counted(messages, repeats, noise, seed):
    lines = [m[2] for m, n in zip(messages, repeats, strict=False) for _ in range(n)] + noise
    random.Random(seed).shuffle(lines)
    ledger = X.Ledger(X.load_catalog())
    kinds = [ledger.add(text, float(i)) for i, text in enumerate(lines)]
    want_lines, want_events = expected(lines)
    rows = {(pci, xid): (n, events) for pci, xid, _, n, events, _, _ in ledger.rows()}
    assert rows == {k: (want_lines[k], want_events[k]) for k in want_lines}
    assert kinds.count(X.NEW) == len(messages) and kinds.count(None) == len(noise)
    assert sum(ledger.said().values()) == kinds.count(X.REPEAT)


def record(seq: int, text: str, usec: int) -> str:
    return f"3,{seq},{usec},-;{text}\n"


@settings(max_examples=25, deadline=None)
@given(messages=st.lists(MESSAGE, min_size=1, max_size=6, unique_by=lambda m: m[2]),
       repeats=st.lists(st.integers(1, 30), min_size=6, max_size=6), noise=st.lists(NOISE, max_size=10),
       cuts=st.lists(st.integers(1, 5000), max_size=6), seed=st.integers(0, 2**32 - 1))
def test_the_collector_counts_the_same_whatever_the_reads_and_writes(tmp_path_factory, messages, repeats, noise,
                                                                     cuts, seed):
    """The kernel-message file written in arbitrary pieces (records cut anywhere), read in bounded
    chunks of 97 bytes: the textfile's counts are the ledger's of the whole log."""
    lines = [m[2] for m, n in zip(messages, repeats, strict=False) for _ in range(n)] + noise
    random.Random(seed).shuffle(lines)
    data = "".join(record(i + 1, text, 1_000_000 + i) for i, text in enumerate(lines))
    tmp = tmp_path_factory.mktemp("xids")
    kmsg, out = tmp / "kmsg", tmp / "out"
    out.mkdir()
    kmsg.write_text("")
    c = t.Collector(str(out), "false", str(kmsg), 1, 10)
    at = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(t, "READ_BYTES", 97)
        for cut in sorted(cuts) + [len(data)]:
            with open(kmsg, "a") as f:
                f.write(data[at:max(at, cut)])
            at = max(at, cut)
            c.read_log()
            while c.log.more:
                c.read_log()
    want_lines, want_events = expected(lines)
    rows = {(pci, xid): (n, events) for pci, xid, _, n, events, _, _ in c.xids.rows()}
    assert rows == {k: (want_lines[k], want_events[k]) for k in want_lines}


def test_the_distinct_texts_remembered_are_bounded():
    ledger = X.Ledger(X.load_catalog(), limit=8)
    for i in range(100):
        assert ledger.add(f"NVRM: Xid (PCI:0000:00:1e): 95, pid={i}, name=x, Uncontained", float(i)) == X.NEW
    assert len(ledger.seen) == 8
    assert ledger.add("NVRM: Xid (PCI:0000:00:1e): 95, pid=99, name=x, Uncontained", 100.0) == X.REPEAT
    assert ledger.add("NVRM: Xid (PCI:0000:00:1e): 95, pid=0, name=x, Uncontained", 101.0) == X.NEW  # forgotten
    assert ledger.rows() == [("0000:00:1e", 95, "RESET_GPU", 102, 101, 101.0, True)]


def test_a_later_xid_of_a_cancelling_pair_cancels_the_earlier_on_the_same_gpu_only():
    """Xid 163 (Power Smoothing disengaged) stands until 162 (re-engaged) on the same GPU."""
    ledger = X.Ledger(X.load_catalog())
    off = "NVRM: Xid (PCI:0000:00:1e): 163, Power Smoothing disengaged"
    ledger.add(off, 1.0)
    ledger.add("NVRM: Xid (PCI:0000:3b:00): 163, Power Smoothing disengaged", 1.0)
    ledger.add("NVRM: Xid (PCI:0000:00:1e): 162, Power Smoothing reengaged", 2.0)
    assert ledger.standing == {("0000:00:1e", 163): False, ("0000:3b:00", 163): True, ("0000:00:1e", 162): True}
    ledger.add(off, 3.0)  # disengaged again (the same text): it stands again
    assert ledger.standing[("0000:00:1e", 163)] is True


def test_a_flood_is_logged_once_and_summed_up(tmp_path, capsys):
    kmsg, out = tmp_path / "kmsg", tmp_path / "out"
    out.mkdir()
    line = "NVRM: Xid (PCI:0000:00:1e): 95, pid=7, name=tritonserver, Uncontained: FBHUB. RST: Yes, D-RST: No"
    kmsg.write_text("".join(record(i, line, 1000 + i) for i in range(1, 5001)))
    c = t.Collector(str(out), "false", str(kmsg), 1, 10)
    c.read_log()
    while c.log.more:
        c.read_log()
    c.summarised -= t.REPEAT_SUMMARY_S
    c.read_log()
    err = capsys.readouterr().err.splitlines()
    assert [e for e in err if "Xid 95 on 0000:00:1e (RESET_GPU): NVRM: Xid" in e] and len(err) == 2, err
    assert err[1].endswith("Xid 95 on 0000:00:1e: 4999 more identical report(s) in the last 60 s")


def test_a_read_takes_at_most_its_bound_and_says_more_is_there(tmp_path, monkeypatch):
    """However far behind the collector is, one read holds at most READ_BYTES of the log."""
    monkeypatch.setattr(t, "READ_BYTES", 1000)
    kmsg = tmp_path / "kmsg"
    one = record(1, "NVRM: Xid (PCI:0000:00:1e): 95, pid=7, name=x, Uncontained", 1000)
    kmsg.write_text(one * 100)
    log = t.KernelLog(str(kmsg))
    got = log.read()
    assert 0 < len(got) <= 1000 // len(one) and log.more
    while log.more:
        got += log.read()
    assert len(got) == 100 and not log.more


def test_a_read_of_the_kernels_device_takes_at_most_its_bound_of_records(monkeypatch):
    """/dev/kmsg gives one record a read() for as long as the kernel has some: a read stops at
    READ_RECORDS and says more is there."""
    monkeypatch.setattr(t, "READ_RECORDS", 5)
    log = t.KernelLog("/dev/null")  # a character device
    assert log.read() == [] and log.device and not log.more
    records = iter([b"3,1,1000,-;NVRM: Xid (PCI:0000:00:1e): 95, Uncontained\n"] * 20)

    def read(fd, n):
        try:
            return next(records)
        except StopIteration:
            raise BlockingIOError from None

    monkeypatch.setattr(t.os, "read", read)
    assert len(log.read()) == 5 and log.more
    assert len(log.read()) == 5 and len(log.read()) == 5 and len(log.read()) == 5
    assert log.read() == [] and not log.more
