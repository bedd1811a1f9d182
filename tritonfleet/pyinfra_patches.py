"""Operator API: what a deploy file calls to run tritonfleet's steps under pyinfra.

``install()`` is the first line of every deploy file (``from tritonfleet import pyinfra_patches``,
then ``pyinfra_patches.install()``, before the first step): the per-host deploy lock, SSH tuning,
Ctrl-C's exit status and the check of the pyinfra internals tritonfleet relies on.
``tritonfleet_step(name)`` is the decorator of a step of your own (pyinfra's ``@deploy(name)``
that refuses to run when ``install()`` was not called); ``required(name)`` is that refusal alone.
``lock_on_connect()`` is the one line of a repository's ``config.py``: the deploy lock taken while
pyinfra connects, for the runs that take it (tritonfleet.pyinfra_ext.connecting).

This module is part of the public surface ``tritonfleet init`` writes into operators'
repositories (docs/architecture.md, "Operator API"): its names stay. The code lives in
tritonfleet.pyinfra_ext.install.
"""

from tritonfleet.pyinfra_ext.connecting import lock_on_connect
from tritonfleet.pyinfra_ext.install import install, required, tritonfleet_step

__all__ = ["install", "lock_on_connect", "required", "tritonfleet_step"]
