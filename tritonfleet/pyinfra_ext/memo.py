"""Facts read once per host per run, for as long as nothing on the host changed, and many facts
read in one remote command.

pyinfra 3 runs a fact's command every time it is asked for, so four package operations read
``dpkg`` four times on a host where nothing changes. ``fact()`` keeps the answer on the host
object and forgets all of them as soon as an operation on that host changed something (or
failed): the next read runs the command again. Operations named ``check: ...`` change nothing by
this project's convention (tritonfleet.core.checks.is_check) and forget nothing. Facts read while pyinfra prepares the deploy
(before any operation runs) are exact for the start of the execution as well.

``prefetch()`` reads the facts a deploy step will need in one remote command (one round trip
instead of one per fact: what a converged host costs over a WAN link); each answer is processed
by its own fact class, exactly as pyinfra would. A fact whose command fails is left out and read
again on its own, so failures behave as pyinfra's do.

A fact class may also answer other facts from its own output (``derived(value, **kwargs)``: [(fact
class, kwargs, value)]; tritonfleet.host.gpu_probe.GpuProbe answers the nvidia-smi facts from its
one query): those are remembered with it, unless already read, and forgotten with it. What it
may answer so (``derives(**kwargs)``: [(fact class, kwargs)]) a batch with it leaves out.

A fact class may name a fact that reads many of its kind in one command (``together``: a class
with ``joinable(**kwargs)``, which of them may be read so, ``gather([kwargs])``, its own kwargs
for them, and ``derived``, each one's answer): a batch reads two or more of them as that one fact,
in the place of the first (tritonfleet.host.facts.FileStates: one ``stat`` and one ``sha256sum``
for every file instead of three programs a file).
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host, ctx_state

from ..core.checks import is_check

_ATTR = "_tritonfleet_fact_memo"
_HANDLER = "_tritonfleet_fact_memo_handler"


def _memo(host) -> dict:
    memo = getattr(host, _ATTR, None)
    if memo is None:
        memo = {"facts": {}, "last_op": None}
        setattr(host, _ATTR, memo)
    return memo


def _is_check(state, op_hash) -> bool:
    try:
        names = state.get_op_meta(op_hash).names
    except (KeyError, AttributeError):
        return False
    return bool(names) and all(is_check(n) for n in names)


def _op_changed_or_failed(state, host, op_hash) -> bool:
    try:
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
    except (KeyError, AttributeError):
        return True
    if not meta.is_complete() or not meta.did_succeed(False):
        return True
    return meta.did_change() and not _is_check(state, op_hash)


class _ForgetOnChange(BaseStateCallback):
    """Before an operation starts on a host: if the previous one changed it, forget its facts."""

    @staticmethod
    def operation_host_start(state, host, op_hash):
        memo = _memo(host)
        last = memo["last_op"]
        if last is not None and _op_changed_or_failed(state, host, last):
            memo["facts"].clear()
        if op_hash in state.ops.get(host, {}):
            memo["last_op"] = op_hash

    @staticmethod
    def operation_host_error(state, host, op_hash, *args, **kwargs):
        _memo(host)["facts"].clear()


def _freeze(value: Any):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def forget(host=None) -> None:
    """Drop every remembered fact of ``host`` (default: the current host)."""
    _memo(host or ctx_host.get())["facts"].clear()


def _facts():
    state = ctx_state.get()
    host = ctx_host.get()
    if not getattr(state, _HANDLER, False):
        state.add_callback_handler(_ForgetOnChange())
        setattr(state, _HANDLER, True)
    return host, _memo(host)["facts"]


def fact(cls, **kwargs):
    """``host.get_fact(cls, **kwargs)`` for the current host, read once while nothing changes."""
    host, facts = _facts()
    key = (cls, _freeze(kwargs))
    if key not in facts:
        facts[key] = host.get_fact(cls, **kwargs)
        _derive(facts, cls, facts[key], kwargs)
    return facts[key]


def known(cls, **kwargs):
    """The remembered answer of ``cls`` for the current host (read by a prefetch, nothing changed
    since), else None; never reads the host."""
    _, facts = _facts()
    return facts.get((cls, _freeze(kwargs)))


def _derive(facts: dict, cls, value, kwargs: dict) -> None:
    derived = getattr(cls, "derived", None)
    if derived is None:
        return
    for other, other_kwargs, other_value in derived(value, **kwargs):
        facts.setdefault((other, _freeze(other_kwargs)), other_value)


SECTION = "@@tritonfleet-fact@@"
STATUS = "@@tritonfleet-fact-status@@"


def _command_text(command) -> str:
    return command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)


class FactBatch(FactBase):
    """Several fact commands in one: [(exit status, stdout lines)], one per command, in order.

    The commands run side by side on the host, each into its own file of a private temporary
    directory (``mktemp -d``: 0700, root's), and their answers are printed in order once all
    ended: the answer is byte for byte the one of running them one after the other, which the
    host does when it cannot make the directory. Each command is read-only (a fact), so none
    waits for another; the host's time is then its slowest fact, not their sum (about 30
    facts of a converged host's no-op, each a few processes: docs/scale.md)."""

    default = list

    def command(self, commands: tuple[str, ...], first: str | None = None) -> str:
        # each command a function of its own that runs in a subshell, on its own lines (a
        # trailing comment cannot swallow the rest); the status line starts on a new line
        # whatever the output ended with. ``first``: a command that runs, and ends, before any
        # of the others starts; its answer comes first. Each answer's file starts with its
        # section line, so that one ``cat`` prints them all in order (a ``cat`` a fact, after the
        # slowest fact, was 15-20 ms of a converged host's batch on a test host, 2026-12-07)
        status = f"printf '\\n{STATUS} %s\\n' \"$?\""
        own = {f"_tf{i}": c for i, c in enumerate(commands)}
        alone = {} if first is None else {"_tfa": first}
        every = {**alone, **own}  # in the order their answers are printed
        funcs = [f"{name}() (\n{c}\n)" for name, c in every.items()]
        files = " ".join(f'"$_tfd/{name}"' for name in every)
        return "\n".join(
            [
                *funcs,
                "if _tfd=$(mktemp -d 2>/dev/null); then",
                *(f"{{ echo '{SECTION}'; {name} 2>/dev/null; {status}; }} >\"$_tfd/{name}\"" for name in alone),
                f"for _tff in {' '.join(own)}; do {{ echo '{SECTION}'; \"$_tff\" 2>/dev/null; {status}; }} "
                '>"$_tfd/$_tff" & done; wait',
                f'cat {files}; rm -rf "$_tfd"',
                "else",
                f"for _tff in {' '.join(every)}; do echo '{SECTION}'; \"$_tff\" 2>/dev/null; {status}; done",
                "fi",
            ]
        )

    def process(self, output):
        results, lines = [], None
        for line in output:
            if line == SECTION:
                lines = []
            elif line.startswith(STATUS) and lines is not None:
                if lines and lines[-1] == "":
                    lines.pop()  # the newline printed before the status line
                status = line[len(STATUS) :].strip()
                # not the number printed after each command (a command's own output imitating the
                # line): no status, that fact is read on its own
                results.append((int(status) if status.isascii() and status.isdigit() else -1, lines))
                lines = None
            elif lines is not None:
                lines.append(line)
        return results


def _together(specs: tuple, facts: dict) -> list[tuple]:
    """``specs`` with the facts not remembered yet whose class reads many of its kind together
    (``together``) replaced by one spec of that reading, in the place of the first of them, where
    two or more are left (one alone stays as it is)."""
    groups: dict = {}
    for cls, kwargs in specs:
        together = getattr(cls, "together", None)
        key = (cls, _freeze(kwargs))
        if together is not None and key not in facts and together.joinable(**kwargs):
            groups.setdefault(cls, {}).setdefault(key, kwargs)
    out, placed = [], set()
    for cls, kwargs in specs:
        group = groups.get(cls)
        if group is None or len(group) < 2 or (cls, _freeze(kwargs)) not in group:
            out.append((cls, kwargs))
        elif cls not in placed:
            placed.add(cls)
            out.append((cls.together, cls.together.gather(list(group.values()))))
    return out


def prefetch(*specs: tuple, first: str | None = None) -> tuple[int, list[str]] | None:
    """Read every ``(FactClass, kwargs)`` of ``specs`` not remembered yet, in one remote command.
    ``first``: a command that runs before them in that command, alone (FactBatch); its answer
    (exit status, lines) is returned (None when nothing was read)."""
    host, facts = _facts()
    specs = _together(specs, facts)
    todo = []
    # answered by another fact of the batch (its ``derived``), or read on its own if it was not
    covered = {
        (other, _freeze(other_kwargs))
        for cls, kwargs in specs
        if hasattr(cls, "derives")
        for other, other_kwargs in cls.derives(**kwargs)
    }
    for cls, kwargs in specs:
        key = (cls, _freeze(kwargs))
        if key in facts or key in covered or any(k == key for k, _ in todo):
            continue
        fact_obj = cls()
        if fact_obj.requires_command(**kwargs):
            continue  # pyinfra wraps those in its own guard: read on their own
        todo.append((key, (fact_obj, _command_text(fact_obj.command(**kwargs)), kwargs)))
    if len(todo) < (1 if first is not None else 2):
        return None
    commands = tuple(c for _, (_, c, _) in todo)
    if first is None:
        answers = host.get_fact(FactBatch, commands=commands)
        head = None
    else:
        answers = host.get_fact(FactBatch, commands=commands, first=first)
        head, answers = (answers[0], answers[1:]) if answers else (None, [])
    for (key, (fact_obj, _, kwargs)), (status, lines) in zip(todo, answers, strict=False):
        if status != 0:
            continue
        try:
            facts[key] = fact_obj.process(lines) if lines else fact_obj.default()
            _derive(facts, type(fact_obj), facts[key], kwargs)
        except (ValueError, LookupError, TypeError, AttributeError):  # an answer its parser refuses:
            continue  # read on its own later, where pyinfra reports it
    return head
