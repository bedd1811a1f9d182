"""memo.FactBatch's one command: its facts run side by side on the host, and the answer is the one
of running them one after the other (each fact's lines and exit status, in order), also where the
host cannot make the temporary directory and runs them one after the other itself. Run by this
machine's ``sh`` (dash on Debian, as pyinfra's commands are)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonfleet.pyinfra_ext.memo import FactBatch

# what a fact's command may print and how it may end: text without NUL, with or without a last
# newline, a status, a pause (so that later facts end first), stderr (never part of the answer)
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r"), max_size=40)


@st.composite
def fact_command(draw) -> str:
    parts = []
    if draw(st.booleans()):
        parts.append(f"sleep 0.0{draw(st.integers(0, 5))}")
    text = draw(TEXT)
    parts.append("printf '%s' " + "'" + text.replace("'", "'\\''") + "'")
    if draw(st.booleans()):
        parts.append("echo")
    if draw(st.booleans()):
        parts.append("echo noise >&2")
    parts.append(f"exit {draw(st.integers(0, 3))}")
    return "\n".join(parts)


def run(command: str, env: dict | None = None) -> list[str]:
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, env=env, timeout=60)
    return out.stdout.decode("utf-8", "surrogateescape").split("\n")


def one_after_the_other(commands: list[str]) -> list:
    """What each command answers when run on its own, as FactBatch reads it."""
    answers = []
    for c in commands:
        res = subprocess.run(["/bin/sh", "-c", f"(\n{c}\n) 2>/dev/null"], capture_output=True, timeout=60)
        lines = res.stdout.decode("utf-8", "surrogateescape").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        answers.append((res.returncode, lines))
    return answers


def batch_answers(commands: list[str], env: dict | None = None, first: str | None = None) -> list:
    fact = FactBatch()
    text = fact.command(tuple(commands)) if first is None else fact.command(tuple(commands), first=first)
    out = run(text, env)
    # pyinfra hands a fact its output's lines without the last empty one
    return [(s, lines) for s, lines in fact.process(out[:-1] if out and out[-1] == "" else out)]


def no_mktemp_path(tmp: Path) -> dict:
    """An environment whose PATH has what the batch uses, except mktemp."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("cat", "rm", "sleep"):
        link = bin_dir / tool
        if not link.exists():
            link.symlink_to(shutil.which(tool))
    return dict(os.environ, PATH=str(bin_dir))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commands=st.lists(fact_command(), min_size=1, max_size=6), first=st.none() | fact_command())
def test_side_by_side_answers_as_one_after_the_other(commands, first, tmp_path):
    # ``first`` (a command run alone before the others) answers first, as if run before them
    want = one_after_the_other(commands if first is None else [first, *commands])
    assert batch_answers(commands, first=first) == want
    assert batch_answers(commands, no_mktemp_path(tmp_path), first=first) == want


def test_facts_run_side_by_side():
    # four facts of 0.4 s each: one after the other would take 1.6 s; the batch's answer comes
    # when the slowest ended (each fact writes when it started; all started before any ended)
    commands = ["date +%s.%N; sleep 0.4"] * 4
    answers = batch_answers(commands)
    starts = sorted(float(lines[0]) for _, lines in answers)
    assert starts[-1] - starts[0] < 0.4, starts


def test_no_temporary_directory_left(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    assert batch_answers(["echo a", "echo b"], env) == [(0, ["a"]), (0, ["b"])]
    assert list(tmp_path.iterdir()) == []


def test_the_first_command_ends_before_any_other_starts():
    # pre-flight's read puts the deploy lock's state first (hostlock.seen_command): what the
    # other facts read must come after it, not beside it
    answers = batch_answers(["date +%s.%N"] * 3, first="sleep 0.3; date +%s.%N")
    ended = float(answers[0][1][0])
    assert all(float(lines[0]) >= ended for _, lines in answers[1:]), answers


def test_without_a_first_command_the_batch_has_no_first_part():
    # first=None is the batch of the commands alone, as every other batch of a run is sent
    assert FactBatch().command(("echo a", "echo b")) == FactBatch().command(("echo a", "echo b"), first=None)
    assert "_tfa" not in FactBatch().command(("echo a", "echo b"))
