"""The deploy steps. Importing them tunes the running pyinfra deploy: TCP_NODELAY on its SSH
connections (tritonfleet.connection; pyinfra has connected to every host by then) and a faster
way to name operation calls (tritonfleet.oporder); Ctrl-C exits with status 130
(tritonfleet.interrupt; pyinfra's own handler exits 0)."""

from .. import interrupt, oporder
from ..connection import tune_state

tune_state()
oporder.install()
interrupt.install()
