"""The deploy steps. Importing them tunes the running pyinfra deploy: TCP_NODELAY and dead-link
keepalives on its SSH connections (tritonfleet.connection; pyinfra has connected to every host by
then), the deploy lock on every host (tritonfleet.hostlock: one run at a time per host), a faster
way to name operation calls (tritonfleet.oporder); Ctrl-C exits with status 130
(tritonfleet.interrupt; pyinfra's own handler exits 0)."""

from .. import hostlock, interrupt, oporder
from ..connection import tune_state

tune_state()
if hostlock.enabled():
    hostlock.acquire_all()
oporder.install()
interrupt.install()
