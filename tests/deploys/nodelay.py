# Test deploy: fails a host whose SSH connection has no TCP_NODELAY once tritonfleet's patches are
# installed (pyinfra connected to every host before it loaded this file).
import socket

from pyinfra import host
from pyinfra.operations import python

from tritonfleet import pyinfra_patches
from tritonfleet.pyinfra_ext.connection import transport_of

pyinfra_patches.install()  # tunes the connections


def check_nodelay():
    sock = transport_of(host).sock
    if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 1:
        raise RuntimeError(f"{host.name}: the SSH connection has no TCP_NODELAY")


python.call(name="check: TCP_NODELAY on the SSH connection", function=check_nodelay)
