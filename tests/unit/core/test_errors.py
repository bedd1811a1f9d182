"""The one exception base (tritonfleet.core.errors) and the one place it becomes an exit status
(tritonfleet.core.exits): every error class of the package derives from it, none is a
SystemExit, and a command or deploy entry point ends with the message, never a traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from click.testing import CliRunner

import tritonfleet
from tests.support.forked import forked
from tritonfleet.core.errors import TritonfleetError, UsageError
from tritonfleet.core.exits import entry_point, exit_for

#: modules that are not imported as a library: pull mode's inventory, which pyinfra loads as an
#: inventory file in `tritonfleet converge` only (imported anywhere else it refuses, SystemExit)
NOT_A_LIBRARY = {"tritonfleet.fleet.pull.local_inventory"}


def package_exceptions() -> dict[str, tuple[str, bool, bool]]:
    """Every exception class defined in the package (its own modules, not what they import):
    name -> (its bases, whether it is a TritonfleetError, whether it is a SystemExit)."""
    found = {}
    for info in pkgutil.walk_packages(tritonfleet.__path__, "tritonfleet."):
        if ".skeleton" in info.name or info.name in NOT_A_LIBRARY:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = (str(obj.__mro__), issubclass(obj, TritonfleetError),
                                                issubclass(obj, SystemExit))
    return found


def test_every_error_of_the_package_has_the_one_base_and_none_is_a_system_exit():
    # every module imported in a forked child: some import pyinfra's command line, which patches
    # the whole process for gevent (later tests using ssl in this process then recursed)
    found = forked(package_exceptions)
    # the 16 classes the package reports to a person (two more derive from HostFailure); private
    # ones (a leading underscore) are internal signals, never shown
    public = {k: v for k, v in found.items() if not k.rsplit(".", 1)[1].startswith("_")}
    assert len(public) >= 18, sorted(public)
    outside = sorted(k for k, (_, based, _) in public.items() if not based)
    assert not outside, f"errors without the base tritonfleet.core.errors.TritonfleetError: {outside}"
    exits = sorted(k for k, (_, _, is_exit) in found.items() if is_exit)
    assert not exits, f"SystemExit subclasses (the exit status belongs to tritonfleet.core.exits): {exits}"


def test_the_old_bases_still_catch_them():
    """``except ValueError`` around a setting's check, ``except RuntimeError`` around a fleet
    read: code that caught the old bases still does."""
    from tritonfleet.inventory.roster import FleetError
    from tritonfleet.settings.access import ConfigError

    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, UsageError)
    assert issubclass(FleetError, RuntimeError) and FleetError.exit_status == 1


def test_exit_for_carries_the_message_and_status(capsys):
    e = exit_for(TritonfleetError("h1: the host failed"), "tritonfleet x: ")
    assert e.code == "tritonfleet x: h1: the host failed"  # Python prints it, status 1
    e = exit_for(UsageError("bad --limit"), "tritonfleet x: ")
    assert e.code == 2 and capsys.readouterr().err == "tritonfleet x: bad --limit\n"


def test_a_deploy_entry_point_ends_the_run_without_a_traceback():
    @entry_point
    def preflight():
        raise TritonfleetError("h1: gpu_class 'K80' is no GPU class")

    with pytest.raises(SystemExit) as e:
        preflight()
    assert e.value.code == "h1: gpu_class 'K80' is no GPU class"
    assert e.value.__cause__ is None and e.value.__suppress_context__

    @entry_point
    def bug():
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        bug()


def test_a_command_ends_with_its_name_the_message_and_the_status(tmp_path):
    from tritonfleet.cli import main

    res = CliRunner().invoke(main, ["status", str(tmp_path / "missing.py")])
    assert res.exit_code == 2, res.output  # bad input
    assert f"tritonfleet status: inventory {tmp_path / 'missing.py'} not found" in res.output
    assert "Traceback" not in res.output
