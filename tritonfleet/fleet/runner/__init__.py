"""Running pyinfra for the fleet commands: one ``pyinfra`` process for a batch
(``pyinfra_run``), or a pool of worker processes over many hosts (``workers``)."""
