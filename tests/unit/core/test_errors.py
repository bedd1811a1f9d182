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
from tritonfleet.core.errors import TritonfleetError, UsageError
from tritonfleet.core.exits import entry_point, exit_for


def package_exceptions() -> dict[str, type]:
    """Every exception class defined in the package (its own modules, not what they import)."""
    found = {}
    for info in pkgutil.walk_packages(tritonfleet.__path__, "tritonfleet."):
        if ".skeleton" in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_error_of_the_package_has_the_one_base_and_none_is_a_system_exit():
    found = package_exceptions()
    # the 16 classes the package reports to a person (two more derive from HostFailure); private
    # ones (a leading underscore) are internal signals, never shown
    public = {k: v for k, v in found.items() if not k.rsplit(".", 1)[1].startswith("_")}
    assert len(public) >= 18, sorted(public)
    outside = sorted(k for k, v in public.items() if not issubclass(v, TritonfleetError))
    assert not outside, f"errors without the base tritonfleet.core.errors.TritonfleetError: {outside}"
    exits = sorted(k for k, v in found.items() if issubclass(v, SystemExit))
    assert not exits, f"SystemExit subclasses (the exit status belongs to tritonfleet.core.exits): {exits}"


def test_the_old_bases_still_catch_them():
    """``except ValueError`` around a setting's check, ``except RuntimeError`` around a fleet
    read: code that caught the old bases still does."""
    from tritonfleet.fleet.inventory import FleetError
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
