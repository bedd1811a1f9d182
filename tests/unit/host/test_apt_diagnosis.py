"""Failed apt commands explained (tritonfleet.host.apt_diagnosis): the parser against real apt outputs
captured on a test host (tests/fixtures/apt/), against generated outputs (any mix of apt's error
blocks, with any particulars, among apt's progress lines), and the report a host fails with
(tritonfleet.host.ops.aptlock, through pyinfra's @fake connector). The same on a real host during a real
deploy: tests/testbed/test_apt_failure.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet.core.report import WORDS_KEEP, Failure
from tritonfleet.host import apt_diagnosis as aptreport
from tritonfleet.host import apt_messages, apt_report
from tritonfleet.host.apt_diagnosis import CAUSES, classify, repo_base
from tritonfleet.host.apt_report import describe, parse_madison, shown_command

FIXTURES = Path(__file__).parents[2] / "fixtures" / "apt"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


# ------------------------------------------------------------------------- real captured outputs

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_real_apt_output_is_classified(name):
    case, output = MANIFEST[name], fixture(name)
    d = classify(output, case["exit"])
    if case["cause"] is None:
        assert d is None  # apt-get update warned and exited 0: not a failure by itself
        d = classify(output, 0, require=case["require"])
        assert d.cause == case["cause_required"]
        assert d.found.startswith(f"apt-get update could not read {repo_base(case['require'])}: ")
    else:
        assert d.cause == case["cause"], d
    for part in case["found"]:
        assert part in d.found, (part, d.found)
    lines = [ln.rstrip() for ln in output.splitlines()]  # (as the report shows them: no trailing blanks)
    assert d.lines and all(ln in lines for ln in d.lines)
    assert len(d.lines) <= WORDS_KEEP and not any(ln.startswith(("tritonfleet:", "waited ")) for ln in d.lines)
    assert d.meaning and d.fix and d.cause in CAUSES


def test_the_shell_lock_pattern_and_the_parser_agree_on_real_outputs():
    """The lock wait retries on `grep -E LOCK_ERRORS`; the parser reads the same lines as a lock."""
    for name, case in MANIFEST.items():
        res = subprocess.run(["grep", "-qE", apt_messages.LOCK_ERRORS, str(FIXTURES / f"{name}.txt")])
        assert (res.returncode == 0) == (case["cause"] == "apt lock held"), name


def test_a_dpkg_failure_keeps_the_package_s_own_words():
    d = classify(fixture("install-postinst-fails"))
    assert d.lines[0] == "tf: postinst fails on purpose" and d.changed and d.packages == ["tf-badpost"]


def test_a_missing_repository_on_update_is_named_by_its_base_url():
    assert classify(fixture("update-missing-repository")).urls == ["http://10.77.2.1:8081/missing"]
    assert classify(fixture("update-no-pubkey")).urls == ["http://10.77.2.1:8081/cuda/debian12/x86_64"]
    # a repository of another base URL that only starts the same is not the one required
    assert classify(fixture("update-connection-refused"), 0, require="http://10.77.2.1:1/deb") is None


@pytest.mark.parametrize("url, base", [
    ("http://h/debian/dists/bookworm/InRelease", "http://h/debian"),
    ("http://h:8081/cuda/debian12/x86_64/./Packages", "http://h:8081/cuda/debian12/x86_64"),
    ("http://h/debian/pool/main/t/tf/tf_1.0_all.deb", "http://h/debian"),
    ("http://127.0.0.1:8099/./tf-gone_1.0_all.deb", "http://127.0.0.1:8099"),
    ("https://h/libnvidia-container/stable/deb/amd64/", "https://h/libnvidia-container/stable/deb/amd64"),
])
def test_repo_base(url, base):
    assert repo_base(url) == base


# ------------------------------------------------------------------------ generated apt outputs

NAME = st.from_regex(r"\A[a-z0-9][a-z0-9+.-]{1,24}\Z")
VERSION = st.from_regex(r"\A[0-9][0-9A-Za-z.+~-]{0,14}\Z")
PID = st.integers(1, 4_000_000)
PROC = st.from_regex(r"\A[a-z][a-z-]{0,14}\Z")
HOSTPORT = st.tuples(st.from_regex(r"\A[a-z][a-z0-9-]{0,12}(\.[a-z]{2,6})?\Z"), st.integers(1, 65535))
PATH_PART = st.from_regex(r"\A[a-z0-9][a-z0-9_-]{0,10}\Z")
KEYID = st.from_regex(r"\A[0-9A-F]{16}\Z")


@st.composite
def url(draw):
    host, port = draw(HOSTPORT)
    parts = draw(st.lists(PATH_PART, min_size=1, max_size=3))
    return f"http://{host}:{port}/" + "/".join(parts)


def _lock(d):
    f, pid, proc = d(st.sampled_from(["/var/lib/dpkg/lock-frontend", "/var/lib/apt/lists/lock"])), d(PID), d(PROC)
    lines = [f"E: Could not get lock {f}. It is held by process {pid} ({proc})",
             "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?"
             if "dpkg" in f else "E: Unable to lock directory /var/lib/apt/lists/"]
    return "apt lock held", lines, [f"process {pid} ({proc})", f]


def _interrupted(d):
    return "dpkg interrupted", ["E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the "
                                "problem. "], ["dpkg --configure -a"]


def _malformed(d):
    f = f"/etc/apt/sources.list.d/{d(PATH_PART)}.list"
    n = d(st.integers(1, 300))
    return "apt sources unreadable", [f"E: Malformed entry {n} in list file {f} (Suite)",
                                      "E: The list of sources could not be read."], [f"entry {n} of {f}"]


def _nospace(d):
    where = d(st.sampled_from(["/var/cache/apt/archives/", "/var/lib/apt/lists/partial/"]))
    return "disk full", [f"E: You don't have enough free space in {where}."], [where]


def _gpg(d):
    u, key = d(url()), d(KEYID)
    return "repository signature", [
        f"Err:1 {u}  InRelease",
        f"  The following signatures couldn't be verified because the public key is not available: NO_PUBKEY {key}",
        f"W: GPG error: {u}  InRelease: The following signatures couldn't be verified because the public key is not "
        f"available: NO_PUBKEY {key}",
        f"E: The repository '{u}  InRelease' is not signed."], [f"NO_PUBKEY {key}", u]


def _missing_repo(d):
    u = d(url())
    return "repository not found", [
        f"Err:3 {u} ./ Packages", "  404  Not Found [IP: 10.77.2.1 80]",
        f"E: Failed to fetch {u}/./Packages  404  Not Found [IP: 10.77.2.1 80]",
        "E: Some index files failed to download. They have been ignored, or old ones used instead."], [u, "404 Not Found"]


def _unreachable(d):
    u, pkg = d(url()), d(NAME)
    hp = u.split("/")[2]
    return "repository unreachable", [
        f"E: Failed to fetch {u}/pool/main/{pkg}_1.0_all.deb  Could not connect to {hp} ({hp.split(':')[0]}). - connect "
        "(111: Connection refused)",
        "E: Unable to fetch some archives, maybe run apt-get update or try with --fix-missing?"], [hp, "Connection refused"]


def _download(d):
    u, pkg = d(url()), d(NAME)
    return "package download failed", [
        f"E: Failed to fetch {u}/pool/main/{pkg}_1.0_all.deb  404  Not Found [IP: 10.77.2.1 80]",
        "E: Unable to fetch some archives, maybe run apt-get update or try with --fix-missing?"], [f"{pkg}_1.0_all.deb"]


def _held(d):
    a, b, v = d(NAME), d(NAME), d(VERSION)
    return "held packages", [
        "The following packages have unmet dependencies:", f" {b} : Depends: {a} (= {v}) but 1.0 is to be installed",
        "E: Unable to correct problems, you have held broken packages."], [f"{b} : Depends: {a} (= {v})"]


def _version(d):
    p, v = d(NAME), d(VERSION)
    # p=v alone; with another package at the same version the report says "version v of p, q"
    return "version not available", [f"E: Version '{v}' for '{p}' was not found"], [p, v]


def _unknown_package(d):
    p = d(NAME)
    return "package not available", [f"E: Unable to locate package {p}"], [p]


def _dpkg(d):
    p, rc = d(NAME), d(st.integers(1, 255))
    return "dpkg error", [
        f"Setting up {p} (1.0) ...", f"{p}: configuring failed on purpose", f"dpkg: error processing package {p} "
        "(--configure):", f" installed {p} package post-installation script subprocess returned error exit status {rc}",
        "Errors were encountered while processing:", f" {p}", "E: Sub-process /usr/bin/dpkg returned an error code (1)"], \
        [f"dpkg failed on {p}", f"exit status {rc}"]


BLOCKS = [_lock, _interrupted, _malformed, _nospace, _gpg, _missing_repo, _unreachable, _download, _held, _version,
          _unknown_package, _dpkg]
NOISE = ["Reading package lists...", "Building dependency tree...", "Reading state information...",
         "Hit:1 http://10.77.2.1:8081/cuda/debian12/x86_64  InRelease", "Get:2 http://10.77.2.1:8081 ./ tf-a 2.0 [524 B]",
         "Fetched 1714 B in 0s (9991 B/s)", "(Reading database ... 9918 files and directories currently installed.)",
         "debconf: delaying package configuration, since apt-utils is not installed", "Unpacking tf-a (1.0) ...",
         "Selecting previously unselected package tf-a.", "0 upgraded, 1 newly installed, 0 to remove and 0 not upgraded.",
         "The following NEW packages will be installed:", "Processing triggers for man-db (2.11.2-2) ..."]
TEXT = st.from_regex(r"\A[a-z][a-z ,.()]{0,60}\Z")


@st.composite
def apt_output(draw):
    """Some of apt's error blocks (in any order), among progress lines and other text."""
    blocks = [draw(st.sampled_from(BLOCKS))(draw) for _ in range(draw(st.integers(1, 3)))]
    lines: list[str] = []
    for _, block, _ in blocks:
        lines += draw(st.lists(st.one_of(st.sampled_from(NOISE), TEXT), max_size=4)) + block
    lines += draw(st.lists(st.sampled_from(NOISE), max_size=3))
    return blocks, lines


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(apt_output())
def test_generated_outputs_name_the_cause_that_comes_first(case):
    blocks, lines = case
    d = classify(lines, 100)
    # the expected cause: the block whose rule comes first (the rules' precedence)
    cause, _, particulars = min(blocks, key=lambda b: CAUSES.index(b[0]))
    assert d.cause == cause, (d.cause, [b[0] for b in blocks])
    for part in particulars:
        assert part in d.found or part in d.lines[0] or any(part in ln for ln in d.lines), (part, d)
    assert all(ln in [x.rstrip() for x in lines] for ln in d.lines) and len(d.lines) <= WORDS_KEEP


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_of_any_two_causes_the_first_rule_wins(data):
    """Every pair of causes, in both orders in the output: the precedence of the rules decides."""
    blocks = [make(data.draw) for make in BLOCKS]
    for a in blocks:
        for b in blocks:
            if a is b:
                continue
            expected = min((a, b), key=lambda x: CAUSES.index(x[0]))[0]
            for lines in (a[1] + b[1], b[1] + a[1]):
                assert classify(lines, 100).cause == expected, (a[0], b[0])


def test_tritonfleet_s_own_lines_are_never_apt_s_words():
    d = classify(["boom", "tritonfleet: the apt/dpkg lock on h stayed held", "waited 2 s for the apt/dpkg lock"], 1)
    assert d.cause == "apt failed" and d.found == "boom" and d.lines == ["boom"]


@settings(max_examples=150, deadline=None)
@given(apt_output(), st.data())
def test_progress_and_other_text_never_change_the_cause(case, data):
    blocks, lines = case
    bare = [ln for _, block, _ in blocks for ln in block]
    a, b = classify(bare, 100), classify(lines, 100)
    assert (a.cause, a.found) == (b.cause, b.found)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=120), max_size=20), st.integers(1, 255))
def test_any_output_of_a_failed_command_gets_a_report_and_success_gets_none(lines, rc):
    d = classify(lines, rc)
    assert d is not None and d.cause in CAUSES and d.found and len(d.lines) <= WORDS_KEEP
    assert classify(lines, 0) is None


@settings(max_examples=100, deadline=None)
@given(url(), st.sampled_from([_gpg, _missing_repo, _unreachable]), st.data())
def test_an_update_that_only_warned_fails_for_the_required_repository_alone(required, block, data):
    cause, lines, _ = block(data.draw)
    # apt-get update prints the repositories it could not read as warnings, and exits 0
    warned = [("W: " + ln[3:]) if ln.startswith("E: ") else ln for ln in lines]
    named = re.search(r"http://[^\s']+", " ".join(warned)).group(0)
    d = classify(warned, 0, require=repo_base(named))
    assert d is not None and d.cause == cause and repo_base(named) in d.found
    if repo_base(required) != repo_base(named) and not repo_base(named).startswith(repo_base(required) + "/"):
        assert classify(warned, 0, require=required) is None


# --------------------------------------------------------------------------------- the report

PYINFRA_INSTALL = ('DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
                   '-o Dpkg::Options::="--force-confold" install --allow-downgrades nvidia-container-toolkit=1.17.3-1 '
                   'nvidia-container-toolkit-base=1.17.3-1')


@pytest.mark.parametrize("command, expected", [
    (PYINFRA_INSTALL, "packages nvidia-container-toolkit=1.17.3-1, nvidia-container-toolkit-base=1.17.3-1 installed"),
    ("apt-get update", "apt-get update reads every repository"),
    ("DEBIAN_FRONTEND=noninteractive apt-get -y remove cuda-drivers-570", "packages cuda-drivers-570 removed"),
    ("dpkg-query -W -f '${db:Status-Abbrev} ${Package}\\n' | grep -x -F -e nvidia-driver | xargs -r apt-mark hold",
     "apt-mark hold on the driver's packages"),
    ("dpkg --configure -a", "dpkg --configure -a finishes"),
    ("apt-get install 'unbalanced", "packages 'unbalanced installed"),
])
def test_describe(command, expected):
    assert expected in describe(command)


def test_the_report_names_the_command_apt_s_words_the_meaning_and_the_fix():
    d = classify(fixture("install-version-missing"))
    f = apt_report.failure(d, host="tb1-t4", step="NVIDIA driver | NVIDIA driver cuda-drivers-580=580.1.2-1",
                          command=PYINFRA_INSTALL.replace("nvidia-container-toolkit", "cuda-drivers-580"),
                          setting="nvidia_driver_version", available={"cuda-drivers-580": ["580.159.04-1"]},
                          sources=["/etc/apt/sources.list.d/cuda.list"])
    text = f.text()
    assert text.startswith("tritonfleet: tb1-t4 failed at NVIDIA driver | NVIDIA driver cuda-drivers-580=580.1.2-1")
    assert "  command:  apt-get -y install --allow-downgrades cuda-drivers-580=1.17.3-1" in text  # without boilerplate
    assert "    E: Version '580.1.2-1' for 'cuda-drivers-580' was not found" in text
    assert "(the host's lists carry cuda-drivers-580: 580.159.04-1)" in f.found
    assert "  meaning:  the version pinned for it is not in any repository the host reads" in text
    assert "set nvidia_driver_version in group data" in f.fix and "/etc/apt/sources.list.d/cuda.list" in f.fix
    assert "apt changed no package" in f.now and f.short().startswith("NVIDIA driver | NVIDIA driver cuda-drivers-580")
    assert aptreport.APT_LOG in text
    back = Failure.from_json(json.loads(json.dumps(f.to_json())))
    assert back.text() == text and back.command and back.meaning


def test_parse_madison():
    out = [" cuda-drivers-580 | 580.159.04-1 | http://10.77.2.1:8081/cuda/debian12/x86_64  Packages",
           " cuda-drivers-580 | 580.65.06-1 | http://10.77.2.1:8081/cuda/debian12/x86_64  Packages", "garbage"]
    assert parse_madison(out) == {"cuda-drivers-580": ["580.159.04-1", "580.65.06-1"]}


def test_shown_command_is_one_line_without_pyinfra_s_boilerplate():
    assert shown_command(PYINFRA_INSTALL).startswith("apt-get -y install --allow-downgrades nvidia-container-toolkit=")
    assert "\n" not in shown_command("a\nb") and len(shown_command("x " * 500)) <= 220


# ------------------------------------------------- a failing apt command on a host (@fake connector)

def _toolkit_run(monkeypatch, responses):
    """The Container Toolkit step on a fake host, pinned to a version; the reports it emitted."""
    from tests.support.fakehost import run_fake
    from tests.unit.steps.test_steps_fake import BASE, DATA
    from tritonfleet.core import report as failure
    from tritonfleet.steps.host_prep import container_toolkit

    reports, emit = {}, failure.emit

    def keep(host, f):
        reports[f.host] = f
        emit(host, f)

    monkeypatch.setattr(failure, "emit", keep)
    _, cmds, state = run_fake(container_toolkit, {**responses, **BASE},
                              {**DATA, "container_toolkit_version": "1.17.3-1"})
    return cmds, state, reports


def test_a_version_the_repository_lacks_fails_the_host_with_the_report(monkeypatch, caplog):
    lines = fixture("install-version-missing").replace("cuda-drivers-580", "nvidia-container-toolkit") \
        .replace("580.1.2-1", "1.17.3-1").splitlines()
    madison = [" nvidia-container-toolkit | 1.17.8-1 | http://10.77.2.1:8081/libnvidia-container/stable/deb/amd64  "
               "Packages"]
    cmds, state, reports = _toolkit_run(monkeypatch, {
        "apt-cache madison": madison,
        re.compile(r"apt-get .*install .*nvidia-container-toolkit=1\.17\.3-1"): {"success": False, "stderr": lines},
    })
    assert state.failed_hosts
    f = reports["@fake/gpu1"]
    assert f.step == "NVIDIA Container Toolkit | Container Toolkit 1.17.3-1"
    assert f.found.startswith("nvidia-container-toolkit=1.17.3-1: not in the host's package lists")
    assert "(the host's lists carry nvidia-container-toolkit: 1.17.8-1)" in f.found
    assert f.words == ["E: Version '1.17.3-1' for 'nvidia-container-toolkit' was not found"]
    assert "set container_toolkit_version in group data" in f.fix
    assert f.command.startswith("apt-get -y install --allow-downgrades nvidia-container-toolkit=1.17.3-1")
    # the whole output stays on the host, the report is recorded there for `tritonfleet status`
    install = next(c for c in cmds if "nvidia-container-toolkit=1.17.3-1" in c and "apt-get" in c)
    assert aptreport.APT_LOG in install and "LC_ALL=C.UTF-8" in install
    assert any("last-failure.json" in c and "version not available" in c for c in cmds)
    # no later step ran (the runtime is not registered, Docker not restarted)
    assert not any("nvidia-ctk runtime configure" in c for c in cmds)
    # printed once as the report, not also as pyinfra's dump of the output
    assert caplog.text.count("Version '1.17.3-1' for 'nvidia-container-toolkit' was not found") == 1


def test_the_lock_wait_giving_up_fails_the_host_with_the_report(monkeypatch):
    cmds, state, reports = _toolkit_run(monkeypatch, {
        re.compile(r"apt-get .*install"): {"success": False, "stderr": fixture("lock-wait-gave-up").splitlines()},
    })
    f = reports["@fake/gpu1"]
    assert state.failed_hosts and f.cause.startswith("apt lock held")
    assert f.found == ("the apt/dpkg lock (/var/lib/dpkg/lock-frontend) stayed held by process 3576 (python3) for more "
                       "than 3 s (apt_lock_timeout)")
    assert "apt_lock_timeout" in f.fix and "ps -o pid,etime,args -p 3576" in f.fix
    assert not any(w.startswith(("tritonfleet:", "waited")) for w in f.words)


def test_an_update_that_could_not_read_the_new_repository_fails_there(monkeypatch):
    """apt-get update exits 0 when the repository the step just added cannot be read; the install
    after it would fail as "Unable to locate package": the update fails the host with the cause."""
    from tests.support.fakehost import defaults

    toolkit = defaults()["container_toolkit_repo_url"].rstrip("/") + "/amd64"
    out = fixture("update-connection-refused").replace("http://10.77.2.1:1/debian", toolkit)
    cmds, state, reports = _toolkit_run(monkeypatch, {
        "apt-get update": out.splitlines(),
        "grep -lsF": ["/etc/apt/sources.list.d/nvidia-container-toolkit.list"],
    })
    f = reports["@fake/gpu1"]
    assert state.failed_hosts and f.cause.startswith("repository unreachable")
    assert f.found.startswith(f"apt-get update could not read {toolkit}: the host cannot reach ")
    assert "/etc/apt/sources.list.d/nvidia-container-toolkit.list" in f.fix
    assert not any("apt-get" in c and "nvidia-container-toolkit=1.17.3-1" in c for c in cmds)


def test_an_update_that_warns_about_another_repository_goes_on(monkeypatch, caplog):
    cmds, state, reports = _toolkit_run(monkeypatch, {
        "apt-get update": fixture("update-connection-refused").splitlines()})
    assert not state.failed_hosts and not reports
    assert "apt-get update could not read every repository" in caplog.text
    assert any("apt-get" in c and "nvidia-container-toolkit=1.17.3-1" in c for c in cmds)
