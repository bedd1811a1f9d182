"""Hostile values through every function that builds a remote shell command.

Each builder is called once with a harmless placeholder and once with a generated hostile value
(quotes, ``$(...)``, backticks, newlines, spaces, a leading ``-``, glob characters). A small POSIX
sh lexer splits both commands into words, tagging every character with how the shell reads it.
The hostile command must have exactly the placeholder command's words, with the value (or its
URL encoding) where the placeholder was, and every special character of the value must be
literal there (quoted or backslash-escaped): the value never adds a word, a command, an
expansion or a glob. Model names are refused by the validator instead (last tests).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tests.support.fakehost import run_fake
from tritonfleet.core.shell import q, url_segment, words
from tritonfleet.fleet import probe
from tritonfleet.host import facts
from tritonfleet.host.ops.apt_repo import fetch_key_command
from tritonfleet.model_repo import facts as release_facts
from tritonfleet.model_repo import fetch
from tritonfleet.model_repo import release as release_plan
from tritonfleet.model_repo.validate import validate_repository
from tritonfleet.serving import apikey, repository_api
from tritonfleet.serving import facts as serving_facts
from tritonfleet.serving.ops import history
from tritonfleet.serving.unit_watch import watch_command
from tritonfleet.settings import access as config
from tritonfleet.steps import rollback, verify

P = "Zq9placeholder9qZ"
SAFE = re.compile(r"[A-Za-z0-9_./:=@%+,-]")
OPERATORS = set(";&|<>")  # ( ) stay in words: the same in both commands

HOSTILE = st.text(
    alphabet=st.sampled_from(list("ab-_.'\"$()`\\\n \t;|&*?[]{}~#<>!^=%/")), min_size=1, max_size=14
).filter(lambda v: P not in v)
EXAMPLES = ["x';id;'", "$(id)", "`id`", "a\nb", "a b", "-rf", "*", "'", '"', "\\", "--help=x", "$HOME", "a'b\"c"]


def with_examples(fn):
    for e in EXAMPLES:
        fn = example(e)(fn)
    return fn


def lex(cmd: str) -> list[list[tuple[str, str]]]:
    """Words (and operator tokens) of ``cmd`` as sh reads them; each character tagged 'sq'
    (single quotes, heredoc with a quoted tag), 'bs' (backslash-escaped), 'dq' (double quotes:
    literal but for ``$`` and backticks) or 'raw' (unquoted)."""
    out: list[list[tuple[str, str]]] = []
    word: list[tuple[str, str]] = []
    heredocs: list[str] = []
    i, n = 0, len(cmd)

    def end():
        nonlocal word
        if word:
            out.append(word)
            word = []

    while i < n:
        c = cmd[i]
        if c == "\n":
            end()
            out.append([("\n", "op")])
            i += 1
            for tag in heredocs:  # bodies follow the line that opened them (quoted tags only)
                lines = cmd[i:].split("\n")
                k = lines.index(tag)
                out.append([(ch, "sq") for ch in "\n".join(lines[:k])])
                i += sum(len(line) + 1 for line in lines[:k]) + len(tag) + 1
            heredocs = []
        elif c in " \t":
            end()
            i += 1
        elif c == "'":
            j = cmd.index("'", i + 1)
            word += [(ch, "sq") for ch in cmd[i + 1:j]]
            i = j + 1
        elif c == "\\":
            word.append((cmd[i + 1], "bs"))
            i += 2
        elif c == '"':
            i += 1
            while cmd[i] != '"':
                if cmd[i] == "\\" and cmd[i + 1] in '$`"\\\n':
                    word.append((cmd[i + 1], "bs"))
                    i += 2
                elif cmd.startswith("$(", i):  # a command inside: its own words and quotes
                    j = _close(cmd, i + 2)
                    word += [("$", "dq"), ("(", "dq")]
                    for inner in lex(cmd[i + 2:j]):
                        word += inner + [(" ", "dq")]
                    word.append((")", "dq"))
                    i = j + 1
                else:
                    word.append((cmd[i], "dq"))
                    i += 1
            i += 1
        elif c in OPERATORS:
            end()
            j = i
            while j < n and cmd[j] in OPERATORS:
                j += 1
            op = cmd[i:j]
            out.append([(ch, "op") for ch in op])
            i = j
            if op == "<<":
                m = re.match(r"\s*'([^']+)'", cmd[i:])
                if m:
                    heredocs.append(m.group(1))
        else:
            word.append((c, "raw"))
            i += 1
    end()
    return out


def _close(cmd: str, k: int) -> int:
    """Index of the ')' closing the command substitution whose text starts at ``k``."""
    depth = 1
    while True:
        c = cmd[k]
        if c == "'":
            k = cmd.index("'", k + 1) + 1
            continue
        if c == "\\":
            k += 2
            continue
        if c == '"':
            k += 1
            while cmd[k] != '"':
                if cmd[k] == "\\":
                    k += 2
                elif cmd.startswith("$(", k):
                    k = _close(cmd, k + 2) + 1
                else:
                    k += 1
            k += 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return k
        k += 1


def text(word) -> str:
    return "".join(ch for ch, _ in word)


def assert_confined(build, value: str) -> None:
    """``build(value)`` has ``build(P)``'s words with ``value`` (or its URL encoding) in place of
    P, each special character of it literal."""
    want, got = lex(build(P)), lex(build(value))
    assert got.count([("\n", "op")]) == want.count([("\n", "op")]), "value added a line"
    assert len(got) == len(want), f"value changed the words:\n{[text(w) for w in want]}\n{[text(w) for w in got]}"
    forms = [value, url_segment(value), json.dumps(value)[1:-1]]
    alternatives = "|".join(re.escape(x) for x in dict.fromkeys(forms))
    for w, g in zip(want, got, strict=True):
        wt, gt = text(w), text(g)
        if P not in wt:
            assert gt == wt, f"word {wt!r} became {gt!r}"
            continue
        parts = wt.split(P)
        m = re.fullmatch("".join(re.escape(p) + (f"({alternatives})" if k < len(parts) - 1 else "")
                                 for k, p in enumerate(parts)), gt, re.S)
        assert m, f"word {wt!r} became {gt!r}"
        for k in range(1, len(parts)):
            for pos in range(m.start(k), m.end(k)):
                ch, how = g[pos]
                assert how in ("sq", "bs") or (how == "dq" and ch not in "$`") or SAFE.fullmatch(ch), (
                    f"{ch!r} of the value is read by the shell ({how}) in {gt!r}")


# --- the lexer itself ---------------------------------------------------------------------


def test_lexer_sees_what_the_shell_sees():
    assert [text(w) for w in lex("echo 'a b' \"c $x\" d\\ e; f && g")] == ["echo", "a b", "c $x", "d e", ";", "f",
                                                                             "&&", "g"]
    with pytest.raises(AssertionError):  # unquoted: the value adds words
        assert_confined(lambda v: f"docker pull {v}", "a;b")
    with pytest.raises(AssertionError):  # in double quotes: $(...) runs
        assert_confined(lambda v: f'echo "{v}"', "$(id)")
    with pytest.raises(AssertionError):  # in single quotes written by hand: a quote ends them
        assert_confined(lambda v: f"echo 'load of {v} failed'", "x';id;'")
    assert_confined(lambda v: f"docker pull {q(v)}", "x';id;'")


# --- every command builder ----------------------------------------------------------------


@pytest.fixture
def tunables(monkeypatch):
    """config.get from a dict (the Triton steps' builders read tunables)."""
    data = {"triton_http_bind": "", "triton_http_port": 8000, "triton_base_dir": "/opt/triton",
            "triton_service": "triton", "triton_container_name": "triton",
            "triton_api_key_file": "/etc/tritonfleet/triton-api-key"}
    monkeypatch.setattr(config, "get", lambda key, default=None: data.get(key, default))
    return data


def _tunable_get(**over):
    base = {"triton_base_dir": "/opt/triton", "triton_service": "triton", "triton_container_name": "triton",
            "triton_http_bind": "", "triton_http_port": 8000, "triton_api_key_file": "/etc/tritonfleet/triton-api-key"}
    base.update(over)
    return base


MANIFEST = {"m/config.pbtxt": [10, "a" * 64], "m/1/model.onnx": [20, "b" * 64]}

BUILDERS = {
    # explicit-mode loads and unloads (steps/triton.py, rollback), the model name and the base dir
    "load": lambda v: repository_api.repository_api_commands(_tunable_get(), [v], []),
    "unload": lambda v: repository_api.repository_api_commands(_tunable_get(), [], [v]),
    "record image": lambda v: history.record_command("/opt/triton", "0123abcd", v, {"image": v}),
    "record unit": lambda v: history.record_command("/opt/triton", v, "img", {"unit": v}),
    "record base": lambda v: history.record_command(f"/srv/{v}", "0123abcd", "img", {}),
    # model releases (release_plan.py), base dir, release id and file paths
    "state": lambda v: release_plan.state_command(f"/srv/{v}"),
    "index base": lambda v: release_plan.index_command(f"/srv/{v}", "r1"),
    "index release": lambda v: release_plan.index_command("/opt/triton", v),
    "receive": lambda v: release_plan.receive_command(f"/srv/{v}", v),
    "finish base": lambda v: release_plan.finish_script(f"/srv/{v}", "r1", 3),
    "finish release": lambda v: release_plan.finish_script("/opt/triton", v, 3),
    "switch": lambda v: release_plan.switch_script(f"/srv/{v}", v, 3),
    "discard": lambda v: release_plan.discard_incoming_script(f"/srv/{v}", [v, "r2"]),
    "prepare": lambda v: release_plan.prepare_script(
        f"/srv/{v}", release_plan.Plan(v, link={f"m/{v}": f"r0/m/{v}"}, send=[f"m/s{v}"], remove=[v]),
        {f"m/{v}": [1, "c" * 64]}),
    # the fetch from a model origin (fetch.py): the host's credentials file, its region, the base dir
    "fetch credentials": lambda v: fetch.fetch_script("/opt/triton", "r1", "run1", credentials=(f"/etc/{v}", "eu-1")),
    "fetch region": lambda v: fetch.fetch_script("/opt/triton", "r1", "run1", credentials=("/etc/c", v)),
    "fetch base": lambda v: fetch.fetch_script(f"/srv/{v}", "r1", "run1"),
    # rollback (steps/rollback.py): what the host's history says
    "rollback unit": lambda v: rollback.restore_unit_command("/opt/triton", v, f"/etc/systemd/system/{v}.service"),
    "rollback switch": lambda v: release_plan.switch_back_script(f"/srv/{v}", v),
    # status probe (probe.py): tunables
    "probe": lambda v: probe.command(_tunable_get(triton_base_dir=f"/srv/{v}", triton_service=v,
                                                  triton_container_name=v)),
    "probe bind": lambda v: probe.command(_tunable_get(triton_http_bind=v)),
    # health gate's unit watch (health.py), GPU check (steps/verify.py), vendor keys (ops/apt_repo.py)
    "unit watch": lambda v: watch_command(v, v, f"/srv/{v}"),
    "gpu container": lambda v: verify.container_prefix(v) + "nvidia-smi",
    "gpu depends": lambda v: verify.depends_command(v),
    "vendor key": lambda v: fetch_key_command(f"https://example.invalid/{v}", "ABCD", f"/usr/share/keyrings/{v}"),
    # facts (facts/host.py)
    "fact keyring": lambda v: facts.KeyringFingerprints().command(v),
    "fact remote key": lambda v: facts.RemoteKeyFingerprints().command(v, "ABCD"),
    "fact file": lambda v: facts.FileState().command(v),
    "fact unit": lambda v: facts.UnitState().command(v),
    "fact daemon.json": lambda v: facts.DockerDaemonJson().command(v),
    "fact image": lambda v: facts.DockerImageId().command(v),
    "fact container": lambda v: serving_facts.TritonContainer().command(v, f"/etc/{v}", f"/srv/{v}"),
    "fact manifest": lambda v: release_facts.ReleaseManifest().command(f"/srv/{v}", v),
    "fact history": lambda v: serving_facts.DeployHistory().command(f"/srv/{v}"),
    "words": lambda v: "docker pull " + words(v, "x"),
    # the host's API key (apikey.py): its file
    "api key made": lambda v: apikey.key_command(f"/etc/{v}/key"),
    "api key header": lambda v: apikey.curl(f"/etc/{v}", "-s http://127.0.0.1:8000/v2/repository/index"),
    "api key read": lambda v: apikey.read_command(f"/etc/{v}"),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=HOSTILE)
@with_examples
def test_hostile_value_stays_one_word(tunables, name, value):
    # a '/' in a file path of a release makes a directory: not an injection, another plan
    assume(name != "prepare" or "/" not in value)
    assert_confined(BUILDERS[name], value)


def test_load_command_splits_back_to_its_words(tunables):
    """The explicit-mode load of the reviewer's model name: the curl call's words as intended."""
    name = "x';id;'"
    cmd = repository_api.repository_api_commands(tunables, [name], [])
    assert "id;" not in [text(w) for w in lex(cmd)]
    curl = "curl " + cmd.split(" | curl ", 1)[1].split(" || ", 1)[0]
    assert shlex.split(curl) == ["curl", "-H", "@-", "-sS", "-m", "600", "--fail-with-body", "-X", "POST",
                                 "http://127.0.0.1:8000/v2/repository/models/x%27%3Bid%3B%27/load", ">&2"]


# --- the same through pyinfra's @fake connector: docker pull of a hostile image tag -----------


@settings(max_examples=8, deadline=None)
@given(value=HOSTILE)
@example("x';id;'")
@example("$(id)")
def test_pull_of_a_hostile_image_through_pyinfra(value):
    from tritonfleet.steps.triton import triton_image

    _, cmds, _ = run_fake(triton_image, {}, {"triton_image": value, "image_archives": {}}, yes=True)
    pulls = [c for c in cmds if "docker pull" in c]
    assert pulls, cmds
    assert shlex.split(pulls[-1]) == ["docker", "pull", value]
    assert_confined(lambda v: pulls[-1] if v == value else f"docker pull {P}", value)


# --- model names: refused by the validator --------------------------------------------------


def _repo(tmp: Path, name: str) -> Path:
    d = tmp / name / "1"
    d.mkdir(parents=True)
    (d / "model.py").write_text("")
    (tmp / name / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n'
                                             'input { name: "I" data_type: TYPE_FP32 dims: [1] }\n'
                                             'output { name: "O" data_type: TYPE_FP32 dims: [1] }\n')
    return tmp


NAME_CHARS = st.text(alphabet=st.sampled_from(list("ab1_.-'\"$()`\\ ;|&*?[]{}~#<>!^=%")), min_size=1, max_size=10)


@settings(max_examples=40, deadline=None)
@given(name=NAME_CHARS.filter(lambda n: n not in (".", "..")))
@example("x';id;'")
@example("-rf")
@example("$(id)")
def test_model_names_outside_the_safe_set_are_refused(tmp_path_factory, name):
    repo = _repo(tmp_path_factory.mktemp("repo"), name)
    rules = {p.rule for p in validate_repository(repo, onnx_signatures=False)}
    safe = re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*", name) and ".." not in name
    assert ("model-name" in rules) == (not safe), (name, rules)
