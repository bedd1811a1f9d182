"""The inventory model, a floor below observability and the fleet commands: the hosts, groups
and data of a pyinfra inventory as the fleet commands read them (``roster``)."""
