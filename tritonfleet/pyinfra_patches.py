"""Operator API: what a deploy file calls to run tritonfleet's steps under pyinfra.

``install()`` is the first line of every deploy file (``from tritonfleet import pyinfra_patches``,
then ``pyinfra_patches.install()``, before the first step): the per-host deploy lock, SSH tuning,
Ctrl-C's exit status and the check of the pyinfra internals tritonfleet relies on.
``tritonfleet_step(name)`` is the decorator of a step of your own (pyinfra's ``@deploy(name)``
that refuses to run when ``install()`` was not called); ``required(name)`` is that refusal alone.
``connect_early()`` is the one line of a repository's ``config.py``: as pyinfra connects, its
connections tuned and, for the runs that take it, the deploy lock taken
(tritonfleet.pyinfra_ext.connecting).

This module is part of the public surface ``tritonfleet init`` writes into operators'
repositories (docs/architecture.md, "Operator API"): its names stay. The code lives in
tritonfleet.pyinfra_ext.install.
"""

from tritonfleet.pyinfra_ext.connecting import connect_early
from tritonfleet.pyinfra_ext.install import install, required, tritonfleet_step

__all__ = ["connect_early", "install", "required", "tritonfleet_step"]
