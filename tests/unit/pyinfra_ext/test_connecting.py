"""Which runs a repository's config.py starts the deploy lock for (tritonfleet.pyinfra_ext.connecting),
and the probes of the pyinfra internals it relies on. The lock itself through pyinfra's command
line: tests/integration/pyinfra_ext/test_connect_early.py."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pyinfra
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyinfra.api.connect import connect_all
from pyinfra.api.host import Host
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.sshuserclient.client import SSHClient as PyinfraSSHClient
from pyinfra_cli import cli as pyinfra_cli
from pyinfra_cli.exceptions import CliError

from tritonfleet.pyinfra_ext import connecting, probes

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("deploy", sorted((ROOT / "deploys").glob("*.py")), ids=lambda p: p.name)
def test_every_deploy_file_of_the_repository_is_found_to_take_the_lock(deploy):
    assert connecting.installs(deploy)


@pytest.mark.parametrize(
    "text",
    [
        "# pyinfra_patches.install()\nfrom pyinfra.operations import server\n",
        "x = 'pyinfra_patches.install()'\n",
        "install()\n",
        "pyinfra_patches.install(\n",  # not Python: pyinfra will say so
        "other.install()\n",
    ],
)
def test_a_file_that_does_not_call_install_is_not(tmp_path, text):
    f = tmp_path / "d.py"
    f.write_text(text)
    assert not connecting.installs(f)
    assert not connecting.installs(tmp_path / "missing.py")


def test_a_call_anywhere_in_the_file_is_found(tmp_path):
    f = tmp_path / "d.py"
    f.write_text("from tritonfleet import pyinfra_patches\nif True:\n    pyinfra_patches.install()\n")
    assert connecting.installs(f)


OPS = st.lists(
    st.sampled_from(["exec", "fact", "debug-inventory", "--", "true", "a.py", "b.py", "server.shell", "x.py"]),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_deploy_files_are_the_runs_pyinfra_itself_runs_as_deploy_files(tmp_path, monkeypatch, ops):
    """Differential: pyinfra's own reading of its operations (``_validate_operations``) against
    connecting.deploy_files, over generated command lines."""
    monkeypatch.chdir(tmp_path)
    for name in ("a.py", "b.py", "x.py"):
        (tmp_path / name).write_text("")
    try:
        command = pyinfra_cli._validate_operations(tuple(ops), None)[2]
    except (CliError, ValueError, AttributeError, IndexError, TypeError, KeyError, ImportError):
        command = None  # pyinfra refuses the line: no run at all
    ours = connecting.deploy_files(ops)
    assert bool(ours) == (command == pyinfra_cli.CliCommands.DEPLOY_FILES)
    assert ours == ([Path(op) for op in ops] if ours else [])


def test_nothing_is_started_outside_pyinfras_command_line(monkeypatch):
    monkeypatch.setattr(pyinfra, "is_cli", False)
    assert connecting.connect_early() is False


def test_the_probes_accept_the_installed_pyinfra_and_refuse_a_changed_one():
    assert probes.calls_before_connect(Host.connect) == ""
    assert probes.connects_limit(connect_all) == ""
    assert probes.inits_then_connects(pyinfra_cli._main) == ""
    assert probes.has_operations(pyinfra_cli.cli) == ""
    assert probes.takes_transport_factory(paramiko.SSHClient.connect) == ""
    assert probes.connects_with_own_kwargs(SSHConnector._connect) == ""
    assert probes.hands_kwargs_on(PyinfraSSHClient.connect) == ""
    assert "transport_factory" in probes.takes_transport_factory(lambda self, hostname, port=22: None)
    assert "make_paramiko_kwargs" in probes.connects_with_own_kwargs(lambda self: self.client.connect("h"))

    def connect(self):
        self.connector.connect()
        self.state.trigger_callbacks("host_before_connect", self)  # too late: after the connect

    assert "host_before_connect" in probes.calls_before_connect(connect)

    def connect_everything(state):
        for host in state.inventory:
            host.connect()

    assert "limit" in probes.connects_limit(connect_everything)

    def main(state):
        connect_all(state)
        state.init(None, None)

    assert "in that order" in probes.inits_then_connects(main)
    assert "operations" in probes.has_operations(object())


def test_the_handshake_runs_with_tcp_nodelay_set_first():
    """nodelay_transport sets TCP_NODELAY on the connected socket before paramiko's Transport
    (whose handshake starts later, on start_client) takes it; a socket that is no TCP socket is
    left as it is."""
    import socket

    import paramiko

    from tritonfleet.pyinfra_ext.connection import nodelay_transport

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        try:
            assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
            transport = nodelay_transport(client)
            assert isinstance(transport, paramiko.Transport) and not transport.is_active()
            assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            client.close()
            peer.close()
    a, b = socket.socketpair()
    with a, b:
        assert isinstance(nodelay_transport(a), paramiko.Transport)


def test_only_an_ssh_connectors_connect_gets_the_factory_and_an_inventorys_own_is_kept():
    from types import SimpleNamespace

    from pyinfra.connectors.ssh import SSHConnector

    from tritonfleet.pyinfra_ext import connection

    def connector(extra):
        c = object.__new__(SSHConnector)
        c.make_paramiko_kwargs = lambda: {"hostname": "h", "_pyinfra_ssh_paramiko_connect_kwargs": extra}
        return c

    host = SimpleNamespace(connector=connector(None))
    assert connection.nodelay_from_handshake(host)
    assert host.connector.make_paramiko_kwargs()["transport_factory"] is connection.nodelay_transport
    assert not connection.nodelay_from_handshake(host)  # once a connector
    own = SimpleNamespace(connector=connector({"transport_factory": object}))
    assert connection.nodelay_from_handshake(own)
    assert "transport_factory" not in own.connector.make_paramiko_kwargs()  # the inventory's wins
    assert not connection.nodelay_from_handshake(SimpleNamespace(connector=SimpleNamespace()))  # @local, @docker
