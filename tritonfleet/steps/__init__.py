"""The deploy steps. Importing them tunes the SSH connections of the running pyinfra deploy
(TCP_NODELAY: see tritonfleet.connection); pyinfra has connected to every host by then."""

from ..connection import tune_state

tune_state()
