"""pyinfra's local connector under a host's own inventory name, for a host that runs its deploy on
itself (tritonfleet converge): ``@tritonfleet-self/<name>`` in an inventory is the host ``<name>``,
reached as ``@local`` is, so the deploy's messages, failure reports and deploy lock name the host,
not ``@local``. Registered with pyinfra through the ``pyinfra.connectors`` entry point group
(pyproject.toml); imports nothing but pyinfra (pyinfra loads every registered connector)."""

from __future__ import annotations

from pyinfra.api.exceptions import InventoryError
from pyinfra.connectors.local import LocalConnector

NAME = "tritonfleet-self"


class SelfConnector(LocalConnector):
    @staticmethod
    def make_names_data(name=None):
        if not name:
            raise InventoryError(f"@{NAME} needs the host's name: @{NAME}/<name>")
        yield name, {}, ["@local"]
