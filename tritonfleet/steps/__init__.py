"""The public deploy steps (``tritonfleet_step``, pyinfra's ``@deploy`` that first checks the
deploy file installed the patches): ``host_prep`` (NVIDIA driver, Docker Engine, Container
Toolkit), ``verify`` (GPU verification), ``triton`` (image, model repository, service, health
gate), ``rollback``, ``guard`` (GPU-loss guard), ``telemetry`` (GPU health on the host), ``stage``
(image and release before a rollout), ``mirror`` (the image mirror and the hosts' trust in it).
Importing them changes nothing in pyinfra: each deploy file calls
``tritonfleet.pyinfra_patches.install()`` once, before the first step."""
