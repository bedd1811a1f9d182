"""The one base of every error tritonfleet reports to a person, and the exit status it ends with.

A command's entry point catches ``TritonfleetError`` in one place (``tritonfleet.cli.main`` and the
deploy-time entry points) and prints ``str(error)`` without a traceback; anything else is a bug and
keeps its traceback. ``exit_status``: 2 for bad input the person can correct (usage, inventory,
settings, arguments), 1 for a run that failed on a host.
"""

from __future__ import annotations


class TritonfleetError(Exception):
    """An error for a person to read: the message names the host, file or setting, and the fix."""

    exit_status = 1


class UsageError(TritonfleetError):
    """Bad input the person can correct (arguments, inventory, settings, files): exit status 2."""

    exit_status = 2
