"""The deploy steps. Importing them tunes the running pyinfra deploy: TCP_NODELAY on its SSH
connections (tritonfleet.connection; pyinfra has connected to every host by then) and a faster
way to name operation calls (tritonfleet.oporder)."""

from .. import oporder
from ..connection import tune_state

tune_state()
oporder.install()
