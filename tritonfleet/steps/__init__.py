"""The deploy steps (pyinfra ``@deploy`` functions): host preparation, GPU verification, Triton,
rollback. Importing them changes nothing in pyinfra: each deploy file calls
``tritonfleet.pyinfra_ext.install.install()`` once, before the first step."""
