"""One report for every failure after pre-flight: host, step, what was expected, what was found,
Triton's or the system's own words, what the host runs now, and the command that fixes it.

A step that fails a host for a reason it understands raises ``HostFailure`` with a ``Failure``;
``reported`` (the wrapper every ``check:`` operation runs its function through) prints the report
and fails the host the way pyinfra fails a host whose command failed: no Python repr, no
traceback. Anything else a step raises is a bug in tritonfleet: its traceback is printed with a
line saying so.

The same report reaches ``tritonfleet rollout`` through a structured channel (a JSON file per
host in the directory ``$TRITONFLEET_FAILURE_DIR`` names) and ``tritonfleet status`` through the
host itself (``/var/lib/tritonfleet/last-failure.json``, read by the probe). A host that pyinfra
fails in an operation whose step has no report of its own (a command that exited non-zero, a
connection lost mid-run) reaches the rollout the same way (``report_operation_errors``): the
operation and the end of its own output.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyinfra
from pyinfra import logger
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ContextObject, ctx_config, ctx_host, ctx_state

from .. import ROLLBACK_DEPLOY
from .connection_errors import CONNECTION_ERRORS
from .errors import TritonfleetError, UsageError
from .shell import q

CHANNEL_ENV = "TRITONFLEET_FAILURE_DIR"
# on the host: the last failure, shown by `tritonfleet status` until a newer healthy deployment
HOST_RECORD = "/var/lib/tritonfleet/last-failure.json"
WORDS_KEEP = 14
LINE_WIDTH = 220


@dataclass
class Failure:
    host: str
    step: str
    expected: str
    found: str
    words: list[str] = field(default_factory=list)
    source: str = ""  # whose words they are ("Triton, in the journal of triton.service")
    now: str = ""  # what the host runs now
    fix: str = ""  # the command that fixes or rolls back
    cause: str = ""  # one line for table cells (default: found)
    time: str = ""
    command: str = ""  # the command that failed, where one did (an apt-get install)
    meaning: str = ""  # what the failure means, where the words alone do not say

    def text(self) -> str:
        out = [
            f"tritonfleet: {self.host} failed at {self.step}",
            f"  expected: {self.expected}",
            f"  found:    {self.found}",
        ]
        if self.command:
            out.append(f"  command:  {self.command}")
        if self.words:
            out.append(f"  {self.source or 'its own words'}:")
            out += [f"    {w}" for w in self.words]
        if self.meaning:
            out.append(f"  meaning:  {self.meaning}")
        if self.now:
            out.append(f"  the host now: {self.now}")
        if self.fix:
            out.append(f"  to fix:   {self.fix}")
        return "\n".join(out)

    def short(self, width: int = 100) -> str:
        """The cause in one line (a table cell), without the host name."""
        line = " ".join(f"{self.step}: {self.cause or self.found}".split())
        return line if len(line) <= width else line[: width - 3] + "..."

    def to_json(self) -> dict:
        d = asdict(self)
        d["text"] = self.text()
        d["short"] = self.short()
        return d

    @classmethod
    def from_json(cls, d: dict) -> Failure:
        return cls(**{k: d.get(k, "" if k != "words" else []) for k in cls.__dataclass_fields__})


class HostFailure(TritonfleetError, RuntimeError):
    """An expected failure of one host, with its report (``str()`` is the report's text)."""

    def __init__(self, failure: Failure):
        super().__init__(failure.text())
        self.failure = failure


def without_host(message: str, host_name: str) -> str:
    prefix = f"{host_name}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


def fail(
    expected: str,
    found: str,
    *,
    fix: str = "",
    words=(),
    source: str = "",
    now: str = "",
    cause: str = "",
    step: str = "",
):
    """Fail the current host (a pyinfra check) with a report; ``step`` defaults to the running
    operation's name."""
    host, state = pyinfra.host, pyinfra.state
    raise HostFailure(
        Failure(
            host.name,
            step or step_name(state, host),
            expected,
            without_host(found, host.name),
            trim(words),
            source,
            now,
            fix,
            cause,
        )
    )


def trim(lines, keep: int = WORDS_KEEP, width: int = LINE_WIDTH) -> list[str]:
    """Lines as they were written (real lines, no escapes), without surrounding blank lines, each
    cut to ``width``, at most ``keep`` of them (the first ones: an error's first lines say most)."""
    out = [ln.rstrip() for ln in (lines or [])]
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    out = [ln if len(ln) <= width else ln[: width - 3] + "..." for ln in out]
    if len(out) > keep:
        out = out[:keep] + [f"... ({len(out) - keep} more lines)"]
    return out


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def inventory_arg(argv: list[str] | None = None) -> str:
    """The inventory this pyinfra run was given (its first positional file argument)."""
    argv = sys.argv if argv is None else argv
    files = [a for a in argv[1:] if a.endswith(".py") and not a.startswith("-") and "=" not in a]
    return files[0] if len(files) >= 2 else "INVENTORY"


def rollback_command(host_name: str, argv: list[str] | None = None) -> str:
    """The command that rolls ``host_name`` back: the repository's own deploys/rollback.py where
    pyinfra runs (what `tritonfleet init` writes), else the package's."""
    deploy = Path("deploys/rollback.py")
    if not deploy.is_file():
        deploy = ROLLBACK_DEPLOY
        with contextlib.suppress(ValueError):
            deploy = deploy.relative_to(Path.cwd())
    return f"pyinfra -y {inventory_arg(argv)} {deploy} --limit {host_name}"


def in_rollout() -> bool:
    return bool(os.environ.get(CHANNEL_ENV))


def emit(host, failure: Failure) -> None:
    """Print the report for ``host`` (a pyinfra host), hand it to a rollout waiting for it, and
    leave it on the host for `tritonfleet status`."""
    failure.time = failure.time or now_utc()
    # pyinfra indents the first line of what is logged while operations run: the others alike
    logger.error(failure.text().replace("\n", "\n    "))
    write_channel(failure)
    record_on_host(host, failure)


def write_channel(failure: Failure) -> None:
    directory = os.environ.get(CHANNEL_ENV)
    if not directory:
        return
    path = Path(directory) / f"{failure.host}.json"
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(failure.to_json(), indent=1))
        tmp.replace(path)


def read_channel(directory: str | os.PathLike) -> dict[str, Failure]:
    out = {}
    for p in sorted(Path(directory).glob("*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            f = Failure.from_json(json.loads(p.read_text()))
            out[f.host] = f
    return out


def record_command(failure: Failure) -> str:
    d = q(HOST_RECORD.rsplit("/", 1)[0])
    body = q(json.dumps({k: v for k, v in failure.to_json().items() if k != "text"}))
    return f"mkdir -p {d} && printf '%s\\n' {body} > {HOST_RECORD}.tmp && mv {HOST_RECORD}.tmp {HOST_RECORD}"


def record_on_host(host, failure: Failure) -> None:
    """Best effort: a host that cannot be reached keeps no record (the report is printed anyway)."""
    with contextlib.suppress(*CONNECTION_ERRORS):
        if getattr(host, "connected", False):
            host.run_shell_command(record_command(failure), print_output=False, print_input=False)


def bug_text(exc: BaseException, host_name: str, step: str) -> str:
    """What a bug says next to its traceback (pyinfra prints that for an operation's callback)."""
    said = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return (
        f"tritonfleet: {host_name} failed at {step} on an unexpected error ({said}): this is a bug in "
        "tritonfleet, not a fault of the host (the traceback says where); please report it with "
        "that traceback"
    )


def step_name(state, host) -> str:
    """The running operation's name, as pyinfra prints it ("Health gate | check: ...")."""
    with contextlib.suppress(KeyError, AttributeError):  # no operation of the state runs
        op_hash = host.nested_executing_op_hash or host.executing_op_hash
        names = state.get_op_meta(op_hash).names
        if names:
            return ", ".join(sorted(names))
    return "a check"


def reported(state, host, function, args, kwargs) -> bool:
    """Run ``function(*args, **kwargs)`` for ``host`` as a pyinfra FunctionCommand: True when it
    returns; on HostFailure (or a configuration error) the report is printed and False fails the
    host without a traceback; anything else prints the traceback and says it is a bug."""
    while isinstance(host, ContextObject):  # a nested operation is handed pyinfra's host proxy
        host = host._get_module()
    step = step_name(state, host)
    with ctx_config.use(state.config.copy()), ctx_host.use(host):
        try:
            function(*args, **kwargs)
            return True
        except HostFailure as e:
            emit(host, e.failure)
        except UsageError as e:  # a setting (ConfigError, PerGpuError, ...): the host's, named
            msg = str(e)
            prefix = f"{host.name}: "
            emit(
                host,
                Failure(
                    host.name,
                    step,
                    "valid settings for this host",
                    msg[len(prefix) :] if msg.startswith(prefix) else msg,
                    fix="correct the setting named above (group data or --data), then run the deploy again",
                ),
            )
        except Exception as e:
            # a bug: said as one and handed to a rollout; pyinfra prints its traceback and fails the
            # host ("Unexpected error in Python callback", pyinfra.api.operations)
            logger.error(bug_text(e, host.name, step))
            write_channel(Failure(host.name, step, "the step to run", f"a bug in tritonfleet: {type(e).__name__}: {e}"))
            raise
    return False


# --------------------------------------------------------------------------- operations without a report

_unreported: list[tuple] = []
_HANDLER = "_tritonfleet_operation_errors"


def report_operation_errors(state=None) -> bool:
    """In a run a rollout waits for (CHANNEL_ENV): every host that pyinfra fails in an operation
    whose step left no report (a command that exited non-zero, a connection lost mid-run) gets one
    in the channel too, naming the operation and quoting the end of its output. They are written
    when the run ends (pyinfra completes an operation's output only after its callbacks ran).
    True when registered."""
    if not in_rollout():
        return False
    if state is None:
        if not ctx_state.isset():
            return False
        state = ctx_state.get()
    if getattr(state, _HANDLER, False):
        return True

    class OperationErrors(BaseStateCallback):
        @staticmethod
        def operation_host_error(state, host, op_hash, *args, **kwargs):
            _unreported.append((state, host, op_hash))

    state.add_callback_handler(OperationErrors())
    setattr(state, _HANDLER, True)
    atexit.register(write_unreported)
    return True


def operation_failure(state, host, op_hash) -> Failure:
    """The report of ``host`` failing in the operation ``op_hash``, from what pyinfra kept of it."""
    names, lines = [], []
    with contextlib.suppress(KeyError):  # an operation the state does not know
        names = sorted(state.get_op_meta(op_hash).names)
    with contextlib.suppress(KeyError, RuntimeError):  # not complete (RuntimeError): no output kept
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
        lines = [ln for ln in meta.stderr_lines or meta.stdout_lines if ln.strip()]
    said = lines[-1].strip() if lines else "it failed without output"
    return Failure(
        host.name,
        ", ".join(names) or "an operation",
        "the operation to succeed",
        said,
        trim(lines[-WORDS_KEEP:]),
        "the operation's own output",
        fix="fix what the output above says (on the host, or in the settings), then run again",
        cause=said,
    )


def write_unreported() -> None:
    """Hand the rollout a report for each failed host that has none in the channel yet."""
    directory = os.environ.get(CHANNEL_ENV)
    if not directory:
        return
    for state, host, op_hash in _unreported:
        if not (Path(directory) / f"{host.name}.json").exists():
            write_channel(operation_failure(state, host, op_hash))
    _unreported.clear()
