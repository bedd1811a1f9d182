"""Nothing: pyinfra's own floor for bench/run.py noop (as config and as deploy file: pyinfra starts,
reads the inventory, connects, runs no operation and exits)."""
