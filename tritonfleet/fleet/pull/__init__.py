"""Pull mode: hosts that converge themselves from a release they fetch.

The control machine never connects to a host here. It writes an **origin**: a directory that any
HTTP(S) server serves to the hosts (nginx, a bucket's website, Python's http.server), laid out as

    releases/<sha256>.tar.gz   the operator's repository release: the deploy and the model
                               repository (no host's inventory data); named by its own sha256,
                               which the host checks
    blobs/<sha256>             image archives the inventory names (image_archives), by content
    desired/<host>.json        the release this host should run: {host, release, generation,
                               expires, host_data (this host's own inventory entry)}, signed with
                               the operator's key (ssh-keygen -Y sign), so a host follows only
                               what the key signed, for itself, never an older or expired one
    reports/<host>.json        what the host last did (release, generation, result, times), signed
                               with the host's own report key and PUT there by the host (the
                               server must accept PUT for reports/)
    host-signers               the hosts' report keys (allowed signers: principal = host name),
                               enrolled by `tritonfleet bootstrap`
    signers.json               optional: the release signers' keys, signed by a key the hosts
                               trust (`tritonfleet pull rotate-key`)
    dist/                      the pinned agent: tritonfleet's wheel and its dependencies
                               (tritonfleet.fleet.pull.bootstrap)

A pull-mode rollout (``rollout``) is the push rollout's plan (canary, batches, failure budget,
rollback, journal) with each batch published instead of deployed: the batch's pointers name the
new release, and the rollout waits for those hosts' reports; a failed host's pointer goes back to
the release it ran before. Reading a report is a stat and, when it changed, a small JSON file:
the control machine's cost per host is the publishing and that read, not an SSH session.

Signatures are OpenSSH's (``ssh-keygen -Y sign`` / ``-Y verify``, OpenSSH 8.1 and newer: the
ssh-keygen(1) manual page, "-Y sign" and "ALLOWED SIGNERS"): every host already has ssh-keygen
(openssh-client), the key is an ordinary SSH key, and an ssh-agent can hold it.

The control side: ``origin`` (the names both sides share, ``PullSite``), ``release`` (building and
publishing a release), ``signing`` (signed pointers, the signers' rotation, the hosts' report
keys), ``reports`` (reading the hosts' reports), ``rollout`` and ``status``; ``bootstrap`` (the
agent on the origin, each host's script and user-data, the timer). The host side: ``host_fetch``
(what a host takes from the origin and accepts, its state) and ``host_run`` (one converge run,
its report), with ``local_inventory`` (the inventory of that run).
"""
