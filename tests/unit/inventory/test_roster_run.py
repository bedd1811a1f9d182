"""roster.run over a connection that died with the host's reboot (a driver change reboots it
between the rollout's probe and its next command): reopened once, the command run; a fresh
connection that fails is an error at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from paramiko import SSHException

from tritonfleet.inventory import roster


class Host:
    def __init__(self, connected: bool, failures: int):
        self.connected, self.failures, self.connects, self.runs = connected, failures, 0, 0

    def connect(self, **kw):
        self.connected, self.connects = True, self.connects + 1

    def disconnect(self):
        self.connected = False

    def run_shell_command(self, command, **kw):
        self.runs += 1
        if self.failures:
            self.failures -= 1
            raise SSHException("SSH session not active")
        return True, SimpleNamespace(stdout_lines=["ok"], stderr_lines=[])


def fleet_host(h: Host):
    return SimpleNamespace(name="h", pyinfra_host=h, get=lambda k, d=None: d)


def test_a_connection_from_before_a_reboot_is_reopened_once():
    h = Host(connected=True, failures=1)
    assert roster.run(fleet_host(h), "true") == (True, "ok")
    assert h.connects == 1 and h.runs == 2


def test_a_host_that_still_fails_is_an_error():
    h = Host(connected=True, failures=2)
    with pytest.raises(SSHException):
        roster.run(fleet_host(h), "true")
    assert h.connects == 1


def test_a_new_connection_that_fails_is_not_retried():
    h = Host(connected=False, failures=1)
    with pytest.raises(SSHException):
        roster.run(fleet_host(h), "true")
    assert h.connects == 1 and h.runs == 1
